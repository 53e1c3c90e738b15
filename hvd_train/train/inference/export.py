"""`hvd-train export`: the trained model written for serving, then checked as it was written.

The model is the one evaluate and predict use (trained_model.py: the run's file, or its factory
given the weights). The export takes what the run's data pipeline gives the model (`images`:
a batch of the validation split's shape and dtype, preprocessing that is part of the model
included) and is written by the binding's Keras (Keras 3's `model.export`; tf_keras through
TensorFlow's own converters). It is written beside --out first, loaded back with its own
runtime, and moved to --out only when its predictions on a batch of the validation split match
the trained model's within `TOLERANCE`.
"""

from __future__ import annotations

import os
import re
import shutil
import warnings

import numpy as np
import tensorflow as tf

from hvd_train.base.errors import ExportError, UserError
from hvd_train.config import Config
from hvd_train.data.pipeline import batch_shard
from hvd_train.runtime import distributed
from hvd_train.runtime.keras import binding
from hvd_train.train.inference.evaluate import validation_source
from hvd_train.train.inference.trained_model import check_inputs, first_line, start_inference

# (atol, rtol) the export's outputs may differ by from the trained model's, elementwise:
# |export - model| <= atol + rtol * |model|. Runtimes fuse and reorder float32 sums (measured
# up to 1e-7 on the quickstart's probabilities); 16-bit compute rounds each sum again.
TOLERANCE = {"none": (1e-4, 1e-4), "mixed_float16": (1e-2, 1e-2), "mixed_bfloat16": (5e-2, 5e-2)}
INPUT_NAME = "images"  # the serving signature's input


def export(cfg: Config, model_path: str, fmt: str, out: str, batch: int) -> float:
    """Writes `out` and returns the largest difference from the trained model's outputs.

    Raises:
        ExportError: the export does not load back, or its predictions differ.
    """
    model, model_path, _ = start_inference(cfg, model_path, batch)
    if distributed.size() > 1:
        raise UserError("export runs alone, not under horovodrun: it writes one file")
    x = _validation_batch(cfg, model, model_path, batch)
    want = _outputs(model(x, training=False))
    spec = tf.TensorSpec((None, *x.shape[1:]), x.dtype, name=INPUT_NAME)
    partial = _partial(out)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    _remove(partial)
    try:
        binding.of(model).export(model, partial, fmt, spec)
        got = RUNTIMES[fmt](partial, x.numpy())
        diff = _compare(got, want, cfg.runtime.mixed_precision, fmt)
        _remove(out)
        os.replace(partial, out)
    finally:
        _remove(partial)
    distributed.log(
        f"exported {model_path} as {fmt}: {len(want)} validation examples predicted alike "
        f"(max abs difference {diff:.2e}); wrote {out}"
    )
    return diff


def _validation_batch(cfg: Config, model, model_path: str, batch: int) -> tf.Tensor:
    """The first `batch` examples of the validation split, as training gives them the model."""
    source = validation_source(cfg)
    check_inputs(model, source.input_shape, model_path, "the validation split")
    data, _ = batch_shard(source, min(batch, len(source.x_val)), 0, 1)
    x, _, _ = next(iter(data))
    return x


def _outputs(y) -> np.ndarray:
    return np.asarray(tf.cast(y, tf.float32))


def _compare(got: np.ndarray, want: np.ndarray, precision: str, fmt: str) -> float:
    """The largest |got - want|; ExportError when an element is outside `TOLERANCE`."""
    atol, rtol = TOLERANCE[precision]
    got = np.asarray(got, np.float32)
    if got.shape != want.shape:
        raise ExportError(
            f"the {fmt} export gives outputs of shape {list(got.shape)}, the trained model "
            f"{list(want.shape)}; nothing written"
        )
    diff = np.abs(got - want)
    if not np.all(diff <= atol + rtol * np.abs(want)) or not np.all(np.isfinite(got)):
        raise ExportError(
            f"the {fmt} export's predictions differ from the trained model's by up to "
            f"{np.nanmax(diff):.3g} (tolerance {atol:g} + {rtol:g} x |output|, "
            f"runtime.mixed_precision: {precision}); nothing written"
        )
    return float(diff.max())


# --------------------------------------------------------------------------- the runtimes


def _saved_model(path: str, x: np.ndarray) -> np.ndarray:
    """TF Serving's view: the SavedModel's `serving_default` signature."""
    serve = tf.saved_model.load(path).signatures["serving_default"]
    (y,) = serve(**{INPUT_NAME: tf.constant(x)}).values()
    return y.numpy()


def _onnx(path: str, x: np.ndarray) -> np.ndarray:
    import onnxruntime

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def _litert(path: str, x: np.ndarray) -> np.ndarray:
    """TensorFlow's own LiteRT (TFLite) interpreter; the standalone ai-edge-litert is its
    successor, with the same interface."""
    with warnings.catch_warnings():  # its deprecation notice, in favour of ai-edge-litert
        warnings.simplefilter("ignore")
        interpreter = tf.lite.Interpreter(model_path=path)
    first = interpreter.get_input_details()[0]
    interpreter.resize_tensor_input(first["index"], x.shape)
    try:
        interpreter.allocate_tensors()
    except RuntimeError as e:  # converted with TensorFlow's own ops (Flex), which it has not
        flex = sorted(set(re.findall(r"\b(Flex\w+)", str(e)))) or [first_line(e)]
        raise ExportError(
            f"the litert export does not run in LiteRT: it needs TensorFlow ops LiteRT has not "
            f"({', '.join(flex)}; a mixed_float16 model converts to some); export saved_model "
            "or onnx; nothing written"
        ) from None
    interpreter.set_tensor(first["index"], x)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


RUNTIMES = {"saved_model": _saved_model, "onnx": _onnx, "litert": _litert}


def _partial(out: str) -> str:
    """Where the export is written before it is checked: beside `out`, its suffix kept (Keras
    3 wants `.tflite`)."""
    root, ext = os.path.splitext(out)
    return f"{root}.partial{ext}"


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)
