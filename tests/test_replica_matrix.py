"""Where the features that change the state meet: real 2-worker jobs over {Keras 3, tf_keras} x
{accumulation 1, 2} x {float32, mixed_float16 with an overflow forced on one rank} x {a resume at
an epoch's end, mid-window, at another worker count} x {train.steps_per_execution 1, 2, 3, the
run and its resume at different ones}. Each cell checks that every replicated
variable is identical on every rank at the end, that a resume at the same worker count ends as
the uninterrupted run to the bit, and that the learning rate goes on where it was (cosine ends at
its floor). The cells are chosen so that every value of every axis meets the others at least
once, and `make test` runs the Keras 3 ones (the tf_keras ones run in CI's Python 3.13 leg, as
every second-Keras run: tests/harness.py); docs/faults.md says why a resume at another worker
count cannot be exact.
"""

from __future__ import annotations

import csv
import pathlib
import re

import numpy as np
import pytest
import yaml
from harness import KERASES, PYTHON, WORKERS, check, horovodrun

pytestmark = [pytest.mark.multiworker, pytest.mark.stack, pytest.mark.processes]

STEPS = 6  # steps per epoch; a checkpoint every 3 steps, so ckpt-00000003 is mid-window at 2
EPOCHS = 2
OVERFLOW_AFTER = 4  # rank 1's gradients become infinite at its 5th step (mixed_float16 cells)


# (keras, accumulation, precision, resume, (the first run's steps_per_execution, the resumed
# run's)): resume is "epoch" (from the end of epoch 1), "window" (from step 3 of epoch 1,
# mid-window), or "workers" (1 worker's epoch-1 checkpoint resumed at 2 workers). A resumed run
# at another steps_per_execution ending as the uninterrupted one to the bit shows that it
# changes nothing in the training.
CELLS = [
    ("keras", 2, "mixed_float16", "window", (3, 2)),  # resumed: calls of 2 and 1
    ("keras", 1, "float32", "workers", (2, 3)),
    ("tf_keras", 1, "mixed_float16", "epoch", (1, 1)),
    ("tf_keras", 2, "float32", "window", (1, 3)),
    ("tf_keras", 2, "float32", "workers", (1, 1)),
]
CELLS = [c for c in CELLS if c[0] in KERASES]  # TensorFlow 2.15: tf_keras alone


def _config(tmp_path: pathlib.Path, accumulation: int, precision: str) -> pathlib.Path:
    config = {
        "train": {"epochs": EPOCHS, "batch_size": 16, "steps_per_epoch": STEPS,
                  "gradient_accumulation_steps": accumulation, "verbose": False},
        "optimizer": {"name": "adamw", "learning_rate": 0.002, "warmup_epochs": 1,
                      "schedule": "cosine"},
        "checkpoint": {"every_steps": 3, "keep_last": 100},
        "data": {"source": "digits", "validation_fraction": 0.2, "max_val_per_class": 8},
        "model": {"name": "convnet", "filters": [8, 16], "dense_units": [32], "dropout": 0.1},
        "logging": {"tensorboard": False},
    }  # fmt: skip
    if precision == "mixed_float16":
        config["runtime"] = {"mixed_precision": "mixed_float16"}
        config["model"]["factory"] = "faulty_models:inf_gradient_on_one_rank"
    path = tmp_path / "cell.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _job(tmp_path: pathlib.Path, np: int, config: pathlib.Path, keras: str, *sets: str):
    cmd = [PYTHON, str(WORKERS / "train_and_compare_weights.py"), str(config),
           f"runtime.keras={keras}", *sets]  # fmt: skip
    return check(horovodrun(np, cmd, tmp_path, timeout=240)).stdout


def _digest(out: str, np: int) -> str:
    found = re.findall(rf"rank (\d): weights identical on {np} ranks: ([0-9a-f]+)", out)
    assert sorted(r for r, _ in found) == [str(r) for r in range(np)], out[-3000:]
    assert len({d for _, d in found}) == 1, found
    return found[0][1]


def _rates(run_dir: pathlib.Path) -> list[float]:
    with open(run_dir / "metrics.csv") as f:
        return [float(row["learning_rate"]) for row in csv.DictReader(f)]


def _loss_scales(out: str) -> set[str]:
    return set(re.findall(r"rank \d: iterations \d+, loss scale (\S+)", out))


@pytest.mark.parametrize(
    "keras,accumulation,precision,resume,calls",
    # The second Keras' cells are left to CI's Python 3.13 leg (second_keras: tests/harness.py).
    [pytest.param(*c, marks=() if c[0] == KERASES[0] else pytest.mark.second_keras) for c in CELLS],
    ids=["-".join(map(str, [*c[:4], "spe%d-%d" % c[4]])) for c in CELLS],
)
def test_a_cell_ends_with_identical_ranks_and_the_uninterrupted_runs_numbers(
    tmp_path, monkeypatch, keras, accumulation, precision, resume, calls
) -> None:
    monkeypatch.setenv("FAULTY_AFTER_STEPS", str(OVERFLOW_AFTER))
    config = _config(tmp_path, accumulation, precision)
    first_np = 1 if resume == "workers" else 2
    first_k, resumed_k = (f"train.steps_per_execution={k}" for k in calls)
    whole = _job(tmp_path, first_np, config, keras, "run.dir=whole", first_k)
    step = 3 if resume == "window" else STEPS
    ckpt = tmp_path / "whole" / "checkpoints" / f"ckpt-{step:08d}"
    assert ckpt.is_dir(), sorted(p.name for p in (tmp_path / "whole" / "checkpoints").iterdir())
    assert (ckpt / "window.npz").exists() == (resume == "window"), list(ckpt.iterdir())
    if resume == "window":
        with np.load(ckpt / "window.npz") as z:  # both ranks' part-way sums, none all zero
            assert {k.split("/")[0] for k in z.files} == {"0", "1"}, z.files
            assert all(np.any(z[k]) for k in z.files if k.endswith("/0")), z.files
    resumed = _job(tmp_path, 2, config, keras, "run.dir=resumed", f"train.resume={ckpt}", resumed_k)
    assert "resuming from" in resumed, resumed[-3000:]
    digest = _digest(resumed, 2)  # every replicated variable identical on both ranks
    rates, rates_whole = _rates(tmp_path / "resumed"), _rates(tmp_path / "whole")
    assert rates[-1] == 0.0 == rates_whole[-1], (rates, rates_whole)  # cosine at its floor
    if precision == "mixed_float16":
        # Rank 1's overflow was skipped by both ranks, which halved the same scale.
        scales = _loss_scales(resumed)
        assert len(scales) == 1 and float(scales.pop()) < 2.0**15, resumed[-3000:]
    # metrics.csv of the resumed run.dir: the epochs it trained, from the one it resumed in.
    assert len(rates) == (EPOCHS - 1 if resume in ("epoch", "workers") else EPOCHS), rates
    if resume == "workers":
        # At another worker count the rate is scaled by it (x2 here); where the schedule is
        # in its run (epoch 2 of 2) is the same. metrics.csv keeps 6 significant digits,
        # each rounded by at most 5e-6 of the value.
        assert rates == pytest.approx([2 * r for r in rates_whole[1:]], rel=1e-5, abs=0.0)
        return
    assert digest == _digest(whole, 2)  # the uninterrupted run's state, to the bit
    assert rates == rates_whole[-len(rates) :]
    assert _loss_scales(resumed) == _loss_scales(whole)
