"""An ecosystem model: a KerasHub ResNet under its ResNetImageClassifier (examples/kerashub.yaml)
trained at 2 workers with Keras 3, and its export loaded back as that KerasHub class.

Skipped where keras_hub is not installed (`HVD_TRAIN_KERAS_HUB=1 make install`; `make test`
installs it on TensorFlow 2.16+). KerasHub is never imported by this process: the job and the
loading script import it.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re

import numpy as np
import pytest
from harness import PYTHON, ROOT, WORKERS, check, horovodrun, run

pytestmark = [
    pytest.mark.multiworker,
    pytest.mark.skipif(
        importlib.util.find_spec("keras_hub") is None,
        reason="keras_hub is not installed: HVD_TRAIN_KERAS_HUB=1 make install (docs/install.md)",
    ),
    pytest.mark.processes,
]

CONFIG = ROOT / "examples" / "kerashub.yaml"


@pytest.fixture(scope="module")
def kerashub_run(tmp_path_factory) -> tuple[pathlib.Path, dict]:
    """The shipped config, unchanged but for its run.dir and TensorBoard, at 2 workers; rank 0
    then predicts a few random images with the trained model (tests/workers/train_runs.py)."""
    root = tmp_path_factory.mktemp("kerashub")
    np.save(root / "probe.npy", np.random.default_rng(0).random((8, 32, 32, 3), dtype=np.float32))
    spec = [{"name": "kerashub", "config": str(CONFIG), "predict_on": str(root / "probe.npy"),
             "overrides": [f"run.dir={root / 'run'}", "logging.tensorboard=false"]}]  # fmt: skip
    (root / "spec.json").write_text(json.dumps(spec))
    # cwd = the repository root: the config's model.factory is a path relative to it
    proc = check(horovodrun(2, [PYTHON, str(WORKERS / "train_runs.py"), str(root / "spec.json")],
                            cwd=ROOT, timeout=600))  # fmt: skip
    result = json.loads(re.search(r"RESULT (\{.*\})", proc.stdout).group(1))
    return root, result


def test_a_kerashub_model_trains_at_2_workers_with_keras_3(kerashub_run) -> None:
    """The run completes with Keras 3 (summary.json's versions.keras) and both ranks end with
    identical trainable weights. (Each rank's BatchNormalization moving statistics follow its own
    batches during an epoch, and are averaged over the ranks at its end: docs/models.md.)"""
    root, result = kerashub_run
    summary = json.loads((root / "run" / "summary.json").read_text())
    assert (summary["status"], summary["world_size"]) == ("completed", 2), summary
    assert summary["epochs_completed"] == 2, summary
    package, version = summary["versions"]["keras"].split()
    assert package == "keras" and version.startswith("3."), summary["versions"]
    assert result["trainable_identical"], "trainable weights differ across ranks"
    # The ResNet's six BatchNormalization layers, each with a moving mean and variance.
    assert result["bn_statistics"] == 2 * 6, result
    assert np.isfinite(summary["final_metrics"]["val_loss"]), summary


def test_the_export_loads_in_plain_keras_3_as_its_kerashub_class(kerashub_run) -> None:
    """model.keras loads with `keras.models.load_model` in a fresh process where hvd_train and
    Horovod cannot be imported, as a ResNetImageClassifier around a ResNetBackbone, and predicts
    what the trained model predicted."""
    root, _ = kerashub_run
    run_dir = root / "run"
    script = f"""
import sys
sys.modules["horovod"] = sys.modules["hvd_train"] = None  # any import of them now fails
import numpy as np
import keras
import keras_hub
model = keras.models.load_model({str(run_dir / "model.keras")!r})
print("classes", type(model).__name__, type(model.backbone).__name__)
got = model.predict(np.load({str(root / "probe.npy")!r}), verbose=0)
print("max_diff", float(np.abs(got - np.load({str(run_dir / "predictions.npy")!r})).max()))
"""
    env = ["env", "-u", "TF_USE_LEGACY_KERAS", "-u", "PYTHONPATH"]
    out = check(run([*env, PYTHON, "-c", script], cwd=root)).stdout
    assert "classes ResNetImageClassifier ResNetBackbone" in out, out
    assert float(re.search(r"max_diff (\S+)", out).group(1)) < 1e-5, out
