"""Running the same command again: a finished run is never rewritten.

A rerun with nothing left to train says so in one line, exits 0 and changes no file of the
run, whatever its worker count and launcher. Raising `train.epochs` continues from the last
checkpoint, and summary.json then describes the whole run: the epochs done, the last epoch's
metrics, this job's throughput (from `trained_from`) and what the earlier jobs did.
"""

from __future__ import annotations

import json
import pathlib

import pytest
from harness import PYTHON, QUICKSTART, check, run

from hvd_train.record.summary import earlier_job, nothing_to_train, problems

pytestmark = pytest.mark.multiworker

# With the timeline on: Horovod would empty timeline.json at init, which a rerun must not.
SMALL = ["train.steps_per_epoch=3", "train.verbose=false", "logging.tensorboard=false",
         "horovod.timeline=true"]  # fmt: skip


def sets(*overrides: str) -> list[str]:
    return [x for o in (*SMALL, *overrides) for x in ("--set", o)]


def snapshot(run_dir: pathlib.Path) -> dict[str, tuple[bytes, int]]:
    """Every file under run.dir: its bytes and its modification time."""
    return {
        str(p.relative_to(run_dir)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }


def summary(run_dir: pathlib.Path) -> dict:
    """run.dir's summary.json, which holds only declared fields (record/summary.py)."""
    s = json.loads((run_dir / "summary.json").read_text())
    assert problems(s) == [], problems(s)
    return s


@pytest.mark.parametrize(
    ("record", "epochs", "said"),
    [
        ({"status": "completed", "epochs": 12, "epochs_completed": 12}, 12,
         "runs/x already completed 12 of 12 epochs; nothing to train (raise train.epochs to continue)"),
        ({"status": "completed", "epochs": 40, "epochs_completed": 40}, 3,
         "runs/x already completed 40 of 40 epochs; nothing to train (train.epochs is 3: raise it above 40 to continue)"),
        ({"status": "completed", "epochs": 12, "epochs_completed": 12}, 13, None),
        ({"status": "interrupted", "epochs": 12, "epochs_completed": 5}, 5, None),  # its end to do
        ({"status": "failed", "epochs": 1, "epochs_completed": 1}, 1, None),
        ({"status": "interrupted", "epochs": 12, "epochs_completed": 5}, 12, None),
        ({"status": "failed", "epochs": 12, "epochs_completed": 0}, 12, None),
        ({"status": "completed", "epochs": 12, "epochs_completed": 7,
          "stopped_early": {"epoch": 7, "by": "EarlyStopping"}}, 12,
         "runs/x already completed: its callbacks stopped it early at epoch 7 of 12 (EarlyStopping); nothing to train (raise train.epochs above 12 to continue)"),
        ({"status": "completed", "epochs": 12, "epochs_completed": 7,
          "stopped_early": {"epoch": 7, "by": "EarlyStopping"}}, 14, None),
        ({"status": "running", "epochs": 12, "epochs_completed": 12}, 12, None),
        ({}, 12, None),
    ],
)  # fmt: skip
def test_what_a_rerun_has_left_to_train(record, epochs, said) -> None:
    assert nothing_to_train(record, epochs, "runs/x") == said


def test_an_earlier_job_keeps_what_it_did_and_nothing_else() -> None:
    record = {"status": "completed", "started_at": 1.0, "world_size": 2, "controller": "gloo",
              "global_batch_size": 64, "epochs_completed": 2, "train_examples_per_sec": 9.0,
              "wall_time_s": 3.0, "stopped_at": None, "final_metrics": {"loss": 1.0},
              "versions": {}, "trained_from": {"epoch": 1, "step": 0}}  # fmt: skip
    assert earlier_job(record) == {
        "started_at": 1.0, "status": "completed", "world_size": 2, "controller": "gloo",
        "global_batch_size": 64, "trained_from": {"epoch": 1, "step": 0},
        "epochs_completed": 2, "train_examples_per_sec": 9.0, "wall_time_s": 3.0,
    }  # fmt: skip


@pytest.mark.processes
def test_a_rerun_of_a_finished_run_changes_nothing_and_raising_epochs_continues(
    tmp_path,
) -> None:
    """One worker trains 2 short epochs. The same command again, then `hvd-train launch` at 2
    workers with fewer epochs: one line each, exit 0, every file of the run as it was (bytes
    and modification times). Then 3 epochs at 2 workers: it continues at epoch 3, and the
    record holds the whole run."""
    d = tmp_path / "run"
    alone = [PYTHON, "-m", "hvd_train", "--config", str(QUICKSTART), *sets(f"run.dir={d}")]
    check(run([*alone, "--set", "train.epochs=2"], tmp_path))
    first = summary(d)
    assert first["status"] == "completed" and first["epochs_completed"] == 2, first
    assert first["trained_from"] == {"epoch": 1, "step": 0} and first["earlier_jobs"] == []
    before = snapshot(d)
    assert {
        "summary.json",
        "config.yaml",
        "model.keras",
        "logs/rank-0.log",
        "timeline.json",
    } <= set(before)

    again = check(run([*alone, "--set", "train.epochs=2"], tmp_path))
    said = f"[hvd_train] {d} already completed 2 of 2 epochs; nothing to train (raise train.epochs to continue)"
    assert again.stdout.splitlines() == [said], again.stdout
    assert snapshot(d) == before

    launch = [PYTHON, "-m", "hvd_train", "launch", "--np", "2", "--gloo", "--config",
              str(QUICKSTART), *sets(f"run.dir={d}")]  # fmt: skip
    fewer = check(run([*launch, "--set", "train.epochs=1"], tmp_path))
    assert (
        f"{d} already completed 2 of 2 epochs; nothing to train (train.epochs is 1: raise it "
        "above 2 to continue)" in fewer.stdout
    ), fewer.stdout
    assert fewer.stderr.splitlines()[-1] == (
        "[hvd_train launch] nothing was trained: run.dir is as it was"
    ), fewer.stderr[-2000:]
    assert snapshot(d) == before

    more = check(run([*launch, "--set", "train.epochs=3"], tmp_path))
    assert "resuming from" in more.stdout and ": epoch 3, step 0" in more.stdout, more.stdout
    s = summary(d)
    assert s["status"] == "completed" and s["epochs_completed"] == 3 and s["epochs"] == 3, s
    assert s["world_size"] == 2 and s["trained_from"] == {"epoch": 3, "step": 0}, s
    assert s["earlier_jobs"] == [earlier_job(first)], s
    assert s["earlier_jobs"][0]["world_size"] == 1
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(s["final_metrics"]), s
    assert s["train_examples_per_sec"] > 0, s
    assert s["best_model_path"] == str(d / "best.keras") and (d / "best.keras").exists(), s
    assert s["launch"] == {"restarts": 0, "failures": []}, s


@pytest.mark.processes
def test_starting_afresh_sets_the_earlier_runs_checkpoints_aside(tmp_path) -> None:
    """One worker trains 3 short epochs; `train.resume: never` then trains 1 afresh in the same
    run.dir. The earlier run's checkpoints and best model move to checkpoints/earlier-1, none
    deleted, and checkpoints/ holds this run's alone. With `auto` and 2 epochs, the same
    command then continues this run at epoch 2, not the earlier one at its epoch 4."""
    d = tmp_path / "run"
    alone = [PYTHON, "-m", "hvd_train", "--config", str(QUICKSTART), *sets(f"run.dir={d}")]
    check(run([*alone, "--set", "train.epochs=3"], tmp_path))
    earlier = sorted(p.name for p in (d / "checkpoints").iterdir())
    assert earlier == ["ckpt-00000003", "ckpt-00000006", "ckpt-00000009"], earlier

    afresh = check(run([*alone, "--set", "train.epochs=1", "--set", "train.resume=never"],
                       tmp_path))  # fmt: skip
    aside = d / "checkpoints" / "earlier-1"
    assert f"set aside in {aside}, out of this run's way" in afresh.stdout, afresh.stdout
    assert sorted(p.name for p in aside.iterdir()) == ["best.keras", *earlier]
    assert sorted(p.name for p in (d / "checkpoints").iterdir()) == ["ckpt-00000003", "earlier-1"]
    s = summary(d)
    assert s["last_checkpoint"] == str(d / "checkpoints" / "ckpt-00000003"), s
    assert s["epochs_completed"] == 1 and s["earlier_jobs"] == [], s

    more = check(run([*alone, "--set", "train.epochs=2"], tmp_path))
    assert ": epoch 2, step 0" in more.stdout, more.stdout
    s = summary(d)
    assert s["epochs_completed"] == 2 and s["trained_from"] == {"epoch": 2, "step": 0}, s
    assert s["resumed_from"] == str(d / "checkpoints" / "ckpt-00000003"), s
