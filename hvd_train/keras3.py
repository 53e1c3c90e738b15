"""Horovod for your own Keras 3 `model.fit` script: what `horovod.tensorflow.keras` is to Keras 2.

Shorter names over hvd_train.horovod, which is Horovod's Keras API under Horovod's own names
on Keras 3 (docs/horovod.md: a Horovod script changes its import line and runs)::

    import keras
    from hvd_train import keras3 as hvdk

    hvdk.init()                                      # first: Horovod, and this worker's GPU
    model = ...                                      # hvdk.SyncBatchNormalization() in place of
                                                     # BatchNormalization, where wanted
    lr = hvdk.warmup(1e-3, warmup_steps=500)         # 1e-3 x workers after 500 steps
    model.compile(hvdk.DistributedOptimizer(keras.optimizers.Adam(lr)), loss,
                  metrics=["accuracy"], jit_compile=False)
    model.fit(x_shard, y_shard, callbacks=[hvdk.BroadcastInitialState(), hvdk.MetricAverage()],
              verbose=2 if hvdk.rank() == 0 else 0)
    if hvdk.rank() == 0:
        hvdk.plain_model(model).save("model.keras")  # loads without hvd_train or Horovod

    horovodrun -np 2 -H localhost:2 --gloo python train.py

examples/keras3_fit.py is such a script, docs/models.md the guide. Each worker must run the
same number of steps (give every worker an equal shard), or the others wait for it forever.

Importing this module imports TensorFlow, Keras 3 and Horovod, and chooses no Keras for the
rest of hvd_train. On TensorFlow 2.15 (no Keras 3) it fails with one ImportError line.
"""

from __future__ import annotations

from typing import Any

from hvd_train.runtime.keras import binding

binding.require_keras3("hvd_train.keras3")

from hvd_train.horovod import (  # noqa: E402
    Compression,
    SyncBatchNormalization,
    local_rank,
    rank,
    size,
)
from hvd_train.horovod import DistributedOptimizer as _HorovodsOptimizer  # noqa: E402
from hvd_train.horovod.callbacks import (  # noqa: E402
    BroadcastGlobalVariablesCallback,
    MetricAverageCallback,
)
from hvd_train.runtime.distributed import is_chief  # noqa: E402
from hvd_train.runtime.keras.v3 import init, warmup  # noqa: E402
from hvd_train.train.models import plain_clone  # noqa: E402

__all__ = [
    "init",
    "rank",
    "size",
    "local_rank",
    "is_chief",
    "DistributedOptimizer",
    "BroadcastInitialState",
    "MetricAverage",
    "warmup",
    "SyncBatchNormalization",
    "plain_model",
]


def DistributedOptimizer(optimizer: Any, fp16: bool = False, accumulation: int = 1) -> Any:  # noqa: N802
    """hvd_train.horovod's DistributedOptimizer under shorter arguments: `fp16` sends the
    gradients as float16 (`compression=Compression.fp16`); `accumulation` sums that many
    batches' gradients locally per all-reduce and applies their mean
    (`backward_passes_per_step` with `average_aggregated_gradients=True`)."""
    return _HorovodsOptimizer(
        optimizer, compression=Compression.fp16 if fp16 else Compression.none,
        backward_passes_per_step=accumulation, average_aggregated_gradients=True,
    )  # fmt: skip


class BroadcastInitialState(BroadcastGlobalVariablesCallback):
    """hvd_train.horovod.callbacks.BroadcastGlobalVariablesCallback(0): rank 0's weights and
    optimizer state to every rank when training begins (put it first in `fit`'s callbacks)."""

    def __init__(self) -> None:
        super().__init__(0)


class MetricAverage(MetricAverageCallback):
    """hvd_train.horovod.callbacks.MetricAverageCallback(): the epoch's logs averaged over the
    workers (after the broadcast, before the callbacks that read metrics)."""


def plain_model(model: Any) -> Any:
    """A copy of `model` (same weights, no optimizer) with every SyncBatchNormalization turned
    back into Keras' BatchNormalization: save it, and the file loads in plain Keras 3 where
    neither hvd_train nor Horovod is installed. (`model.save` of the model itself writes
    SyncBatchNormalization, the optimizer and its warm-up schedule, which need hvd_train.keras3
    imported to load.)

    Args:
        model: a functional or Sequential Keras 3 model, nested models included.

    Raises:
        ValueError: a subclassed model, which Keras cannot clone; save it as it is.
    """
    with binding.activated(binding.KERAS3):  # this copy's Keras; the rest of hvd_train's as was
        return plain_clone(model)
