"""Horovod for your own Keras 3 `model.fit` script: what `horovod.tensorflow.keras` is to Keras 2.

Horovod's own Keras API cannot train Keras 3 (its callbacks call `.ref()` on Keras 3 variables,
horovod#4290); these are the pieces hvd_train's trainer uses, on `horovod.tensorflow`'s ops::

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

from hvd_train.runtime import binding

if not binding.has_keras3():
    _tf = binding.installed_tensorflow()
    raise ImportError(
        "hvd_train.keras3 needs Keras 3, which comes with TensorFlow 2.16 or later; "
        + (f"this is TensorFlow {_tf}" if _tf else "TensorFlow is not installed")
        + ": for tf.keras (Keras 2) use horovod.tensorflow.keras"
    )

from hvd_train.runtime.distributed import is_chief, local_rank, rank, size  # noqa: E402
from hvd_train.runtime.keras3 import (  # noqa: E402
    BroadcastInitialState,
    DistributedOptimizer,
    MetricAverage,
    SyncBatchNormalization,
    init,
    warmup,
)
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
