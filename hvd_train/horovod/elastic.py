"""Horovod Elastic for Keras (`horovod.tensorflow.keras.elastic`), under its names, on Keras 3.

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)

    @hvd.elastic.run
    def train(state):
        model.fit(..., initial_epoch=state.epoch, callbacks=[
            hvd.elastic.CommitStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
            hvd.elastic.UpdateEpochStateCallback(state)])

    train(state)

Launched with `horovodrun -np N --min-np M --max-np N --host-discovery-script S`.
"""

from __future__ import annotations

from typing import Any

from horovod.tensorflow.elastic import run

from hvd_train.runtime import replicas
from hvd_train.runtime.keras.v3 import keras  # the binding's Keras 3

__all__ = [
    "KerasState", "CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback",
    "run",
]  # fmt: skip


# Horovod's TensorFlowKerasState, which reads Keras 2's `optimizer.variables()`: the trainer's
# state, one class (its arguments Horovod's: `KerasState(model, optimizer=None, **kwargs)`).
KerasState = replicas.ElasticState


class CommitStateCallback(keras.callbacks.Callback):
    """`state.commit()` every `batches_per_commit` batches and at each epoch's end."""

    def __init__(self, state: Any, batches_per_commit: int = 1):
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.batches_remaining = self.batches_per_commit  # alike on every rank after a reset

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """`state.batch`: the batch within the epoch; after a reset the epoch runs only the batches
    it has left (`params["steps"]` shortened, as Horovod's does)."""

    def __init__(self, state: Any):
        super().__init__()
        self.state = state
        self.steps_per_epoch: int | None = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self.params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = self.params["steps"]
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.state.batch = batch

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """`state.epoch`: the epochs done, counted across resets."""

    def __init__(self, state: Any):
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.epoch = self.initial_epoch + epoch + 1
