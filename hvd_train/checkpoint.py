"""Saving models: atomically, and as plain Keras models that load without Horovod."""

from __future__ import annotations

import os
import shutil

import tensorflow as tf

from hvd_train.models import plain_clone


def export_plain_model(model: tf.keras.Model, path: str) -> str:
    """Writes architecture and weights, without the (Horovod-wrapped) optimizer, atomically.

    The file loads with `tf.keras.models.load_model(path)` where Horovod is not installed.
    A functional or sequential model is cloned and saved as `.keras`; a subclassed model, which
    cannot be cloned, is saved as a SavedModel folder (`path` without `.keras`). A crash during
    the write leaves any previous file at `path` as it was. Returns the path written.
    """
    try:
        plain = plain_clone(model)  # Horovod's SyncBatchNormalization back to plain Keras
    except ValueError:  # subclassed model
        target = path.removesuffix(".keras")
        _atomic(target, lambda tmp: model.save(tmp, save_format="tf", include_optimizer=False))
        return target
    _atomic(path, lambda tmp: plain.save(tmp))
    return path


def _atomic(path: str, write) -> None:
    """`write(tmp)` next to `path`, then rename over it: readers see the old or the new, whole."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    suffix = ".keras" if path.endswith(".keras") else ""
    tmp = f"{path.removesuffix(suffix)}.tmp-{os.getpid()}{suffix}"
    try:
        write(tmp)
        if os.path.isdir(path) and os.path.isdir(tmp):
            old = f"{path}.old-{os.getpid()}"
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        elif os.path.exists(tmp):
            os.remove(tmp)
