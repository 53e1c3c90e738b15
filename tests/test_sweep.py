"""`hvd-train sweep`: refuses grids the host cannot run; runs a real 2-point grid end to end,
logged to MLflow's local store where MLflow's client is installed."""

from __future__ import annotations

import csv
import json
import os
import pathlib

import pytest
from harness import PYTHON, QUICKSTART, check, run
from mlflow_server import QUIET, unavailable

from hvd_train.record import mlflow_run

pytestmark = pytest.mark.processes

NO_MLFLOW = unavailable(server=False)


def sweep(args: list[str], cwd: pathlib.Path, timeout: float = 300):
    return run([PYTHON, "-m", "hvd_train", "sweep", "--config", str(QUICKSTART), *args], cwd,
               timeout)  # fmt: skip


def test_sweep_refuses_more_workers_than_cores_without_gpus(tmp_path: pathlib.Path) -> None:
    cores = len(os.sched_getaffinity(0))
    proc = sweep(["--workers", f"1,{cores + 1}", "--batch-sizes", "32", "--out", "out"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"hvd_train: error: sweep: {cores + 1} workers on {cores} CPU cores would share cores and "
        f"measure contention, not scaling; use --workers up to {cores}, or pass --oversubscribe"
    ]
    assert not (tmp_path / "out").exists(), "a refused grid must not start anything"


def test_sweep_refuses_a_global_batch_that_does_not_divide(tmp_path: pathlib.Path) -> None:
    proc = sweep(["--workers", "1,3", "--batch-sizes", "30,64", "--batch-size-mode", "global",
                  "--oversubscribe", "--out", "out"], tmp_path)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "hvd_train: error: sweep: these grid points are invalid: 3 workers x batch 64: "
        "train.batch_size: a global batch of 64 does not divide evenly by 3 workers; use a "
        "multiple of 3, or batch_size_mode: per_worker"
    )
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> tuple[pathlib.Path, object]:
    """A real grid of 2 points (1 and 2 workers, 2 epochs), in MLflow's local store (SQLite,
    no server) where MLflow's client is installed."""
    root = tmp_path_factory.mktemp("sweep")
    tracked = [] if NO_MLFLOW else [
        "--set", "logging.mlflow=true", "--set", "logging.mlflow_experiment_name=sweeps",
        "--set", f"logging.mlflow_tracking_uri=sqlite:///{root}/mlflow.db"]  # fmt: skip
    proc = check(run([PYTHON, "-m", "hvd_train", "sweep", "--config", str(QUICKSTART),
                      "--workers", "1,2", "--batch-sizes", "32", "--out", "out",
                      "--target-accuracy", "0.5", "--set", "train.epochs=2",
                      "--set", "horovod.controller=mpi",  # the faster one on CPU
                      "--set", "logging.tensorboard=false", "--set", "train.verbose=false",
                      *tracked], root, timeout=300, env=QUIET))  # fmt: skip
    return root, proc


@pytest.mark.multiworker
def test_sweep_runs_every_point_and_writes_table_and_plots(swept) -> None:
    target = 0.5
    tmp_path, proc = swept
    out = tmp_path / "out"
    with open(out / "scaling.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["workers"], r["per_worker_batch"], r["global_batch"], r["status"]) for r in rows] == [
        ("1", "32", "32", "ok"), ("2", "32", "64", "ok"),
    ], proc.stdout  # fmt: skip
    one, two = rows
    for r in rows:  # each point is its own real run; the table holds what it measured
        run_dir = pathlib.Path(r["run_dir"])
        run_dir = run_dir if run_dir.is_absolute() else tmp_path / run_dir
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["world_size"] == int(r["workers"])
        assert summary["controller"] == "mpi"  # sweep launches with horovod.controller
        assert float(r["examples_per_sec"]) == pytest.approx(
            summary["train_examples_per_sec"], rel=1e-5
        )
        with open(run_dir / "metrics.csv") as f:
            epochs = list(csv.DictReader(f))
        elapsed, reached = 0.0, None
        for e in epochs:
            elapsed += float(e["epoch_time_s"])
            if reached is None and float(e["val_accuracy"]) >= target:
                reached = elapsed
        assert float(r["best_val_accuracy"]) == max(float(e["val_accuracy"]) for e in epochs)
        if reached is None:
            assert r["time_to_target_s"] == ""
        else:
            assert float(r["time_to_target_s"]) == pytest.approx(reached, rel=1e-4)
    assert float(one["speedup"]) == 1.0 and float(one["efficiency"]) == 1.0
    speedup = float(two["examples_per_sec"]) / float(one["examples_per_sec"])
    assert float(two["speedup"]) == pytest.approx(speedup, rel=1e-4)
    assert float(two["efficiency"]) == pytest.approx(speedup / 2, rel=1e-4)
    table = (out / "scaling.md").read_text().splitlines()
    assert any(line.startswith("| workers | batch/worker | global batch |") for line in table)
    assert sum(line.startswith("| 1 | 32 | 32 |") or line.startswith("| 2 | 32 | 64 |")
               for line in table) == 2  # fmt: skip
    for png in ("speedup.png", "accuracy_vs_time.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png


@pytest.mark.multiworker
@pytest.mark.skipif(NO_MLFLOW is not None, reason=str(NO_MLFLOW))
def test_each_point_is_an_mlflow_run_under_the_sweeps_run(swept) -> None:
    """The sweep's own MLflow run, FINISHED with the reports, is the parent of one run per
    point, each named after its folder and tagged with it."""
    root, _ = swept
    tracker, _ = mlflow_run.client(f"sqlite:///{root}/mlflow.db")
    experiment = tracker.get_experiment_by_name("sweeps").experiment_id
    runs = {r.info.run_name: r for r in tracker.search_runs([experiment])}
    assert sorted(runs) == ["out", "w1_b32", "w2_b32"], sorted(runs)
    parent = runs.pop("out")
    assert parent.info.status == "FINISHED", parent.info
    files = sorted(a.path for a in tracker.list_artifacts(parent.info.run_id))
    assert files == ["accuracy_vs_time.png", "scaling.csv", "scaling.md", "speedup.png"], files
    for name, point in runs.items():
        assert point.data.tags["mlflow.parentRunId"] == parent.info.run_id, point.data.tags
        assert point.data.tags["run.dir"] == str(root / "out" / "points" / name)
        assert point.info.status == "FINISHED" and point.data.params["world_size"] == name[1]
        summary = json.loads((root / "out" / "points" / name / "summary.json").read_text())
        assert summary["mlflow"]["parent_run_id"] == parent.info.run_id, summary["mlflow"]
