"""`hvd-train compare` on real runs: the quickstart, shrunk, at 1 and at 2 workers."""

from __future__ import annotations

import csv
import json
import pathlib
import re

import pytest
from harness import PYTHON, QUICKSTART, check, horovodrun, run

from hvd_train.config import derive, load_config
from hvd_train.runtime.schedules import learning_rate_schedule

pytestmark = [pytest.mark.multiworker, pytest.mark.processes]

SMALL = ["train.epochs=3", "model.filters=[8, 8, 16, 16]", "model.dense_units=[32]",
         "logging.tensorboard=false", "train.verbose=false", "optimizer.schedule=cosine",
         "optimizer.warmup_epochs=1"]  # fmt: skip


def _args(run_dir: str) -> list[str]:
    sets = [x for kv in [*SMALL, f"run.dir={run_dir}"] for x in ("--set", kv)]
    return ["-m", "hvd_train", "--config", str(QUICKSTART), *sets]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("compare")
    check(run([PYTHON, *_args("one")], cwd=root))
    check(horovodrun(2, [PYTHON, *_args("two")], cwd=root))
    return root


def read(run_dir: pathlib.Path) -> tuple[list[dict[str, float]], dict]:
    with open(run_dir / "metrics.csv") as f:
        rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]
    return rows, json.loads((run_dir / "summary.json").read_text())


def test_compare_prints_the_table_and_writes_the_png(runs: pathlib.Path) -> None:
    proc = check(run([PYTHON, "-m", "hvd_train", "compare", "one", "two", "--out", "c/cmp.png"],
                     cwd=runs, timeout=120))  # fmt: skip
    assert (runs / "c" / "cmp.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["run", "model", "workers", "batch/worker", "global", "batch",
                                "epochs", "best", "val", "acc", "at", "epoch", "time", "to",
                                "best", "(s)", "examples/s"]  # fmt: skip
    assert lines[3] == "time: cumulative training time (epoch_time_s)"
    for line, name, workers in ((lines[1], "one", 1), (lines[2], "two", 2)):
        rows, summary = read(runs / name)
        best = max(range(len(rows)), key=lambda i: rows[i]["val_accuracy"])
        expected = [name, "convnet", str(workers), "32", str(32 * workers), "3",
                    f"{rows[best]['val_accuracy']:.4f}", str(best + 1),
                    f"{sum(r['epoch_time_s'] for r in rows[: best + 1]):.1f}",
                    f"{summary['train_examples_per_sec']:.0f}"]  # fmt: skip
        assert line.split() == expected, proc.stdout
    assert lines[4] == "wrote c/cmp.png"


def test_logged_rates_follow_the_cosine_schedule_per_batch(runs: pathlib.Path) -> None:
    """metrics.csv logs the rate of each epoch's last step: the schedule at that step."""
    for name, workers in (("one", 1), ("two", 2)):
        rows, summary = read(runs / name)
        cfg = load_config(runs / name / "config.yaml")
        d = derive(cfg, workers, num_train=1438)
        assert d.steps_per_epoch == summary["steps_per_epoch"]
        s = learning_rate_schedule(cfg, d)
        for r in rows:
            step = int(r["epoch"]) * d.steps_per_epoch - 1
            assert r["learning_rate"] == pytest.approx(float(s(step)), rel=1e-5), (name, r)
    assert rows[-1]["learning_rate"] < 0.1 * rows[0]["learning_rate"]  # it decayed


def test_one_worker_resuming_the_2_worker_run_ends_its_schedule_at_the_floor(runs) -> None:
    """One worker (44 steps an epoch) resumes the 2-worker run (22) from its epoch-2 checkpoint,
    in a run.dir of its own: its schedule continues at epoch 2, not at the step counter's 44
    read as one worker's steps, so epoch 3's last step trains at the cosine's floor, 0."""
    ckpt = runs / "two" / "checkpoints" / "ckpt-00000044"
    proc = check(run([PYTHON, *_args("resumed"), "--set", f"train.resume={ckpt}"], cwd=runs))
    assert f"resuming from {ckpt}: epoch 3, step 0" in proc.stdout, proc.stdout
    rows, summary = read(runs / "resumed")
    assert summary["world_size"] == 1 and [r["epoch"] for r in rows] == [3], rows
    assert rows[-1]["learning_rate"] == 0.0, rows


def test_a_folder_without_metrics_is_exit_2_with_one_line(runs: pathlib.Path) -> None:
    proc = run([PYTHON, "-m", "hvd_train", "compare", "one", "nope"], cwd=runs, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "hvd_train: error: compare: nope: no metrics.csv; expected a run.dir written by hvd-train"
    ]
    assert re.search(r"\bone\b", proc.stdout) is None  # nothing printed before the error


def test_plan_starts_from_the_one_worker_run_and_refuses_the_two_worker_one(runs) -> None:
    """`hvd-train plan --run` reads the 1-worker run's summary.json: its median step, its batch
    and the trainable parameters rank 0 recorded (4 bytes each); a 2-worker run's step already
    holds an all-reduce, so it is refused."""
    from hvd_train.base.errors import UserError
    from hvd_train.launcher.throughput_model import workload_from_run

    summary = json.loads((runs / "one" / "summary.json").read_text())
    assert summary["gradient_dtype"] == "float32"
    assert summary["gradient_bytes"] == 4 * summary["trainable_parameters"] > 0
    w = workload_from_run(str(runs / "one"), fp16=False)
    assert w.throughput == pytest.approx(1000 * 32 / summary["step_time_ms"])
    assert w.examples_per_epoch == summary["steps_per_epoch"] * 32
    with pytest.raises(UserError, match="a run of 2 workers"):
        workload_from_run(str(runs / "two"), fp16=False)
