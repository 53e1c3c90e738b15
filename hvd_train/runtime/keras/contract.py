"""The contract of a Keras binding: what the rest of hvd_train asks `binding.active()` for,
the type `active()` returns, and `Model`, the type hvd_train gives a Keras model.

Both bindings (v3.py for Keras 3, v2.py for tf_keras and TensorFlow 2.15's tf.keras)
are modules that satisfy `KerasBinding`; tests/test_replicas.py checks each against it, as
Keras checks every backend against one op list. A function added to one binding and used
through `active()` belongs here, or the other binding may lack it.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Protocol, runtime_checkable

Model = Any  # a Keras model of the active Keras (3, or 2): either binding's, so not typed


@runtime_checkable
class KerasBinding(Protocol):
    """The functions and constants one Keras binding module provides."""

    NAME: str  # binding.KERAS3 or binding.KERAS2
    keras: ModuleType  # the binding's Keras
    SUBCLASSED_AS_KERAS: bool  # a subclassed model is exported as .keras (else a SavedModel)
    SyncBatchNormalization: type  # batch statistics of the global batch

    def describe(self) -> str:
        """summary.json's `versions.keras`."""

    def seed(self, value: int) -> None:
        """The global seeds the Keras draws from."""

    def set_precision(self, policy: str) -> None:
        """The global dtype policy of the layers built from now on."""

    def distributed_optimizer(
        self, optimizer: Any, fp16: bool, accumulation: int, loss_scale: bool
    ) -> Any:
        """`optimizer`, averaging its gradients over the workers (and loss-scaled)."""

    def inner_optimizer(self, optimizer: Any) -> Any:
        """The optimizer under mixed_float16's loss scaler."""

    def build_for_training(
        self, model: Any, input_shape: tuple[int, ...], num_classes: int
    ) -> None:
        """The optimizer's, loss's and metrics' variables before the first step."""

    # The replicated state (runtime/replicas.py) and each rank's own.
    def checkpoint(self, model: Any) -> Any:
        """The tf.train.Checkpoint a resumable checkpoint writes: it defines the replicated
        state."""

    def broadcast_model(self, model: Any) -> None:
        """Rank 0's replicated state on every rank (a collective)."""

    def broadcast_callback(self) -> Any:
        """The callback that broadcasts again after the first batch."""

    def random_states(self, model: Any) -> list[Any]:
        """Each rank's own random states (dropout generators)."""

    def rank_random_state(self, state: Any, rank: int) -> Any:
        """A random state moved to `rank`'s own stream."""

    def moving_statistics(self, model: Any) -> list[Any]:
        """BatchNormalization's moving statistics that are each rank's own."""

    def accumulation_sums(self, model: Any) -> tuple[Any, ...]:
        """Each rank's running gradient sums of the accumulation window."""

    def mid_window(self, model: Any) -> bool:
        """Whether the accumulation window is part-way."""

    def start_window(self, model: Any, restart: bool = False) -> None:
        """The window's position after a restore and broadcast; `restart`: from its start."""

    def fit_callbacks(
        self, callbacks: list[Any], model: Any, verbose: int, epochs: int, steps: int
    ) -> Any:
        """`fit`'s `callbacks=`, which gives the callbacks that take tensor logs tensors."""

    def metric_average_callback(self) -> Any:
        """The callback that averages the epoch's metrics over the workers."""

    def last_learning_rate(self, optimizer: Any) -> float:
        """The rate the optimizer's last step used."""

    def per_example_loss(self, from_logits: bool) -> Any:
        """The sparse categorical cross-entropy of each example."""

    def save_plain(self, model: Any, path: str) -> None:
        """Writes a plain clone of the model."""

    def save_subclassed(self, model: Any, path: str) -> None:
        """Writes a subclassed model."""

    def load_model(self, path: str) -> Any:
        """A saved model, uncompiled."""

    def export(self, model: Any, path: str, fmt: str, spec: Any) -> None:
        """Writes `model` for serving: saved_model, onnx or litert, taking `spec`."""

    def elastic_state(self, model: Any, **position: Any) -> Any:
        """Horovod Elastic's state: the replicated state and the run's position."""
