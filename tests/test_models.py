"""Built-in models, pretrained weights from a file, SyncBatchNormalization, users' own models.

Two jobs run tests/workers/train_runs.py. One, at 2 workers, trains the mlp, the example factory
model, the example with SyncBatchNormalization and MobileNetV2 (a Keras Applications base,
nested) with SyncBatchNormalization. The other, one worker alone, trains ResNet50 and
EfficientNetB0 a step: what they add to MobileNetV2 is their own layers, and tracing their steps
on a second rank would only double the time of the slowest job in the suite.
"""

from __future__ import annotations

import json
import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf
from harness import PYTHON, ROOT, WORKERS, check, horovodrun, load_model, run

from hvd_train.base.errors import ConfigError
from hvd_train.config import ModelConfig, load_config
from hvd_train.config import check as check_config
from hvd_train.runtime.keras import binding
from hvd_train.train.models import application, build_model, input_adapter, plain_clone

EXAMPLE = ROOT / "examples" / "my_model.yaml"
TINY = ["data.source=synthetic", "data.image_size=[32, 32]", "data.train_examples=16",
        "data.val_examples=8", "train.batch_size=4", "train.epochs=1", "train.verbose=false",
        "logging.tensorboard=false", "model.dense_units=[16]"]  # fmt: skip
# convnet trains at 2 workers in test_multiworker.py; MobileNetV2 trains here with sync BN.
BUILTIN = {"mlp": 2, "mobilenet_v2_sync": 2, "resnet50": 1, "efficientnet_b0": 1}
# Building and tracing the Applications models is slow on a shared 2-core CPU.
pytestmark = pytest.mark.timeout(1500)


def bare(name: str, weights: str = "none") -> ModelConfig:
    """The `model` section of the Applications base `name` under the classifier alone (no
    hidden dense layer, no dropout), as these tests build it."""
    return ModelConfig(name=name, weights=weights, dense_units=(), dropout=0.0)


def _job(root: pathlib.Path, spec: list[dict], workers: int) -> dict[str, dict]:
    """Runs tests/workers/train_runs.py on 2 workers, or alone; its per-run results by name."""
    (root / "spec.json").write_text(json.dumps(spec))
    program = [PYTHON, str(WORKERS / "train_runs.py"), str(root / "spec.json")]
    # cwd = the repository root: the example's model.factory is a path relative to it
    if workers == 1:
        proc = check(run(program, cwd=ROOT, timeout=1400))
    else:
        proc = check(horovodrun(workers, program, cwd=ROOT, timeout=1400))
    # horovodrun prefixes each line with the rank, e.g. "[0]<stdout>:RESULT {...}"
    results = [json.loads(m) for m in re.findall(r"RESULT (\{.*\})", proc.stdout)]
    assert [r["name"] for r in results] == [s["name"] for s in spec], proc.stdout[-3000:]
    return {r["name"]: r for r in results}


@pytest.fixture(scope="module")
def applications(tmp_path_factory) -> tuple[pathlib.Path, dict[str, dict]]:
    """ResNet50 and EfficientNetB0 one step, one worker alone, with no validation (tracing each
    model's steps is most of this job's time)."""
    root = tmp_path_factory.mktemp("applications")
    spec = [
        {"name": name, "config": None,
         "overrides": [*TINY, f"model.name={name}", "train.steps_per_epoch=1",
                       "data.val_examples=0", f"run.dir={root / name}"]}
        for name in ("resnet50", "efficientnet_b0")
    ]  # fmt: skip
    return root, _job(root, spec, workers=1)


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[pathlib.Path, dict[str, dict]]:
    """mlp one step; the example model two epochs on digits, and with SyncBN two steps;
    MobileNetV2 two steps with SyncBN, then its predictions on a probe saved. 2 workers."""
    root = tmp_path_factory.mktemp("small")
    probe = root / "probe.npy"
    np.save(probe, np.random.default_rng(0).random((4, 32, 32, 3), dtype=np.float32))
    spec = [
        {"name": "mlp", "config": None,
         "overrides": [*TINY, "model.name=mlp", "train.steps_per_epoch=1", f"run.dir={root / 'mlp'}"]},
        {"name": "example", "config": str(EXAMPLE),
         "overrides": ["train.epochs=2", "logging.tensorboard=false", "train.verbose=false",
                       f"run.dir={root / 'example'}"]},
        {"name": "example_sync", "config": str(EXAMPLE),
         "overrides": ["train.epochs=1", "train.steps_per_epoch=2", "model.sync_batch_norm=true",
                       "logging.tensorboard=false", f"run.dir={root / 'example_sync'}"]},
        {"name": "mobilenet_v2_sync", "config": None, "predict_on": str(probe),
         "overrides": [*TINY, "model.name=mobilenet_v2", "model.sync_batch_norm=true",
                       f"run.dir={root / 'mobilenet_v2_sync'}"]},
    ]  # fmt: skip
    return root, _job(root, spec, workers=2)


@pytest.mark.processes
@pytest.mark.multiworker
@pytest.mark.parametrize("name", BUILTIN)
def test_each_builtin_model_trains_a_step(request, name: str) -> None:
    workers = BUILTIN[name]
    root, results = request.getfixturevalue("small" if workers == 2 else "applications")
    r = results[name]
    assert (r["status"], r["world_size"]) == ("completed", workers), r
    assert r["trainable_identical"], f"{name}: weights differ across ranks"
    assert np.isfinite(r["final_metrics"]["loss"]), r
    assert (root / name / "model.keras").is_file()


@pytest.mark.processes
@pytest.mark.stack
@pytest.mark.multiworker
def test_factory_example_trains_unchanged_at_2_workers(small) -> None:
    root, results = small
    r = results["example"]
    assert (r["status"], r["world_size"]) == ("completed", 2), r
    assert r["sync_layers"] == 0
    written = load_config(root / "example" / "config.yaml")
    assert (
        written.model.factory == load_config(EXAMPLE).model.factory == "examples/my_model.py:build"
    )
    # it learns: 10 classes, so chance is 0.1
    assert r["final_metrics"]["val_accuracy"] > 0.3, r


@pytest.mark.processes
@pytest.mark.multiworker
def test_sync_batch_norm_keeps_statistics_identical_on_all_workers(small) -> None:
    """Plain BatchNormalization updates its moving statistics from each worker's own batch, and
    the trainer averages them over the ranks at each epoch's end (and before each checkpoint),
    so the model validated and saved is every rank's; SyncBatchNormalization uses the global
    batch, so every rank holds the same statistics throughout. Nested bases are swapped too."""
    plain, sync = small[1]["example"], small[1]["example_sync"]
    mobilenet = small[1]["mobilenet_v2_sync"]
    assert plain["bn_statistics"] > 0 and plain["bn_statistics_identical"], plain
    assert plain["sync_layers"] == 0, plain
    assert sync["sync_layers"] == 5 and sync["bn_statistics_identical"], sync
    assert mobilenet["sync_layers"] == 52 and mobilenet["bn_statistics_identical"], mobilenet
    assert mobilenet["bn_statistics"] == 2 * 52


@pytest.mark.processes
@pytest.mark.multiworker
def test_exported_sync_model_loads_without_horovod_with_the_same_predictions(small) -> None:
    root, _ = small
    run_dir = root / "mobilenet_v2_sync"
    script = f"""
import sys
sys.modules["horovod"] = None  # any import of horovod now fails
import numpy as np, tensorflow as tf
model = tf.keras.models.load_model({str(run_dir / "model.keras")!r})
kinds = {{type(x).__name__ for x in model.get_layer("mobilenet_v2").layers if "Normalization" in type(x).__name__}}
print("kinds", sorted(kinds))
got = model.predict(np.load({str(root / "probe.npy")!r}), verbose=0)
print("max_diff", float(np.abs(got - np.load({str(run_dir / "predictions.npy")!r})).max()))
"""
    out = check(run([PYTHON, "-c", script], cwd=run_dir)).stdout
    assert "kinds ['BatchNormalization']" in out, out
    assert float(re.search(r"max_diff (\S+)", out).group(1)) < 1e-5, out


SUBCLASSED = "tests/workers/subclassed_models.py:tiny_net"


@pytest.fixture(scope="module")
def subclassed(tmp_path_factory) -> tuple[pathlib.Path, dict[str, dict]]:
    """A subclassed Keras 3 model (layers built at its first call) one epoch, then the same
    run.dir resumed for a second, its predictions on a probe saved. 2 workers, one job."""
    root = tmp_path_factory.mktemp("subclassed")
    probe = root / "probe.npy"
    np.save(probe, np.random.default_rng(0).random((4, 32, 32, 3), dtype=np.float32))
    run = [*TINY, f"model.factory={SUBCLASSED}", f"run.dir={root / 'run'}"]
    spec = [
        {"name": "first", "config": None, "overrides": run},
        {"name": "resumed", "config": None, "overrides": [*run, "train.epochs=2"],
         "predict_on": str(probe)},
    ]  # fmt: skip
    return root, _job(root, spec, workers=2)


@pytest.mark.processes
@pytest.mark.multiworker
@pytest.mark.skipif(not binding.has_keras3(), reason="Keras 3 (TensorFlow 2.16+)")
def test_a_subclassed_keras3_model_trains_resumes_and_exports(subclassed) -> None:
    """A keras.Model subclass whose layers are built at its first call trains at 2 workers,
    resumes from its checkpoint (the optimizer's step count goes on from it), and its exported
    model.keras loads where its class is importable, with the trained model's predictions."""
    import importlib.util

    root, results = subclassed
    first, resumed = results["first"], results["resumed"]
    assert (first["status"], first["world_size"]) == ("completed", 2), first
    assert first["trainable_identical"] and resumed["trainable_identical"]
    steps = first["iterations"]  # one epoch's
    assert steps > 0 and resumed["iterations"] == 2 * steps, (first, resumed)
    summary = json.loads((root / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["epochs_completed"] == 2, summary
    # the class is importable where the model loads: its module registers it with Keras
    path = ROOT / SUBCLASSED.rpartition(":")[0]
    spec = importlib.util.spec_from_file_location("subclassed_models", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    model = load_model(root / "run" / "model.keras")
    assert type(model).__name__ == "TinyNet"
    got = model.predict(np.load(root / "probe.npy"), verbose=0)
    np.testing.assert_allclose(got, np.load(root / "run" / "predictions.npy"), atol=1e-6)


# --------------------------------------------------------------------------- single process


def _randomise(model: tf.keras.Model, seed: int) -> None:
    """Random weights everywhere (positive variances), so that outputs depend on all of them."""
    rng = np.random.default_rng(seed)
    model.set_weights([
        np.abs(rng.normal(1, 0.1, w.shape)) if "variance" in v.name else rng.normal(0, 0.1, w.shape)
        for v, w in zip(model.weights, model.get_weights(), strict=True)
    ])  # fmt: skip


@pytest.mark.skipif(not binding.has_keras3(), reason="Keras 3 (TensorFlow 2.16+)")
def test_the_export_copy_keeps_a_functional_models_own_class_where_its_config_rebuilds_it():
    """A functional model of a class of its own (as KerasHub's tasks are) is copied in its class,
    with its weights; one whose class its config cannot rebuild (it would not load from its file
    either) becomes a plain Functional of the same layers, as `clone_model` makes it."""
    import keras

    class Tagged(keras.Model):
        def __init__(self, units: int = 3, **kwargs):
            inputs = keras.Input((4,))
            super().__init__(inputs, keras.layers.Dense(units)(inputs), **kwargs)
            self.units = units

        def get_config(self) -> dict:
            return {"units": self.units, "name": self.name}

        @classmethod
        def from_config(cls, config: dict) -> Tagged:
            return cls(**config)

    class Bare(keras.Model):
        def __init__(self):
            inputs = keras.Input((4,))
            super().__init__(inputs, keras.layers.Dense(2)(inputs))

    x = np.random.default_rng(0).random((5, 4), dtype=np.float32)
    with binding.activated(binding.KERAS3):
        for model, kind in ((Tagged(units=3), Tagged), (Bare(), keras.Model)):
            _randomise(model, seed=1)
            copy = plain_clone(model)
            assert type(copy).__name__ == ("Tagged" if kind is Tagged else "Functional")
            assert isinstance(copy, kind) and copy is not model
            np.testing.assert_array_equal(copy(x), model(x))


def test_pretrained_weights_file_loads_and_predictions_match(tmp_path) -> None:
    """A base saved with save_weights (.h5) or save (.keras) loads into a fresh model, which
    then predicts exactly as the model it came from."""
    x = np.random.default_rng(1).random((4, 32, 32, 3), dtype=np.float32)
    tf.keras.utils.set_random_seed(7)
    trained = application((32, 32, 3), 5, bare("mobilenet_v2"))
    base = trained.get_layer("mobilenet_v2")
    _randomise(base, seed=3)  # stands in for pretrained weights
    base.save_weights(str(tmp_path / "base.weights.h5"))  # Keras 3 names it so; 2 reads it
    base.save(str(tmp_path / "base.keras"))
    expected = trained(x, training=False).numpy()  # called, not predict(): nothing to trace

    tf.keras.utils.set_random_seed(7)  # same head as `trained`; only the base differs
    fresh = application((32, 32, 3), 5, bare("mobilenet_v2"))(x, training=False).numpy()
    assert np.abs(fresh - expected).max() > 1e-3  # without the file the predictions differ
    for name in ("base.weights.h5", "base.keras"):
        tf.keras.utils.set_random_seed(7)
        loaded = application((32, 32, 3), 5, bare("mobilenet_v2", str(tmp_path / name)))
        predicted = loaded(x, training=False).numpy()
        np.testing.assert_allclose(predicted, expected, atol=1e-6, err_msg=name)


def test_missing_weights_file_says_where_weights_come_from(tmp_path) -> None:
    with pytest.raises(ConfigError) as info:
        application((32, 32, 3), 5, bare("resnet50", str(tmp_path / "nope.h5")))
    message = str(info.value)
    assert message.startswith(f"model.weights: '{tmp_path / 'nope.h5'}' not found.")
    assert "never downloaded" in message
    assert "keras.applications.ResNet50(weights='imagenet', include_top=False)" in message
    assert "\n" not in message


# Keras warns about each variable of the file that does not match (about 1,200 lines) before
# hvd_train refuses the file; the refusal is what this test reads.
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_weights_file_of_another_model_is_a_config_error(tmp_path) -> None:
    path = str(tmp_path / "mobilenet.weights.h5")
    application((32, 32, 3), 5, bare("mobilenet_v2")).get_layer("mobilenet_v2").save_weights(path)
    with pytest.raises(ConfigError, match=r"does not fit the ResNet50 base without its classifier"):
        application((32, 32, 3), 5, bare("resnet50", path))


def test_efficientnet_imagenet_weights_get_keras_variance_correction(tmp_path) -> None:
    """Keras' ImageNet EfficientNet weights store the standard deviation as the Normalization
    variance; loaded from a file, the input must still end up divided by the deviation."""
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    donor = tf.keras.applications.EfficientNetB0(include_top=False, weights=None,
                                                 input_shape=(32, 32, 3))  # fmt: skip
    norm = next(x for x in donor.layers if isinstance(x, tf.keras.layers.Normalization))
    norm.set_weights([mean, std, norm.get_weights()[2]])  # as in Keras' imagenet file
    path = str(tmp_path / "efficientnet.weights.h5")
    donor.save_weights(path)
    model = application((32, 32, 3), 5, bare("efficientnet_b0", path))
    base = model.get_layer("efficientnet_b0")
    norm = next(x for x in base.layers if isinstance(x, tf.keras.layers.Normalization))
    upto = tf.keras.Model(model.input, tf.keras.Model(base.input, norm.output)(
        model.get_layer("preprocess").output))  # fmt: skip
    x = np.random.default_rng(2).random((2, 32, 32, 3), dtype=np.float32)
    np.testing.assert_allclose(upto(x).numpy(), (x - mean) / std, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("name", "keras_preprocess"),
    [
        ("mobilenet_v2", tf.keras.applications.mobilenet_v2.preprocess_input),
        ("resnet50", tf.keras.applications.resnet50.preprocess_input),
        ("efficientnet_b0", lambda x: x),  # [0, 255]: the model normalises inside itself
    ],
)
def test_inputs_in_0_1_reach_the_base_as_keras_preprocess_input_makes_them(name, keras_preprocess):
    x = np.random.default_rng(3).random((2, 32, 32, 3), dtype=np.float32)
    rgb = input_adapter(name, channels=3)(x).numpy()
    np.testing.assert_allclose(rgb, keras_preprocess(x * 255.0), atol=1e-4)
    grey = input_adapter(name, channels=1)(x[..., :1]).numpy()  # repeated into 3 channels
    as_rgb = np.repeat(x[..., :1], 3, axis=-1)
    np.testing.assert_allclose(grey, keras_preprocess(as_rgb * 255.0), atol=1e-4)


def test_frozen_base_trains_the_head_only() -> None:
    cfg = load_config(None, ["model.name=mobilenet_v2", "model.trainable_base=false",
                             "model.dense_units=[8]", "model.pooling=max"])  # fmt: skip
    model = build_model(cfg, (32, 32, 3), 5)
    assert model.get_layer("mobilenet_v2").trainable_weights == []
    assert not model.get_layer("preprocess").trainable_weights
    assert len(model.trainable_weights) == 4  # hidden dense and classifier: kernels, biases
    assert isinstance(model.get_layer("max_pool"), tf.keras.layers.GlobalMaxPooling2D)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.weights=w.h5"], "model.weights: applies to the Keras Applications bases (mobilenet_v2, resnet50, efficientnet_b0), not to model.name 'convnet'"),
        (["model.factory=a:b", "model.name=resnet50", "model.trainable_base=false"], "model.trainable_base: applies to the Keras Applications bases (mobilenet_v2, resnet50, efficientnet_b0), not to model.factory 'a:b'"),
    ],
)  # fmt: skip
def test_base_options_on_other_models_are_config_errors(overrides, message) -> None:
    with pytest.raises(ConfigError) as info:
        check_config(load_config(None, overrides), world_size=1)
    assert str(info.value) == message


def test_small_or_flat_inputs_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"mobilenet_v2 needs images of at least 32x32, got 8x8"):
        application((8, 8, 1), 10, bare("mobilenet_v2"))
    with pytest.raises(ConfigError, match=r"resnet50 takes images of height x width x 1 or 3"):
        application((64,), 10, bare("resnet50"))


def test_factory_accepts_a_file_path_and_names_a_missing_one(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    cfg = load_config(EXAMPLE)
    model = build_model(cfg, (8, 8, 1), 10)
    assert model.name == "my_model" and model.output_shape == (None, 10)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"model.factory: file 'examples/my_model.py' not found"):
        build_model(cfg, (8, 8, 1), 10)


def test_every_applications_name_has_its_base_and_preprocessing() -> None:
    """model.name's Applications choices (config.ApplicationName) are the bases models.py
    builds and preprocesses: a name added to one list and not the others fails here."""
    from hvd_train import config
    from hvd_train.train import models

    assert set(models.BASES) == set(config.APPLICATIONS) == set(models.PREPROCESS)


def test_a_factory_that_raises_at_import_is_named_by_file_and_line(tmp_path, monkeypatch) -> None:
    """The user's module raising while imported: the error says where in their code; a module
    that imports what is missing says where too."""
    from hvd_train.base.errors import users_frame

    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.py").write_text("import os\nraise RuntimeError('my bug')\n")
    with pytest.raises(RuntimeError, match="my bug") as raised:
        build_model(load_config(None, ["model.factory=bad.py:build"]), (8, 8, 1), 10)
    assert users_frame(raised.value) == "bad.py:2"
    (tmp_path / "needs.py").write_text("\nimport no_such_package_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"No module named 'no_such_package_xyz' at needs.py:2\)"):
        build_model(load_config(None, ["model.factory=needs:build"]), (8, 8, 1), 10)


@pytest.mark.processes
def test_a_job_whose_factory_raises_names_the_users_line(tmp_path) -> None:
    (tmp_path / "bad.py").write_text("import os\nraise RuntimeError('my bug')\n")
    d = tmp_path / "run"
    proc = run([PYTHON, "-m", "hvd_train", "--config", str(ROOT / "configs" / "quickstart.yaml"),
                "--set", "model.factory=bad.py:build", "--set", f"run.dir={d}"], tmp_path)  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[-1] == (
        f"[rank 0] failed: RuntimeError: my bug (at bad.py:2); full log: {d}/logs/rank-0.log"
    ), proc.stderr[-3000:]
    assert 'File "' in (d / "logs" / "rank-0.log").read_text()  # the traceback, in the log
    error = json.loads((d / "summary.json").read_text())["error"]
    assert error == "RuntimeError: my bug (at bad.py:2)", error
