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

import horovod.tensorflow as _hvd
import tensorflow as tf
from horovod.common.elastic import ObjectState
from horovod.tensorflow.elastic import run

from hvd_train.runtime import replicas
from hvd_train.runtime.keras import v3 as _core
from hvd_train.runtime.keras.v3 import keras  # the binding's Keras 3

__all__ = [
    "KerasState", "CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback",
    "run",
]  # fmt: skip


class KerasState(ObjectState):
    """A Keras 3 model's and its optimizer's variables, and the properties given as keywords
    (`batch=0, epoch=0`), kept in memory at each `commit()`, restored on every rank after a
    worker fails, and synchronized from rank 0 when workers join (Horovod's
    TensorFlowKerasState, which reads Keras 2's `optimizer.variables()`).

    The optimizer is built at once if it is not yet, so that its slots exist on every rank
    before the first synchronization. The dropout layers' seed states are each rank's own.

    Raises:
        ValueError: a model that is not built yet (as Horovod's).
    """

    def __init__(self, model: keras.Model, optimizer: Any = None, backend: Any = None, **kwargs):
        if not model.built:
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")
        self.model = model
        self.optimizer = optimizer or model.optimizer
        if self.optimizer is not None and not self.optimizer.built:
            self.optimizer.build(model.trainable_variables)
        self._save_model()
        super().__init__(bcast_object=_hvd.broadcast_object, get_rank=_hvd.rank, **kwargs)

    def _variables(self) -> list[tf.Variable]:
        """The model's variables (less each rank's own random states) and the optimizer's."""
        own = {id(replicas.tf_variable(v)) for v in _core.random_states(self.model)}
        found = [replicas.tf_variable(v) for v in self.model.variables]
        if self.optimizer is not None:
            found += [replicas.tf_variable(v) for v in self.optimizer.variables]
        return [v for v in found if v is not None and id(v) not in own]

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        for variable, saved in zip(self._variables(), self._saved, strict=True):
            variable.assign(saved)
        super().restore()

    def sync(self) -> None:
        if _hvd.size() > 1:
            _hvd.broadcast_variables(self._variables(), root_rank=0)
        self._save_model()
        super().sync()

    def _save_model(self) -> None:
        self._saved = [tf.identity(v) for v in self._variables()]


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
