"""`hvd-train export` on runs trained once each: every format written, checked by the command
against the trained model, then loaded again here with its own runtime (tf.saved_model.load and
its `serving_default` signature, onnxruntime, the LiteRT interpreter) and its predictions on the
whole validation split compared with what the run recorded. Keras 3's plain, subclassed (no
`get_config`: rebuilt from the factory and its weights) and mixed_float16 runs; a tf_keras run.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import shutil
import warnings

import numpy as np
import pytest
from harness import PYTHON, QUICKSTART, check, run

from hvd_train import cli
from hvd_train.commands import export as export_command
from hvd_train.runtime.keras import binding

HVD = [PYTHON, "-m", "hvd_train"]
KERAS_IO = pathlib.Path(__file__).parent / "workers" / "keras_io_models.py"
FORMATS = ["saved_model", "onnx", "litert"]
HAS_ONNX = all(importlib.util.find_spec(m) for m in ("tf2onnx", "onnx", "onnxruntime"))
EXPORTED = {"saved_model": "saved_model", "onnx": "model.onnx", "litert": "model.tflite"}


def _train(root: pathlib.Path, name: str, *sets: str) -> pathlib.Path:
    run_dir = root / name
    command = [*HVD, "--config", str(QUICKSTART), "--set", "train.epochs=1",
               "--set", f"run.dir={run_dir}", *(a for s in sets for a in ("--set", s))]  # fmt: skip
    check(run(command, root))
    return run_dir


def _export(run_dir: pathlib.Path, *args: str):
    return run([*HVD, "export", str(run_dir), *args], run_dir.parent)


def _exports(run_dir: pathlib.Path, fmt: str) -> pathlib.Path:
    """Runs the export; checks its one line; returns what it wrote."""
    proc = check(_export(run_dir, "--format", fmt))
    out = run_dir / "export" / EXPORTED[fmt]
    [line] = [line for line in proc.stdout.splitlines() if "exported " in line]
    assert line.endswith(f"wrote {out}"), line
    diff = float(re.search(r"max abs difference ([0-9.e+-]+)", line).group(1))
    assert diff <= 1e-3, line
    assert out.exists() and not list(out.parent.glob("*.partial*")), list(out.parent.iterdir())
    return out


def _validation(run_dir: pathlib.Path) -> tuple[np.ndarray, np.ndarray]:
    """Every validation example as training gave it the model, and its label."""
    from hvd_train.config import load_config
    from hvd_train.data.pipeline import batch_shard
    from hvd_train.train.inference.evaluate import validation_source

    source = validation_source(load_config(run_dir / "config.yaml"))
    data, _ = batch_shard(source, len(source.x_val), 0, 1)
    x, y, _ = next(iter(data))
    return x.numpy(), y.numpy()


def _predict(path: pathlib.Path, fmt: str, x: np.ndarray) -> np.ndarray:
    """The export's outputs, from its own runtime alone (no hvd_train, no Keras)."""
    import tensorflow as tf

    if fmt == "saved_model":
        serve = tf.saved_model.load(str(path)).signatures["serving_default"]
        assert list(serve.structured_input_signature[1]) == ["images"], serve
        return next(iter(serve(images=tf.constant(x)).values())).numpy()
    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return session.run(None, {session.get_inputs()[0].name: x})[0]
    with warnings.catch_warnings():  # its deprecation notice, in favour of ai-edge-litert
        warnings.simplefilter("ignore")
        interpreter = tf.lite.Interpreter(model_path=str(path))
    first = interpreter.get_input_details()[0]
    interpreter.resize_tensor_input(first["index"], x.shape)
    interpreter.allocate_tensors()
    interpreter.set_tensor(first["index"], x)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


def _assert_predicts_like_the_run(run_dir: pathlib.Path, fmt: str, path: pathlib.Path) -> None:
    """The export's accuracy on the whole validation split is the run's final val_accuracy:
    the same predictions as the model training measured."""
    x, y = _validation(run_dir)
    p = _predict(path, fmt, x)
    assert p.shape == (len(x), 10), p.shape
    accuracy = float(np.mean(np.argmax(p, axis=1) == y))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert accuracy == pytest.approx(summary["final_metrics"]["val_accuracy"], abs=1e-6)


def _formats() -> list:
    skip = pytest.mark.skipif(not HAS_ONNX, reason="the extra hvd_train[export] (onnx)")
    return [pytest.param(f, marks=skip) if f == "onnx" else f for f in FORMATS]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> pathlib.Path:
    """The quickstart trained for one epoch on the default Keras; returns its run.dir."""
    return _train(tmp_path_factory.mktemp("export"), "run")


@pytest.mark.processes
@pytest.mark.stack
@pytest.mark.parametrize("fmt", _formats())
def test_each_format_predicts_like_the_trained_model(trained, fmt: str) -> None:
    _assert_predicts_like_the_run(trained, fmt, _exports(trained, fmt))


@pytest.mark.processes
@pytest.mark.skipif(not binding.has_keras3(), reason="keras.io's models are Keras 3's")
def test_a_subclassed_model_without_get_config_exports_from_its_factory(tmp_path) -> None:
    """A subclassed model without get_config (keras.io's: only model.weights.h5) exports,
    rebuilt from `model.factory`."""
    run_dir = _train(tmp_path, "subclassed", f"model.factory={KERAS_IO}:subclassed")
    assert not (run_dir / "model.keras").exists()
    for fmt in ["saved_model", "onnx"] if HAS_ONNX else ["saved_model"]:
        _assert_predicts_like_the_run(run_dir, fmt, _exports(run_dir, fmt))


@pytest.mark.processes
@pytest.mark.skipif(not binding.has_keras3(), reason="mixed_float16's LiteRT case is Keras 3's")
def test_a_mixed_float16_model_exports_within_its_tolerance(tmp_path) -> None:
    """mixed_float16: SavedModel and ONNX within 1e-2; LiteRT, which would need TensorFlow's
    own (Flex) ops, refused in one line."""
    run_dir = _train(tmp_path, "mixed", "runtime.mixed_precision=mixed_float16")
    for fmt in ["saved_model", "onnx"] if HAS_ONNX else ["saved_model"]:
        _assert_predicts_like_the_run(run_dir, fmt, _exports(run_dir, fmt))
    proc = _export(run_dir, "--format", "litert")
    assert proc.returncode == 1, proc.stderr[-3000:]
    [line] = [s for s in proc.stderr.splitlines() if s.startswith("hvd_train: error:")]
    assert "does not run in LiteRT" in line and "Flex" in line, line
    assert not (run_dir / "export" / "model.tflite").exists()
    assert not list((run_dir / "export").glob("*.partial*"))


@pytest.mark.processes
def test_a_tf_keras_run_exports_every_format(tmp_path) -> None:
    """A tf_keras run exports every format (through TensorFlow's converters and tf2onnx)."""
    run_dir = _train(tmp_path, "k2", "runtime.keras=tf_keras")
    for fmt in FORMATS if HAS_ONNX else ["saved_model", "litert"]:
        _assert_predicts_like_the_run(run_dir, fmt, _exports(run_dir, fmt))


@pytest.mark.processes
def test_a_checkpoint_of_a_run_that_did_not_complete_exports(trained, tmp_path) -> None:
    """A run that did not complete is refused, and its checkpoint exports with --model."""
    copy = tmp_path / "stopped"
    shutil.copytree(trained, copy, ignore=shutil.ignore_patterns("export", "logs"))
    summary = json.loads((copy / "summary.json").read_text())
    (copy / "summary.json").write_text(json.dumps({**summary, "status": "interrupted"}))
    assert _export(copy).returncode == 2
    [ckpt] = (copy / "checkpoints").glob("ckpt-*")
    proc = check(_export(copy, "--model", str(ckpt)))
    assert f"exported {ckpt} as saved_model" in proc.stdout, proc.stdout
    _assert_predicts_like_the_run(copy, "saved_model", copy / "export" / "saved_model")


def _refused(args: list[str], capsys) -> str:
    """Runs the command in this process (each refusal comes before TensorFlow loads)."""
    assert cli.main(["export", *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def _a_run(root: pathlib.Path, status: str) -> pathlib.Path:
    """A run folder's config and summary, as a run leaves them."""
    root.mkdir()
    shutil.copy(QUICKSTART, root / "config.yaml")
    (root / "summary.json").write_text(json.dumps({"status": status}))
    return root


def test_bad_input_exits_2_in_one_line(tmp_path, capsys, monkeypatch) -> None:
    assert "not a run's folder" in _refused([str(tmp_path / "nope")], capsys)
    running = _a_run(tmp_path / "running", "running")
    assert "has not completed (status: running)" in _refused([str(running)], capsys)
    done = _a_run(tmp_path / "done", "completed")
    assert "expected one of saved_model, onnx, litert; got 'pt'" in _refused(
        [str(done), "--format", "pt"], capsys
    )
    (tmp_path / "mine.onnx").mkdir()
    assert (
        "is not an export of --format onnx"
        in _refused([str(done), "--format", "onnx", "--out", str(tmp_path / "mine.onnx")], capsys)
        or not HAS_ONNX
    )
    real = importlib.util.find_spec
    monkeypatch.setattr(
        export_command.importlib.util, "find_spec",
        lambda name, *a: None if name == "onnxruntime" else real(name, *a),
    )  # fmt: skip
    line = _refused([str(done), "--format", "onnx"], capsys)
    assert "needs onnxruntime, not installed" in line and "hvd_train[export]" in line, line
