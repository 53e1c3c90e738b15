"""Models as keras.io's guides write them (tests/workers/keras_io_models.py: no `get_config`, an
unregistered class, a Lambda, augmentation layers), trained by `python -m hvd_train` at 2
workers, then evaluated by `hvd-train evaluate` in a process of its own: no finished epoch is
lost to an export, and every run that completes can be evaluated.

A model whose `.keras` file would not load again gets `model.weights.h5` and
`best.weights.h5` instead, said once at the start; evaluate rebuilds it from the run's
`model.factory` and loads the weights (Keras' safe mode stays on). The subclassed one is also
resumed at another worker count and predicts from its weights. Keras 3 only: keras.io's guides are Keras 3's.
"""

from __future__ import annotations

import csv
import json
import pathlib

import numpy as np
import pytest
from harness import PYTHON, QUICKSTART, check, horovodrun, run
from PIL import Image

from hvd_train.runtime.keras import binding

pytestmark = [
    pytest.mark.multiworker,
    pytest.mark.skipif(not binding.has_keras3(), reason="Keras 3 (TensorFlow 2.16+)"),
    pytest.mark.processes,
]

HVD = [PYTHON, "-m", "hvd_train"]
FACTORIES = str(pathlib.Path(__file__).parent / "workers" / "keras_io_models.py")
KERAS2 = str(pathlib.Path(__file__).parent / "workers" / "keras2_io_models.py")  # the same, Keras 2
NOTE = "cannot be saved as a .keras file that loads again"
# model: (the class the note names, what in Keras' message says why), or None: a .keras file
MODELS = {
    "subclassed": ("Classifier", "get_config()"),
    "custom_train_step": ("CustomModel", "Could not locate class 'CustomModel'"),
    "with_lambda": ("Functional", "Lambda"),
    "augmented": None,
}


def _train(root: pathlib.Path, name: str, workers: int, *sets: str, factories: str = FACTORIES):
    command = [*HVD, "--config", str(QUICKSTART), "--set", f"run.dir={root / name}",
               "--set", f"model.factory={factories}:{name}", "--set", "train.epochs=1",
               *(a for s in sets for a in ("--set", s))]  # fmt: skip
    return check(horovodrun(workers, command, root) if workers > 1 else run(command, root))


def _evaluate(run_dir: pathlib.Path) -> dict:
    command = [*HVD, "evaluate", "--config", str(run_dir / "config.yaml")]
    check(run(command, run_dir.parent))
    return json.loads((run_dir / "evaluation.json").read_text())


@pytest.mark.parametrize("name", list(MODELS))
def test_a_keras_io_model_trains_at_2_workers_and_evaluates(tmp_path, name: str) -> None:
    out = _train(tmp_path, name, 2).stdout
    run_dir = tmp_path / name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed", summary
    expected = MODELS[name]
    if expected is None:
        assert NOTE not in out, out[-3000:]
        assert summary["model_path"] == str(run_dir / "model.keras")
        assert (run_dir / "best.keras").exists()
    else:
        cls, why = expected
        notes = [line for line in out.splitlines() if NOTE in line]
        assert len(notes) == 1 and f"({cls})" in notes[0] and why in notes[0], out[-3000:]
        assert summary["model_path"] == str(run_dir / "model.weights.h5"), summary
        assert summary["best_model_path"] == str(run_dir / "best.weights.h5"), summary
        assert not (run_dir / "model.keras").exists() and not (run_dir / "best.keras").exists()
    evaluation = _evaluate(run_dir)
    assert evaluation["examples"] > 0 and 0.0 <= evaluation["accuracy"] <= 1.0, evaluation
    # The weights evaluated are the ones trained: the same validation split, the same numbers.
    final = summary["final_metrics"]
    assert evaluation["accuracy"] == pytest.approx(final["val_accuracy"], abs=1e-6), final


@pytest.mark.parametrize(
    "factories",
    [FACTORIES, pytest.param(KERAS2, marks=[pytest.mark.stack, pytest.mark.second_keras])],
    ids=["keras3", "keras2"],
)
def test_a_subclassed_model_without_get_config_resumes_at_another_worker_count(
    tmp_path, factories
) -> None:
    _train(tmp_path, "subclassed", 2, factories=factories)
    out = _train(tmp_path, "subclassed", 1, "train.epochs=2", factories=factories).stdout
    assert "resuming from" in out, out[-3000:]
    summary = json.loads((tmp_path / "subclassed" / "summary.json").read_text())
    assert (summary["status"], summary["epochs_completed"]) == ("completed", 2), summary
    evaluation = _evaluate(tmp_path / "subclassed")
    assert evaluation["accuracy"] == pytest.approx(
        summary["final_metrics"]["val_accuracy"], abs=1e-6
    )
    # predict: every image of a folder, a class each, from model.weights.h5 at 2 workers
    rng = np.random.default_rng(0)
    images = tmp_path / "images"
    for name in ("a.png", "b.png", "sub/c.png"):
        (images / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(images / name)
    command = [*HVD, "predict", "--config", str(tmp_path / "subclassed" / "config.yaml"),
               "--images", str(images), "--out", str(tmp_path / "p.csv")]  # fmt: skip
    check(horovodrun(2, command, tmp_path))
    with open(tmp_path / "p.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["path"] for r in rows] == ["a.png", "b.png", "sub/c.png"], rows
    assert all(0 <= int(r["class_index"]) < 10 for r in rows), rows


def _weights(path: pathlib.Path) -> dict[str, np.ndarray]:
    """Every array of a Keras `.weights.h5` file, by its path in the file."""
    import h5py

    found: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, o: found.update({name: o[()]}) if hasattr(o, "shape") else None)
    return found


@pytest.mark.parametrize(
    "factories",
    [FACTORIES, pytest.param(KERAS2, marks=[pytest.mark.stack, pytest.mark.second_keras])],
    ids=["keras3", "keras2"],
)
def test_a_custom_train_steps_optimizer_apply_averages_as_one_worker_on_the_global_batch(
    tmp_path, factories
) -> None:
    """keras.io's `train_step` calls `self.optimizer.apply(gradients, variables)` (Keras 2's
    guide: `self.optimizer.apply_gradients(zip(...))`): the DistributedOptimizer averages there
    too. Two workers at 32 end with the weights of one at
    64, to float64's rounding of the batch sums (the bound and why: tests/test_multiworker.py
    test_two_workers_at_batch_b_train_like_one_worker_at_2b); had each worker applied its own
    gradients, the ranks would differ, and both would differ from one worker by whole steps."""
    sets = ["train.batch_size_mode=global", "train.batch_size=64", "train.epochs=2",
            "logging.tensorboard=false", "runtime.intra_op_threads=1", "train.verbose=0"]  # fmt: skip
    for workers in (2, 1):
        command = [*HVD, "--config", str(QUICKSTART), "--set", f"run.dir=np{workers}",
                   "--set", f"model.factory={factories}:custom_train_step_float64",
                   *(a for s in sets for a in ("--set", s))]  # fmt: skip
        check(horovodrun(2, command, tmp_path) if workers == 2 else run(command, tmp_path))
    one, two = (
        _weights(tmp_path / "np1/model.weights.h5"),
        _weights(tmp_path / "np2/model.weights.h5"),
    )
    assert one.keys() == two.keys(), (one.keys(), two.keys())
    layers = {name: a for name, a in one.items() if name.startswith("layers/")}  # not metrics
    assert len(layers) == 4, one.keys()  # two Dense layers' kernels and biases
    for name, a in layers.items():
        assert a.dtype == np.float64, name
        assert np.abs(two[name] - a).max() <= 1e-9 * np.abs(a).max(), name


@pytest.mark.stack  # CI's Python 3.13 short suite runs it (make test leaves the second Keras out)
@pytest.mark.second_keras
@pytest.mark.parametrize(
    "name, exported",
    [("subclassed", "model"), ("custom_train_step", "model.weights.h5"),
     ("with_lambda", "model.weights.h5"), ("augmented", "model.keras")],
)  # fmt: skip
def test_the_same_models_written_for_keras_2_train_at_2_workers_and_evaluate(
    tmp_path, name: str, exported: str
) -> None:
    """The same guides' models as written for Keras 2 (tests/workers/keras2_io_models.py), on
    tf_keras: the subclassed one exports a SavedModel folder, the other two their weights. The
    custom `train_step` applies its own gradients (`optimizer.apply_gradients`), which Horovod's
    Keras 2 optimizer did not average: the ranks parted, and the replica check stopped the run.
    It completes now, the ranks checked identical at its end."""
    command = [*HVD, "--config", str(QUICKSTART), "--set", f"run.dir={tmp_path / name}",
               "--set", f"model.factory={KERAS2}:{name}", "--set", "train.epochs=1"]  # fmt: skip
    check(horovodrun(2, command, tmp_path))
    summary = json.loads((tmp_path / name / "summary.json").read_text())
    assert summary["status"] == "completed", summary
    assert summary["versions"]["keras"].split()[-1].startswith("2."), summary["versions"]
    assert summary["model_path"] == str(tmp_path / name / exported), summary
    evaluation = _evaluate(tmp_path / name)
    assert evaluation["accuracy"] == pytest.approx(
        summary["final_metrics"]["val_accuracy"], abs=1e-6
    )
