"""The run's opening lines say what the run does: its launcher, how the learning rate was
scaled, which weights file the model starts from."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
from harness import PYTHON, QUICKSTART, check, run

from hvd_train.config import load_config
from hvd_train.data.job import plan_job
from hvd_train.data.sources import Source
from hvd_train.train.models import weights_note
from hvd_train.train.run.banner import lr_label


@pytest.mark.processes
def test_lone_process_says_no_launcher_and_a_fixed_global_batch_is_not_scaled(tmp_path) -> None:
    """Started without horovodrun, Horovod initialises MPI for the process alone: no "mpi"."""
    proc = check(run([PYTHON, "-m", "hvd_train", "--config", str(QUICKSTART),
                      "--set", "train.epochs=1", "--set", "train.batch_size_mode=global",
                      "--set", "train.batch_size=64", "--set", f"run.dir={tmp_path / 'run'}"],
                     cwd=tmp_path, timeout=300))  # fmt: skip
    plan = next(line for line in proc.stdout.splitlines() if "steps/epoch" in line)
    assert plan.startswith("[hvd_train] 1 worker (no launcher), cpu | batch 64/worker, 64 global")
    assert "learning rate 0.001 -> 0.001 (not scaled: the global batch is fixed, warm-up" in plan
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["status"], summary["controller"]) == ("completed", "none")


@pytest.mark.parametrize(
    ("overrides", "workers", "label"),
    [
        ([], 2, "linear x2 for 2 workers"),
        (["optimizer.lr_scaling=sqrt"], 4, "sqrt x2 for 4 workers"),
        (["train.gradient_accumulation_steps=2"], 2, "linear x4 for 2 workers x 2 accumulated batches"),
        (["train.batch_size_mode=global", "train.batch_size=64"], 2, "not scaled: the global batch is fixed"),
        (["train.batch_size_mode=global", "train.batch_size=64", "train.gradient_accumulation_steps=2"], 2, "linear x2 for 2 accumulated batches"),
        (["optimizer.lr_scaling=none"], 2, "not scaled: optimizer.lr_scaling none"),
        ([], 1, "not scaled: one worker"),
    ],
)  # fmt: skip
def test_learning_rate_label_says_what_derive_did(overrides, workers, label) -> None:
    cfg = load_config(None, ["train.batch_size=32", *overrides])
    x, y = np.zeros((1000, 1), np.float32), np.zeros(1000, np.int32)  # 1000 examples, no more
    assert lr_label(plan_job(cfg, Source(x, y, x[:0], y[:0], 2), workers)) == label


def test_weights_note_names_the_file_loaded_only_when_one_is(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "mobilenet_v2_notop.h5"
    cfg = load_config(None, ["model.name=mobilenet_v2", f"model.weights={path}"])
    assert weights_note(cfg.model) == f"model.weights: loaded {path} into the mobilenet_v2 base"
    assert weights_note(load_config(None, ["model.name=mobilenet_v2"]).model) is None
    assert weights_note(load_config(None, []).model) is None
