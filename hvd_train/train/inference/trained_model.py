"""The trained model that evaluate and predict use: found in run.dir or given, loaded with the
Keras that wrote it (or rebuilt from its factory and given its weights), and checked against
the config's input and classes."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import tensorflow as tf

from hvd_train.base.errors import DataError, UserError
from hvd_train.config import Config, DataConfig
from hvd_train.data.images import list_class_folders
from hvd_train.data.tfrecords import CLASSES_FILE, read_folder
from hvd_train.record.layout import RunDir
from hvd_train.runtime import distributed
from hvd_train.runtime.keras import binding
from hvd_train.train.checkpoint import PREFIX, STATE_FILE, read_state, written_by
from hvd_train.train.inference.files import MODEL_HINT
from hvd_train.train.models import build_model, import_user_module

# --------------------------------------------------------------------------- the model


def start_inference(cfg: Config, model_path: str, batch: int):
    """Horovod, devices and the model: (model, its path, training's class names)."""
    if batch < 1:
        raise UserError(f"--batch-size: expected a count >= 1, got {batch}")
    # No timeline: it would write over the run's own timeline.json.
    distributed.init(replace(cfg.horovod, timeline=False), RunDir(cfg.run.dir).timeline)
    # One compute thread per worker unless set: a float32 result can depend on how many threads
    # share a product, and the outputs must not depend on the worker count.
    threads = cfg.runtime.intra_op_threads or 1
    distributed.configure_devices(threads, cfg.runtime.inter_op_threads)
    classes = distributed.chief_computes(lambda: training_classes(cfg.data), "training_classes")
    path = model_path or exported_model(RunDir(cfg.run.dir))
    model = load_model(cfg, path, len(classes))
    outputs = _outputs(model, config_input_shape(cfg.data))
    if outputs != len(classes):
        raise DataError(
            f"--model: {path} has {outputs} outputs, but the config's data has {len(classes)} "
            f"classes ({', '.join(classes[:5])}...); use the config the model was trained with"
        )
    return model, path, classes


def load_model(cfg: Config, path: str, num_classes: int):
    """A saved Keras model (.keras, .h5, SavedModel folder) or a checkpoint folder's model.

    Raises:
        UserError: no such file, or it cannot be loaded as a model of this config.
    """
    if not os.path.exists(path):
        raise UserError(f"--model: {path} does not exist; expected {MODEL_HINT}")
    if os.path.isdir(path) and os.path.exists(os.path.join(path, f"{PREFIX}.index")):
        return _from_checkpoint(cfg, path, num_classes)
    if path.endswith(".weights.h5"):
        return _from_weights(cfg, path, num_classes)
    # Read by the Keras that wrote it (Keras 3 cannot read Keras 2's .keras, nor the reverse).
    active = binding.activate(binding.of_saved(path) or binding.resolve(cfg.runtime.keras))
    if cfg.model.factory:  # the classes its module registers with Keras, as training had them
        import_user_module(cfg.model.factory.rpartition(":")[0])
    try:
        return active.load_model(path)
    except Exception as e:  # noqa: BLE001 - Keras raises many kinds for a file it cannot read
        first = first_line(e)
        raise UserError(f"--model: cannot load {path} ({first}); expected {MODEL_HINT}") from None


def takes(model, cfg: Config) -> tuple[int, ...]:
    """One example's shape as the model takes it; a subclassed model (Keras 3) has no
    input_shape, and was built from the config's (`_from_weights`, `_from_checkpoint`)."""
    shape = getattr(model, "input_shape", None)
    return tuple(shape[1:]) if shape is not None else config_input_shape(cfg.data)


def _outputs(model, input_shape: tuple[int, ...]) -> int:
    """The model's outputs a row (Keras 3's subclassed models have no output_shape)."""
    try:
        return int(model.output_shape[-1])
    except AttributeError:
        return int(model(np.zeros((1, *input_shape), np.float32)).shape[-1])


def exported_model(run: RunDir) -> str:
    """The run's final model as training exported it: model.keras, a Keras 2 subclassed
    model's SavedModel folder, or model.weights.h5 (a model whose .keras file would not load:
    train/checkpoint.py plain_file_problem); model.keras when there is none."""
    return next((p for p in (run.model, run.model_folder, run.model_weights) if os.path.exists(p)),
                run.model)  # fmt: skip


def _from_weights(cfg: Config, path: str, num_classes: int):
    """The model the config builds (its `model.factory`: no code is read from a file, Keras'
    safe mode stays on) with the weights training exported (`*.weights.h5`)."""
    shape = config_input_shape(cfg.data)
    model = build_model(cfg, shape, num_classes)
    model(np.zeros((1, *shape), np.float32))  # a subclassed model has its weights once called
    try:
        model.load_weights(path)
    except (ValueError, OSError) as e:
        first = first_line(e)
        raise UserError(
            f"--model: {path} does not fit the config's model ({first}); use the config it was "
            "trained with"
        ) from None
    return model


def _from_checkpoint(cfg: Config, path: str, num_classes: int):
    """The config's model with a training checkpoint's weights (its optimizer state unread)."""
    try:
        binding.activate(written_by(read_state(path)))  # built by the Keras that trained it
    except (OSError, ValueError) as e:
        raise UserError(f"--model: {path}: its {STATE_FILE} is unreadable ({e})") from None
    model = build_model(cfg, config_input_shape(cfg.data), num_classes)
    try:
        status = tf.train.Checkpoint(model=model).read(os.path.join(path, PREFIX))  # no optimizer
        status.expect_partial().assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as e:
        first = first_line(e)
        raise UserError(
            f"--model: checkpoint {path} does not fit the config's model ({first}); use the "
            "config it was trained with"
        ) from None
    return model


def first_line(e: BaseException) -> str:
    """What a one-line error quotes of an exception Keras or TensorFlow raised."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def check_inputs(model, data_shape: tuple, model_path: str, data: str) -> None:
    if not hasattr(model, "input_shape"):  # subclassed (Keras 3): built from the config's shape
        return
    if tuple(model.input_shape[1:]) != tuple(data_shape):
        raise DataError(
            f"--model: {model_path} takes inputs of shape {list(model.input_shape[1:])}, but "
            f"{data} gives {list(data_shape)}; use the config the model was trained with"
        )


def image_size(shape: tuple) -> tuple[tuple[int, int], int]:
    """(height, width) and channels of a model input shape, for decoding images to it."""
    if len(shape) == 3 and shape[-1] in (1, 3):
        return (int(shape[0]), int(shape[1])), int(shape[2])
    raise DataError(
        f"the model takes inputs of shape {list(shape)}, not images of height x width x 1 or 3 "
        "channels, so it cannot read image files"
    )


# --------------------------------------------------------------------------- training's view


def training_classes(d: DataConfig) -> tuple[str, ...]:
    """The class names in training's label order (see the module docstring)."""
    if d.source == "image_folder":
        return list_class_folders(d.train_dir, "data.train_dir").class_names
    if d.source == "tfrecord":
        listed = os.path.join(d.train_dir, CLASSES_FILE)
        if not os.path.exists(listed):  # labels then name the classes: read them all
            return read_folder(d.train_dir, "data.train_dir").class_names
        with open(listed) as f:
            return tuple(line.strip() for line in f if line.strip())
    count = 10 if d.source == "digits" else d.num_classes
    return tuple(str(i) for i in range(count))


def config_input_shape(d: DataConfig) -> tuple[int, ...]:
    """The input shape training gives the model for this config's data."""
    if d.source == "digits":
        return (8, 8, 1)
    return tuple(d.image_size) + ((d.channels,) if len(d.image_size) == 2 else ())
