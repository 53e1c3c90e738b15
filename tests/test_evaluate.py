"""`hvd-train evaluate` and `hvd-train predict` on a model trained once, as real processes:
`python -m hvd_train` for one worker, horovodrun (Gloo) for 2 and 3.

Both commands are in this one file so that the model is trained once for all of them.
"""

from __future__ import annotations

import csv
import json
import pathlib
import re

import numpy as np
import pytest
from harness import PYTHON, QUICKSTART, check, horovodrun, run, start_up_lines
from PIL import Image

from hvd_train.record import rundir

pytestmark = [pytest.mark.multiworker, pytest.mark.processes]

DIGITS_VAL = 359  # the quickstart's validation split: divides by neither 2 nor 3
HVD = [PYTHON, "-m", "hvd_train"]
# 7 images, nested two deep, some outside any class folder: 7 divides by neither 2 nor 3.
PREDICT_FILES = ("6.png", "a/1.png", "a/2.jpg", "a/sub/3.png", "b/4.jpeg", "b/5.png", "c/7.JPG")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> pathlib.Path:
    """The quickstart trained for one epoch, alone; returns its run.dir."""
    root = tmp_path_factory.mktemp("evaluate")
    check(run([*HVD, "--config", str(QUICKSTART), "--set", "train.epochs=1",
               "--set", f"run.dir={root / 'run'}"], cwd=root))  # fmt: skip
    return root / "run"


def assert_clean_console(proc) -> None:
    """Rank 0's lines only (horovodrun marks a worker's `[N]<stdout>:`), and no TensorFlow
    start-up line: under horovodrun they are in run.dir's logs, alone they are dropped."""
    out = proc.stdout + proc.stderr
    assert start_up_lines(out) == [], out[-3000:]
    assert not re.search(r"(?m)^\[[1-9]\d*\]<", out), out[-3000:]


def error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr[-3000:]
    return [line for line in stderr.splitlines() if line.startswith("hvd_train: error:")]


def evaluate(np_: int, run_dir: pathlib.Path, *args: str) -> dict:
    """Runs evaluate with `np_` workers (alone for 1); returns the JSON it wrote."""
    out = args[args.index("--out") + 1] if "--out" in args else str(run_dir / "evaluation.json")
    command = [*HVD, "evaluate", "--config", str(run_dir / "config.yaml"), *args]
    proc = run(command, run_dir.parent) if np_ == 1 else horovodrun(np_, command, run_dir.parent)
    check(proc)
    assert proc.stdout.count("evaluated ") == 1, proc.stdout  # one line, from rank 0
    assert_clean_console(proc)
    return json.loads(pathlib.Path(out).read_text())


@pytest.fixture(scope="module")
def evaluations(trained) -> dict[int, dict]:
    """model.keras on the validation split with 1, 2 and 3 workers (1: the default --out)."""
    outs = {n: ["--out", str(trained.parent / f"eval{n}.json")] for n in (2, 3)}
    return {n: evaluate(n, trained, *outs.get(n, [])) for n in (1, 2, 3)}


@pytest.mark.stack
def test_metrics_are_identical_at_1_2_and_3_workers(evaluations) -> None:
    one = evaluations[1]
    assert one["examples"] == DIGITS_VAL
    assert 0.0 < one["accuracy"] < 1.0 and one["loss"] > 0.0, one
    for n in (2, 3):
        got = evaluations[n]
        assert got["workers"] == n
        assert got["examples"] == DIGITS_VAL
        # Exact: the same batches, the same float64 sums added in the same order.
        assert (got["loss"], got["accuracy"]) == (one["loss"], one["accuracy"]), (n, got, one)


@pytest.mark.stack
def test_metrics_match_the_runs_final_validation(trained, evaluations) -> None:
    final = json.loads((trained / "summary.json").read_text())["final_metrics"]
    with open(trained / "metrics.csv") as f:
        last = list(csv.DictReader(f))[-1]
    got = evaluations[1]
    assert got["accuracy"] == final["val_accuracy"]
    assert float(last["val_accuracy"]) == pytest.approx(got["accuracy"], abs=5e-6)  # 6 digits
    # Not to the last bit: training's validation deals examples out one by one (worker r takes
    # every N-th), evaluate deals whole batches, and a row's float32 output can differ in its
    # last bits with its place in the batch (and with the thread count). That moves the mean
    # loss by a few float32 ulps (2^-23 = 1.2e-7) at most.
    assert got["loss"] == pytest.approx(final["val_loss"], rel=1e-6)


@pytest.mark.stack
def test_a_checkpoint_evaluates_like_model_keras(trained, evaluations) -> None:
    [ckpt] = (trained / "checkpoints").glob("ckpt-*")  # the last epoch's: model.keras's weights
    got = evaluate(1, trained, "--model", str(ckpt), "--out", str(trained.parent / "ckpt.json"))
    assert (got["loss"], got["accuracy"]) == (evaluations[1]["loss"], evaluations[1]["accuracy"])
    assert got["model"] == str(ckpt)


def test_default_output_leaves_run_dir_a_run_dir(trained, evaluations) -> None:
    assert json.loads((trained / "evaluation.json").read_text()) == evaluations[1]
    assert rundir.foreign_files(str(trained)) == []  # so a resume still claims it


def test_an_out_file_evaluate_did_not_write_is_left_alone(trained) -> None:
    out = trained.parent / "notes.json"
    out.write_text('{"mine": 1}')
    command = [*HVD, "evaluate", "--config", str(trained / "config.yaml"), "--out", str(out)]
    proc = run(command, trained.parent)
    assert proc.returncode == 2, proc.stderr
    [line] = error_lines(proc.stderr)
    assert "not written by hvd-train evaluate" in line, line
    assert out.read_text() == '{"mine": 1}'


def write_images(root: pathlib.Path, names, seed: int = 0) -> pathlib.Path:
    """Random 12x10 RGB images, PNG or JPEG by extension, at `root/name`."""
    rng = np.random.default_rng(seed)
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        kind = "JPEG" if path.suffix.lower() in (".jpg", ".jpeg") else "PNG"
        Image.fromarray((rng.random((12, 10, 3)) * 255).astype(np.uint8)).save(path, kind)
    return root


def test_a_folder_and_its_tfrecords_evaluate_alike(trained) -> None:
    """13 images in class folders 0..9 (the digits' class names): every one counted once, and
    the same numbers from the images and from their TFRecord conversion."""
    names = [f"{c}/{i}.{'png' if i else 'jpg'}" for c in range(10) for i in range(1 + (c < 3))]
    folder = write_images(trained.parent / "eval_images", names, seed=1)
    records = trained.parent / "eval_records"
    assert_clean_console(check(run([*HVD, "convert-tfrecord", str(folder), str(records),
                                    "--shards", "3"], trained.parent)))  # fmt: skip
    from_images = evaluate(1, trained, "--data", str(folder), "--out", str(folder) + ".json")
    from_records = evaluate(2, trained, "--data", str(records / "train"), "--out",
                            str(records) + ".json")  # fmt: skip
    assert from_images["examples"] == from_records["examples"] == 13
    assert from_images["loss"] == from_records["loss"]
    assert from_images["accuracy"] == from_records["accuracy"]


@pytest.fixture(scope="module")
def predict_folder(trained) -> pathlib.Path:
    return write_images(trained.parent / "predict_images", PREDICT_FILES)


def predict(np_: int, trained: pathlib.Path, folder: pathlib.Path, out: str, *args: str):
    command = [*HVD, "predict", "--config", str(trained / "config.yaml"), "--images",
               str(folder), "--out", str(trained.parent / out), *args]  # fmt: skip
    return run(command, trained.parent) if np_ == 1 else horovodrun(np_, command, trained.parent)


def read_rows(path: pathlib.Path) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))


@pytest.mark.stack
def test_predict_writes_each_image_once_the_same_at_1_2_and_3_workers(
    trained, predict_folder
) -> None:
    # Batches of 2: 4 batches for 2 and 3 workers, so every worker predicts some images.
    outputs = {}
    for n in (1, 2, 3):
        assert_clean_console(
            check(predict(n, trained, predict_folder, f"pred{n}.csv", "--batch-size", "2"))
        )
        outputs[n] = read_rows(trained.parent / f"pred{n}.csv")
    header, *rows = outputs[1]
    assert header == ["path", "class", "class_index", "probability"]
    assert [r[0] for r in rows] == sorted(PREDICT_FILES)  # each path once, sorted
    for _, name, index, p in rows:
        assert name == str(index) and 0 <= int(index) < 10  # digits: class names are "0".."9"
        assert 0.1 <= float(p) <= 1.0  # the largest of 10 probabilities
    assert outputs[2] == outputs[1]
    assert outputs[3] == outputs[1]


def test_predict_follows_on_corrupt(trained, predict_folder) -> None:
    folder = trained.parent / "predict_corrupt"
    write_images(folder, PREDICT_FILES)
    (folder / "b" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    proc = predict(1, trained, folder, "corrupt.csv")
    assert proc.returncode == 2, proc.stderr[-3000:]
    [line] = error_lines(proc.stderr)
    assert "1 unreadable images: b/broken.png" in line, line
    proc = check(predict(1, trained, folder, "corrupt.csv", "--set", "data.on_corrupt=skip"))
    assert "1 unreadable images skipped" in proc.stdout
    assert [r[0] for r in read_rows(trained.parent / "corrupt.csv")[1:]] == sorted(PREDICT_FILES)


@pytest.mark.parametrize(
    "case, args, says",
    [
        ("missing model", ["evaluate", "--model", "nope.keras"], "nope.keras does not exist"),
        ("other classes", ["evaluate", "--data", "{other}"], "the model was trained on"),
        (
            "class count",
            ["evaluate", "--set", "data.source=synthetic", "--set", "data.num_classes=5"],
            "has 10 outputs",
        ),  # fmt: skip
        ("empty folder", ["predict", "--images", "{empty}", "--out", "p.csv"], "holds no"),
    ],
)
def test_bad_input_exits_2_in_one_line(trained, case, args, says) -> None:
    other = write_images(trained.parent / "other_classes", ["cat/1.png", "dog/2.png"])
    empty = trained.parent / "empty"
    empty.mkdir(exist_ok=True)
    args = [a.format(other=other, empty=empty) for a in args]
    proc = run([*HVD, args[0], "--config", str(trained / "config.yaml"), *args[1:]],
               trained.parent)  # fmt: skip
    assert proc.returncode == 2, (case, proc.stderr[-3000:])
    [line] = error_lines(proc.stderr)
    assert says in line, (case, line)


def test_help_describes_both_commands(tmp_path) -> None:
    for command, says in (("evaluate", "exactly"), ("predict", "sorted by path")):
        proc = check(run([*HVD, command, "--help"], tmp_path))
        assert says in proc.stdout, proc.stdout
