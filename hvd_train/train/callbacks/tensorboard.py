"""Keras' TensorBoard callback, made from the active Keras' class, with the bookkeeping under
its own tags; and the check that the tensorboard package is there."""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import tensorflow as tf

from hvd_train.base.errors import UserError
from hvd_train.config import LoggingConfig
from hvd_train.runtime.keras import binding
from hvd_train.train.callbacks.bookkeeping import BOOKKEEPING_TAGS, without_bookkeeping


def TensorBoard(log_dir: str) -> Any:  # noqa: N802 - a callback class to its callers
    """Keras' TensorBoard callback, with the bookkeeping under `BOOKKEEPING_TAGS` (rank 0)."""
    return _tensorboard_class(binding.keras())(log_dir, profile_batch=0)


@functools.cache
def _tensorboard_class(keras: ModuleType) -> type:
    class TensorBoard(keras.callbacks.TensorBoard):
        # Epoch summaries only (update_freq "epoch", no profiling): at a batch's end it has
        # nothing to do but write the model's graph, once; with the logs left as tensors.
        _supports_tf_logs = True

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            if self._should_write_train_graph:
                super().on_train_batch_end(batch, logs)

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            logs = logs or {}
            super().on_epoch_end(epoch, without_bookkeeping(logs))
            # Keras' own "train" writer: one event file per run folder, which TensorBoard reads
            # as it grows (a second writer's file there would stop the first being re-read).
            with tf.summary.record_if(True), self._train_writer.as_default():
                for key, tag in BOOKKEEPING_TAGS.items():
                    if key in logs:
                        tf.summary.scalar(tag, logs[key], step=epoch)

    return TensorBoard


def require_tensorboard(logs: LoggingConfig) -> None:
    """`logging.tensorboard: true` without the tensorboard package (TensorFlow 2.21 no longer
    installs it; scripts/install.sh does) would fail at the first summary, after the first
    epoch: one line before training instead, on every rank."""
    import importlib.util

    if logs.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise UserError(
            f"logging.tensorboard is true, but the tensorboard package is not installed (TensorFlow "
            f"{tf.__version__} does not bring it): pip install tensorboard, or set "
            "logging.tensorboard: false"
        )
