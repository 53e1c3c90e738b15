"""Horovod for your own Keras 3 `model.fit` script: what `horovod.tensorflow.keras` is to Keras 2.

Shorter names for the pieces of hvd_train.horovod, which is Horovod's Keras API under
Horovod's own names on Keras 3 (docs/horovod.md: a Horovod script changes its import line and
runs). An alias module: each name here is the object the trainer and hvd_train.horovod use, and
nothing is defined here (docs/horovod.md's first table says which name is which)::

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

from hvd_train.runtime.keras import binding

binding.require_keras3("hvd_train.keras3")

from hvd_train.horovod import SyncBatchNormalization, local_rank, rank, size  # noqa: E402
from hvd_train.runtime.distributed import is_chief  # noqa: E402
from hvd_train.runtime.keras.v3 import (  # noqa: E402
    BroadcastInitialState,
    DistributedOptimizer,
    MetricAverage,
    init,
    warmup,
)
from hvd_train.train.models import plain_model  # noqa: E402

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
