"""Which Keras trains (hvd_train/runtime/keras/binding.py): Keras 3 by default on TensorFlow 2.16+,
a factory's model with its own Keras, tf_keras by `runtime.keras`, chosen before TensorFlow is
imported where it must be, and a user's own `import keras` left alone.

Each case runs in a fresh process, in an environment without TF_USE_LEGACY_KERAS: what a
user's first `import hvd_train` sees.
"""

from __future__ import annotations

import ast
import json
import pathlib

import pytest
from harness import PYTHON, QUICKSTART, ROOT, check, horovodrun, run

from hvd_train.runtime.keras import binding

pytestmark = pytest.mark.stack
NEWER = binding.has_keras3()  # TensorFlow 2.16+: `keras` is Keras 3, Keras 2 is tf_keras
newer_only = pytest.mark.skipif(not NEWER, reason="TensorFlow 2.15: `keras` is Keras 2 itself")
TINY = ["data.train_examples=64", "data.val_examples=32", "train.epochs=1", "train.verbose=false",
        "logging.tensorboard=false", "run.dir=out"]  # fmt: skip


def fresh(args: list[str], cwd: pathlib.Path, timeout: float = 300):
    """`python ARGS` without TF_USE_LEGACY_KERAS in its environment."""
    env = ["env", "-u", "TF_USE_LEGACY_KERAS", f"PYTHONPATH={ROOT}"]
    return run([*env, PYTHON, *args], cwd, timeout)


def lines(script: str, cwd: pathlib.Path) -> list[str]:
    return check(fresh(["-c", script], cwd)).stdout.strip().splitlines()


@pytest.mark.processes
def test_import_hvd_train_and_its_cli_choose_no_keras_and_import_no_tensorflow(tmp_path) -> None:
    out = lines("import os, sys, hvd_train.cli\n"
                "print('tensorflow' in sys.modules, os.environ.get('TF_USE_LEGACY_KERAS'))",
                tmp_path)  # fmt: skip
    assert out == ["False None"]


@pytest.mark.processes
@newer_only
def test_users_import_keras_still_means_keras_3_beside_the_keras_2_binding(tmp_path) -> None:
    # Before and after Horovod's Keras API is imported by the Keras 2 binding: the binding of
    # `keras` and `tf.keras` to tf_keras lasts only while Horovod imports, and Horovod's own
    # backend is tf_keras's.
    out = lines("import keras as before, tensorflow as tf\n"
                "from hvd_train.runtime.keras import v2\n"
                "import horovod.tensorflow.keras as h, keras\n"
                "print(keras is before, keras.__version__.split('.')[0], h.K.__name__,\n"
                "      tf.keras.Model is keras.Model)",
                tmp_path)  # fmt: skip
    assert out == ["True 3 tf_keras.backend True"]


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


def train(tmp_path: pathlib.Path, factory: str, *sets: str):
    sets_ = [arg for s in [*TINY, f"model.factory={factory}", *sets] for arg in ("--set", s)]
    return fresh(["-m", "hvd_train", "--config", str(QUICKSTART), *sets_], tmp_path)


def trained_with(tmp_path: pathlib.Path) -> str:
    """The package of `versions.keras` in the run's record: `keras` or `tf_keras`."""
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    return summary["versions"]["keras"].split()[0]


@pytest.mark.processes
@pytest.mark.parametrize(
    ("keras_import", "sets", "expected"),
    [("import tensorflow as tf\nkeras = tf.keras", [], "keras"),  # 2.15: tf.keras is keras 2
     *([("import keras", [], "keras"),
        ("import tf_keras as keras", [], "tf_keras"),
        ("import tensorflow as tf\nkeras = tf.keras", ["runtime.keras=tf_keras"], "tf_keras")]
       if NEWER else [])],
    ids=["tf.keras", *(["keras", "tf_keras", "tf.keras-as-tf_keras"] if NEWER else [])],
)  # fmt: skip
def test_a_factory_trains_with_the_keras_of_its_model(tmp_path, keras_import, sets, expected):
    """Under `runtime.keras: auto` the factory's model decides; `runtime.keras: tf_keras` makes a
    factory's tf.keras Keras 2 (TF_USE_LEGACY_KERAS=1 before TensorFlow is imported)."""
    proc = check(train(tmp_path, factory_file(tmp_path, keras_import), *sets))
    assert "[hvd_train] done in" in proc.stdout, proc.stdout[-2000:]
    assert trained_with(tmp_path) == expected
    assert (tmp_path / "out" / "model.keras").is_file()


@pytest.mark.processes
@newer_only
def test_a_factory_of_the_other_keras_than_model_keras_is_one_line(tmp_path) -> None:
    factory = factory_file(tmp_path, "import tf_keras as keras")
    proc = train(tmp_path, factory, "runtime.keras=keras")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("[rank 0] failed:")]
    assert errors == [
        f"[rank 0] failed: runtime.keras is keras, but model.factory {factory} returned a tf_keras "
        f"model ({binding.describe('tf_keras')}); build it with keras (`import keras`), or set "
        "runtime.keras: auto to train each model with its own Keras; full log: out/logs/rank-0.log"
    ]


def test_the_keras_choice_is_made_in_the_bindings_alone() -> None:
    # One place per Keras: every other module takes Keras, tf_keras and Horovod's Keras API from
    # runtime/keras/binding.py, so the choice of Keras is made there.
    chosen_there = {"keras", "tf_keras", "horovod.tensorflow.keras"}
    allowed = {"v2.py", "v3.py", "doctor.py"}  # doctor reports what imports
    offenders = []
    for path in sorted((ROOT / "hvd_train").rglob("*.py")):
        if path.name in allowed:
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
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {sorted(names)}")
    assert offenders == []


def test_tensorboard_missing_is_one_line_before_training(monkeypatch) -> None:
    """TensorFlow 2.21 no longer installs TensorBoard (the install adds it): without it,
    logging.tensorboard (on by default) is refused in one line before Horovod starts, not with
    TBNotInstalledError after the first epoch."""
    import importlib.util

    from hvd_train.base.errors import UserError
    from hvd_train.config import load_config
    from hvd_train.train.callbacks.tensorboard import require_tensorboard

    require_tensorboard(load_config(QUICKSTART).logging)  # installed on every stack by install.sh
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "tensorboard" else found(name, *a),
    )
    with pytest.raises(UserError, match=r"^logging.tensorboard is true, but the tensorboard "
                       r"package is not installed .*: pip install tensorboard, or set "
                       r"logging.tensorboard: false$"):  # fmt: skip
        require_tensorboard(load_config(QUICKSTART).logging)
    require_tensorboard(load_config(QUICKSTART, ["logging.tensorboard=false"]).logging)


@pytest.mark.processes
@newer_only
@pytest.mark.multiworker
@pytest.mark.parametrize(("wrote", "resumes"), [("tf_keras", "keras"), ("keras", "tf_keras")])
def test_a_checkpoint_of_the_other_keras_is_refused_in_one_line(tmp_path, wrote, resumes) -> None:
    """Keras 3 cannot read Keras 2's variables, nor the reverse: a run continued (raised
    train.epochs) with the other Keras than its checkpoint's ends at once, 2 workers under
    horovodrun, with exit code 2 and one line that names both Kerases and the setting that
    resumes it; the checkpoint stays in place, and the record keeps what the finished job
    achieved (its epoch, checkpoint, metrics and model, and the job in earlier_jobs)."""
    sets = ["train.steps_per_epoch=2", "data.val_examples=64"]
    first = [*TINY, *sets, f"runtime.keras={wrote}"]
    check(fresh(["-m", "hvd_train", "--config", str(QUICKSTART),
                 *(a for x in first for a in ("--set", x))], tmp_path))  # fmt: skip
    finished = json.loads((tmp_path / "out" / "summary.json").read_text())
    again = [*TINY, *sets, "train.epochs=2", f"runtime.keras={resumes}"]
    proc = horovodrun(2, ["env", "-u", "TF_USE_LEGACY_KERAS", PYTHON, "-m", "hvd_train",
                          "--config", str(QUICKSTART), *(a for x in again for a in ("--set", x))],
                      tmp_path)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    # horovodrun prefixes each rank's line: "[0]<stderr>:[rank 0] failed: ..."
    said = [line.partition(">:")[2] for line in proc.stderr.splitlines() if "failed:" in line]
    assert sorted(said) == [
        f"[rank {rank}] failed: train.resume: auto: cannot resume from out/checkpoints/"
        f"ckpt-00000002: it was written by {binding.describe(wrote)}, and this run trains with "
        f"{binding.describe(resumes)}: set runtime.keras: {wrote} to resume it, or start afresh "
        f"with another run.dir or train.resume=never; full log: out/logs/rank-{rank}.log"
        for rank in (0, 1)
    ], proc.stderr[-3000:]
    assert (tmp_path / "out" / "checkpoints" / "ckpt-00000002").is_dir()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["status"], summary["error_type"]) == ("failed", "DataError"), summary
    kept = ("epochs_completed", "last_checkpoint", "final_metrics", "model_path")
    assert {k: summary[k] for k in kept} == {k: finished[k] for k in kept}, summary
    assert finished["epochs_completed"] == 1 and finished["final_metrics"], finished
    assert [job["status"] for job in summary["earlier_jobs"]] == ["completed"], summary
