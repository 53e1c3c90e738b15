"""What a failed 2-worker job prints: one line a rank, the launcher's verdict, the full output in
`<run.dir>/logs/rank-<N>.log` (real jobs, real SIGKILL, a real user error on every rank)."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import time

import pytest
from harness import BIN, PYTHON, QUICKSTART, ROOT, finish, workers

pytestmark = [pytest.mark.multiworker, pytest.mark.processes]

QUICK = ["--config", str(QUICKSTART), "--set", "train.verbose=1",
         "--set", "logging.tensorboard=false"]  # fmt: skip
ONE_SHORT_EPOCH = ["--set", "train.epochs=1", "--set", "train.steps_per_epoch=4"]
EPOCH_LINE = re.compile(r"(?i)\bepoch \d+/\d+")


def launch(run_dir: pathlib.Path, *args: str, env: dict[str, str] | None = None):
    """`hvd-train launch` of 2 Gloo workers, stdout and stderr in one pipe, in their order."""
    cmd = [PYTHON, "-m", "hvd_train", "launch", "--np", "2", "--gloo", *QUICK,
           "--set", f"run.dir={run_dir}", *args]  # fmt: skip
    return _start(cmd, run_dir.parent, env)


def _start(cmd: list[str], cwd: pathlib.Path, env: dict[str, str] | None) -> subprocess.Popen:
    full = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}  # fmt: skip
    return subprocess.Popen(
        cmd, cwd=cwd, env=full, text=True, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def console(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, list[str]]:
    result = finish(proc, timeout)
    return result.returncode, result.stdout.splitlines()


def test_a_killed_rank_ends_in_a_few_lines_naming_it_and_its_log(tmp_path) -> None:
    d = tmp_path / "run"
    proc = launch(d, "--set", "train.epochs=30")
    deadline = time.monotonic() + 240
    while not (d / "metrics.csv").exists() or len((d / "metrics.csv").read_text().splitlines()) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "no first epoch"
        time.sleep(0.1)
    os.kill(workers(str(d))[1], signal.SIGKILL)
    code, lines = console(proc, 120)
    assert code != 0
    last_epoch = max(i for i, line in enumerate(lines) if EPOCH_LINE.search(line))
    after = lines[last_epoch + 1 :]
    text = "\n".join(lines)
    assert len(after) <= 5, text
    verdict = [line for line in after if "attempt 1 failed:" in line]
    assert len(verdict) == 1, text
    assert (
        "rank 1 on localhost failed first (exit code 137, killed by SIGKILL); "
        f"full log: {d}/logs/rank-1.log; " in verdict[0]
    ), verdict
    assert "to continue from the last checkpoint, run the same command (" in verdict[0], verdict
    assert "Traceback" not in text and "<stderr>:" not in text and "<stdout>:" not in text, text
    for rank in (0, 1):
        log = (d / "logs" / f"rank-{rank}.log").read_text()
        assert log.startswith("--- ") and f"rank {rank} on " in log.splitlines()[0], log[:300]
    # Rank 0 saw Horovod shut down under it (one line on the console, its traceback in its
    # log), or first heard horovodrun's SIGTERM and its note of the failure (one line).
    rank0 = [line for line in after if line.startswith("[rank 0] failed:")]
    assert len(rank0) <= 1 and all("another worker ended first" in ln for ln in rank0), after
    noted = "another worker ended first: rank 1 (exit code 137, killed by SIGKILL)"
    if rank0 and noted not in rank0[0]:
        log0 = (d / "logs" / "rank-0.log").read_text()
        assert "Traceback (most recent call last)" in log0 and "[rank 0] failed:" in log0


def test_a_user_error_on_every_rank_is_one_line_each_and_exit_2(tmp_path) -> None:
    """A named checkpoint that is not one: every rank raises it once run.dir is claimed."""
    d = tmp_path / "run"
    code, lines = console(launch(d, *ONE_SHORT_EPOCH, "--set", f"train.resume={tmp_path}/nope"))
    assert code == 2, "\n".join(lines)
    text = "\n".join(lines)
    assert "Traceback" not in text, text
    expected = f"train.resume: {tmp_path}/nope is not a checkpoint folder"
    said = [line for line in lines if line.startswith("[rank ")]
    assert len(said) == 2, text  # one line each, and no other rank's line
    for rank in (0, 1):
        mine = [line for line in said if line.startswith(f"[rank {rank}] failed:")]
        assert len(mine) == 1 and expected in mine[0], text
        assert f"full log: {d}/logs/rank-{rank}.log" in mine[0], text
        log = (d / "logs" / f"rank-{rank}.log").read_text()
        assert f"[rank {rank}] failed: {expected}" in log and "Traceback" not in log, log
    assert any("not restarting: a bad config, bad input" in line for line in lines), text


def test_other_ranks_start_up_lines_go_to_their_log_under_plain_horovodrun(tmp_path) -> None:
    """TensorFlow's INFO lines at start-up (TF_CPP_MIN_LOG_LEVEL=0): rank 1's are in its log,
    not on the console; rank 0's stdout still is."""
    d = tmp_path / "run"
    cmd = [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
           PYTHON, "-m", "hvd_train", *QUICK, *ONE_SHORT_EPOCH, "--set", f"run.dir={d}"]  # fmt: skip
    code, lines = console(_start(cmd, tmp_path, {"TF_CPP_MIN_LOG_LEVEL": "0"}))
    text = "\n".join(lines)
    assert code == 0, text
    assert not [line for line in lines if line.startswith("[1]<")], text
    assert any(line.startswith("[0]<stdout>:[hvd_train] done in") for line in lines), text
    log1 = (d / "logs" / "rank-1.log").read_text()
    assert "cpu_feature_guard" in log1, log1[:2000]
