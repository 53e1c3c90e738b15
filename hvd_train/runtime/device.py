"""TensorFlow held to the device base/device_choice.py chose for this worker before TensorFlow
was imported: a GPU it must train on and TensorFlow does not see ends the worker in one line."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hvd_train.base import device_choice, gpus
from hvd_train.base.errors import DeviceError


def require(choice: str) -> None:
    """After TensorFlow is imported, before it runs anything: raises DeviceError where this
    worker must train on a GPU (`device_choice.expects_gpu`, from what nvidia-smi lists for it
    now) and TensorFlow sees none. Where TensorFlow sees one, nvidia-smi is not asked."""
    if choice == "cpu" or tf.config.list_physical_devices("GPU"):
        return
    listed = len(gpus.devices())
    if device_choice.expects_gpu(choice, listed):
        why = device_choice.unusable(choice, listed, tf.__version__, build_info())
        raise DeviceError(why)


def build_info() -> dict[str, Any]:
    """tf.sysconfig.get_build_info(): whether TensorFlow was built for CUDA, and which."""
    try:
        return dict(tf.sysconfig.get_build_info())
    except Exception:  # noqa: BLE001 - a diagnosis must not hide the error it explains
        return {}
