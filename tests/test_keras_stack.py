"""The Keras hvd_train uses on each TensorFlow stack (hvd_train/runtime/keras_stack.py): Keras 2, chosen
before TensorFlow is imported, Horovod's Keras API bound to it, and a user's Keras left alone.

Each case runs in a fresh process, in an environment without TF_USE_LEGACY_KERAS (this pytest
process has imported hvd_train, which set it): what a user's first `import hvd_train` sees.
"""

from __future__ import annotations

import ast
import pathlib

import pytest
from harness import PYTHON, QUICKSTART, ROOT, check, run

from hvd_train.runtime import keras_stack

pytestmark = pytest.mark.stack
NEWER = keras_stack.uses_tf_keras()  # TensorFlow 2.16+: Keras 2 is tf_keras, `keras` is Keras 3
newer_only = pytest.mark.skipif(not NEWER, reason="TensorFlow 2.15: `keras` is Keras 2 itself")
TINY = ["data.train_examples=64", "data.val_examples=32", "train.epochs=1", "train.verbose=false",
        "logging.tensorboard=false", "run.dir=out"]  # fmt: skip


def fresh(args: list[str], cwd: pathlib.Path, timeout: float = 300):
    """`python ARGS` without TF_USE_LEGACY_KERAS in its environment."""
    env = ["env", "-u", "TF_USE_LEGACY_KERAS", f"PYTHONPATH={ROOT}"]
    return run([*env, PYTHON, *args], cwd, timeout)


def lines(script: str, cwd: pathlib.Path) -> list[str]:
    return check(fresh(["-c", script], cwd)).stdout.strip().splitlines()


def test_import_hvd_train_and_its_cli_select_keras_2_without_importing_tensorflow(tmp_path) -> None:
    out = lines("import os, sys, hvd_train.cli\n"
                "print('tensorflow' in sys.modules, os.environ.get('TF_USE_LEGACY_KERAS'))",
                tmp_path)  # fmt: skip
    assert out == ["False 1" if NEWER else "False None"]


def test_project_keras_and_tf_keras_are_the_same_keras_2(tmp_path) -> None:
    out = lines("import hvd_train, tensorflow as tf\n"
                "from hvd_train.runtime.keras_stack import hvd, keras\n"
                "print(keras.layers.Dense.__module__.split('.')[0], issubclass(tf.keras.Model, keras.Model))\n"
                "print(issubclass(hvd.callbacks.MetricAverageCallback, keras.callbacks.Callback))",
                tmp_path)  # fmt: skip
    # Horovod's callbacks derive from the project's Keras 2 callback class
    assert out == [f"{'tf_keras' if NEWER else 'keras'} True", "True"]


@newer_only
def test_users_import_keras_still_means_keras_3(tmp_path) -> None:
    # Before and after Horovod's Keras API is imported: the binding of `keras` to tf_keras lasts
    # only while Horovod imports, and Horovod's own backend is tf_keras's.
    out = lines("import sys\n"
                "import keras as before\n"
                "from hvd_train.runtime.keras_stack import hvd\n"
                "import horovod.tensorflow.keras as h, keras\n"
                "print(keras is before, keras.__version__.split('.')[0], h.K.__name__)",
                tmp_path)  # fmt: skip
    assert out == ["True 3 tf_keras.backend"]
    out = lines("import sys\n"
                "from hvd_train.runtime.keras_stack import hvd\n"
                "print('keras' in sys.modules)\n"
                "import keras\n"
                "print(keras.__version__.split('.')[0])",
                tmp_path)  # fmt: skip
    assert out == ["False", "3"]


def factory_file(tmp_path: pathlib.Path, keras_import: str) -> str:
    path = tmp_path / "factory.py"
    path.write_text(
        f"{keras_import}\n\n\n"
        "def build(cfg, input_shape, num_classes):\n"
        "    inputs = keras.Input(shape=input_shape)\n"
        "    x = keras.layers.Flatten()(inputs)\n"
        "    return keras.Model(inputs, keras.layers.Dense(num_classes, activation='softmax')(x))\n"
    )
    return f"{path}:build"


def train(tmp_path: pathlib.Path, factory: str):
    sets = [arg for s in [*TINY, f"model.factory={factory}"] for arg in ("--set", s)]
    return fresh(["-m", "hvd_train", "--config", str(QUICKSTART), *sets], tmp_path)


@newer_only
def test_factory_building_with_keras_3_is_one_clear_error(tmp_path) -> None:
    import keras  # Keras 3, as the user's factory imports it

    factory = factory_file(tmp_path, "import keras")
    proc = train(tmp_path, factory)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("[rank 0] failed:")]
    assert errors == [
        f"[rank 0] failed: model.factory: {factory} returned a Keras 3 model (keras "
        f"{keras.__version__}), but Horovod's Keras API works with Keras 2 only: build the "
        "model with tf.keras (`import tensorflow as tf`, then tf.keras.layers...) or with "
        "`import tf_keras as keras`, not `import keras`; full log: out/logs/rank-0.log"
    ]


@pytest.mark.parametrize(
    "keras_import",
    ["import tensorflow as tf\nkeras = tf.keras",
     *(["import tf_keras as keras"] if NEWER else [])],
    ids=lambda s: s.splitlines()[-1],
)  # fmt: skip
def test_factory_building_with_keras_2_trains(tmp_path, keras_import) -> None:
    proc = check(train(tmp_path, factory_file(tmp_path, keras_import)))
    assert "[hvd_train] done in" in proc.stdout, proc.stdout[-2000:]
    assert (tmp_path / "out" / "model.keras").is_file()


def test_no_module_but_keras_stack_imports_keras_or_horovods_keras_api() -> None:
    # One import path: every other module takes Keras and horovod.tensorflow.keras from
    # keras_stack, so the choice of Keras is made in one place.
    chosen_there = {"keras", "tf_keras", "horovod.tensorflow.keras"}
    offenders = []
    for path in sorted((ROOT / "hvd_train").glob("*.py")):
        if path.name in ("keras_stack.py", "doctor.py"):  # doctor reports what tf.keras is
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                names = {node.module or ""}
            elif isinstance(node, ast.Attribute) and node.attr == "keras":
                names = {"tf.keras"} if getattr(node.value, "id", "") == "tf" else set()
            else:
                continue
            if names & (chosen_there | {"tf.keras"}):
                offenders.append(f"{path.name}:{node.lineno}: {sorted(names)}")
    assert offenders == []


def test_tensorboard_missing_is_one_line_before_training(monkeypatch) -> None:
    """TensorFlow 2.21 no longer installs TensorBoard (the install adds it): without it,
    logging.tensorboard (on by default) is refused in one line before Horovod starts, not with
    TBNotInstalledError after the first epoch."""
    import importlib.util

    from hvd_train.base.errors import UserError
    from hvd_train.config import load_config
    from hvd_train.train.callbacks import require_tensorboard

    require_tensorboard(load_config(QUICKSTART))  # installed on every stack by install.sh
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "tensorboard" else found(name, *a),
    )
    with pytest.raises(UserError, match=r"^logging.tensorboard is true, but the tensorboard "
                       r"package is not installed .*: pip install tensorboard, or set "
                       r"logging.tensorboard: false$"):  # fmt: skip
        require_tensorboard(load_config(QUICKSTART))
    require_tensorboard(load_config(QUICKSTART, ["logging.tensorboard=false"]))
