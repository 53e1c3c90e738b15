"""XLA once TensorFlow is imported, before Horovod's library loads: the decision
base/xla_env.py made before the import, checked against the GPUs TensorFlow sees, and XLA
auto-clustering where the whole train step is not compiled."""

from __future__ import annotations

import tensorflow as tf

from hvd_train.base import xla_env


def prepare(jit_compile: bool) -> None:
    """After TensorFlow is imported, before Horovod's library loads: `xla_env.environment` for
    the GPUs TensorFlow sees (where the commands' guess before the import was wrong, or a caller
    imported TensorFlow first), and XLA auto-clustering where the whole step is not compiled."""
    if not jit_compile:
        return
    gpu = gpu_visible()
    xla_env.environment(jit_compile, gpu)
    if not xla_env.whole_step(jit_compile, gpu):
        _autoclustering()


def gpu_visible() -> bool:
    """Whether TensorFlow sees a GPU (it only lists them: nothing is initialised)."""
    return bool(tf.config.list_physical_devices("GPU"))


def _autoclustering() -> None:
    """XLA auto-clustering of the step's ops (on CPU too), the all-reduce left outside."""
    tf.config.optimizer.set_jit("autoclustering")
