"""Every command's console, as a user runs it: under plain horovodrun (Gloo and MPI) bad input
ends in exit code 2, one error (a line a rank) and no TensorFlow start-up line; alone, no
command prints one. Real processes, on the quickstart trained alone for 4 steps."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest
from harness import BIN, PYTHON, QUICKSTART, check, run, start_up_lines, variant
from PIL import Image

from hvd_train.base import logs

pytestmark = pytest.mark.multiworker

HVD = [PYTHON, "-m", "hvd_train"]
# TensorFlow prints every start-up line at this level (cpu_feature_guard's two as well); the
# launched commands must keep them off the console all the same.
ALL_TF_LINES = {"TF_CPP_MIN_LOG_LEVEL": "0"}
USERS_DEFAULT = {"TF_CPP_MIN_LOG_LEVEL": "1"}  # what the CLI sets when the user set nothing
# A worker's line as horovodrun prints it: `[1]<stderr>:` (Gloo), `[1,1]<stderr>:` (MPI).
WORKER_LINE = re.compile(r"^\[(?:\d+,)?(\d+)\]<(stdout|stderr)>:(.*)$")


def write_images(root: pathlib.Path, names: list[str]) -> pathlib.Path:
    rng = np.random.default_rng(0)
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(root / name)
    return root


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """The quickstart trained alone for 4 steps: its run.dir, its console, and a folder of
    images with one that is not an image."""
    root = tmp_path_factory.mktemp("console")
    proc = check(run([*HVD, "--config", str(QUICKSTART), "--set", f"run.dir={root / 'run'}",
                      "--set", "train.epochs=1", "--set", "train.steps_per_epoch=4",
                      "--set", "logging.tensorboard=false"], root, env=USERS_DEFAULT))  # fmt: skip
    corrupt = write_images(root / "corrupt", ["0/a.png", "1/c.png"])
    (corrupt / "1" / "broken.jpg").write_bytes(b"\xff\xd8 not a JPEG")
    return {"root": root, "run": root / "run", "corrupt": corrupt, "proc": proc}


@pytest.mark.processes
def test_training_alone_sends_tensorflows_start_up_lines_to_its_log(trained) -> None:
    proc = trained["proc"]
    assert start_up_lines(proc.stdout + proc.stderr) == [], proc.stderr[-3000:]
    log = (trained["run"] / "logs" / "rank-0.log").read_text()
    assert "oneDNN custom operations are on" in log, log[:3000]


def horovodrun(controller: str, command: list[str]) -> list[str]:
    return [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", f"--{controller}",
            *HVD, *command]  # fmt: skip


# command -> (its arguments with bad input, what its one error says, whether its log is kept:
# in the run.dir of a trained run, under a header naming the command)
BAD_INPUT = {
    "train": (["--config", str(QUICKSTART), "--set", "run.dir={root}/never",
               "--set", "train.batch_size=5000"], "fewer than one global batch", False),
    "predict": (["predict", "--config", "{run}/config.yaml", "--images", "{corrupt}",
                 "--out", "{root}/p.csv"], "1 unreadable images: 1/broken.jpg", True),
    "evaluate": (["evaluate", "--config", "{run}/config.yaml", "--model", "{root}/nope.keras"],
                 "nope.keras does not exist", True),
    "data-bench": (["data-bench", "--config", str(QUICKSTART), "--batches", "2",
                    "--set", "train.batch_size=5000"], "fewer than one global batch", False),
}  # fmt: skip


def error_of(text: str) -> str | None:
    """The error a worker's one line says (`hvd_train: error: X` or `[rank N] failed: X; full
    log: ...`), or None for any other line."""
    text = re.sub(r"\[\d+,\d+\]<std(?:out|err)>:$", "", text)  # a tag mpirun left at the end
    m = re.match(r"hvd_train: error: (.*)$|\[rank \d+\] failed: (.*?)(?:; full log: .*)?$", text)
    return (m.group(1) or m.group(2)) if m else None


@pytest.mark.processes
@pytest.mark.parametrize(
    ("command", "controller"),
    # Each command, and each controller; the other three pairs are CI's (harness.variant).
    [("train", "gloo"), variant("train", "mpi"), variant("predict", "gloo"), ("predict", "mpi"),
     variant("evaluate", "gloo"), ("evaluate", "mpi"), ("data-bench", "gloo")],
)  # fmt: skip
def test_bad_input_under_plain_horovodrun_exits_2_with_one_error_and_no_start_up_line(
    trained, command, controller
) -> None:
    """Every line a worker printed is its one error line, the same error on both ranks; no
    TensorFlow start-up line even at TF_CPP_MIN_LOG_LEVEL=0 (they are in the rank's log where
    the command has one); horovodrun exits 2, under Gloo after its one line naming the worker."""
    args, says, logged = BAD_INPUT[command]
    args = [a.format(root=trained["root"], run=trained["run"], corrupt=trained["corrupt"])
            for a in args]  # fmt: skip
    proc = run(horovodrun(controller, args), trained["root"], env=ALL_TF_LINES)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out and start_up_lines(out) == [], out[-3000:]
    said = [WORKER_LINE.match(line) for line in out.splitlines() if WORKER_LINE.match(line)]
    # A rank that horovodrun stopped after another exited first may end in its shell's report
    # of the SIGTERM ("Terminated", sh's, not the worker's): not a line the worker printed.
    said = [m for m in said if m.group(3) != "Terminated"]
    errors = {error_of(m.group(3)) for m in said}
    assert len(errors) == 1 and says in errors.pop(), out[-3000:]  # None: another line
    if controller == "gloo":
        assert re.match(r"horovodrun: process \d exited first, with code 2, and ended the job",
                        proc.stderr.splitlines()[-1]), proc.stderr[-600:]  # fmt: skip
    if logged:
        lines = (trained["run"] / "logs" / "rank-1.log").read_text().splitlines()
        last = max(i for i, line in enumerate(lines) if line.startswith("--- "))
        header, *rest = lines[last:]  # this job's part of the log
        assert header.endswith(f", hvd-train {command}"), header
        assert start_up_lines("\n".join(rest)) and says in "\n".join(rest), rest


# Commands that never import TensorFlow, run alone (those that do are checked where their own
# tests run them: doctor in test_doctor.py, lr-plot in test_schedules.py, evaluate, predict and
# convert-tfrecord in test_evaluate.py, training in this file's job above).
ALONE = {
    "config": ["config", "--config", str(QUICKSTART)],
    "plan": ["plan", "--throughput", "1000", "--params", "1e6", "--batch", "32"],
    "compare": ["compare", "{run}", "--out", "{root}/compare.png"],
}


@pytest.mark.processes
@pytest.mark.parametrize("command", ALONE)
def test_a_command_run_alone_prints_no_tensorflow_start_up_line(trained, command) -> None:
    args = [a.format(root=trained["root"], run=trained["run"]) for a in ALONE[command]]
    proc = check(run([*HVD, *args], trained["root"], env=USERS_DEFAULT))
    assert start_up_lines(proc.stdout + proc.stderr) == [], proc.stderr[-3000:]


def test_start_up_lines_are_told_from_tensorflows_warnings_and_pythons() -> None:
    """What a lone process's TensorFlow import printed: the banner, INFO records and their
    continuation lines are start-up lines; a W record and a Python warning are passed on."""
    printed = (
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
        "I0000 00:00:1795618212.535957    9138 port.cc:153] oneDNN custom operations are on.\n"
        "I0000 00:00:1795618212.568678    9138 cpu_feature_guard.cc:227] This TensorFlow ...\n"
        "To enable the following instructions: AVX2 FMA, in other operations, rebuild ...\n"
        "W0000 00:00:1795618212.9    9138 cuda_dnn.cc:8] Unable to register cuDNN factory\n"
        "/site-packages/x.py:12: DeprecationWarning: old\n"
        "  import y\n"
        "I0526 10:00:01.123456    9138 port.cc:153] oneDNN custom operations are on.\n"
    )
    start_up, rest = logs.split_start_up(printed)
    lines = printed.splitlines(keepends=True)
    assert start_up == "".join(lines[:4] + lines[7:])
    assert rest == "".join(lines[4:7])
