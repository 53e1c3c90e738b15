"""Your own Keras 3 `model.fit` script on Horovod, with hvd_train.keras3 (docs/models.md).

From the repository root: horovodrun -np 2 -H localhost:2 --gloo python examples/keras3_fit.py
"""

import keras

from hvd_train import keras3 as hvdk
from hvd_train.data import digits

hvdk.init()  # Horovod: start, and one GPU per worker (by local rank) where there are GPUs
x, y = digits.load()  # 8x8 digits shipped with hvd_train: nothing downloaded
batch = 32
steps = len(x) // (batch * hvdk.size())  # Horovod: as many full batches on every worker
shard = slice(hvdk.rank(), steps * batch * hvdk.size(), hvdk.size())  # each worker its own examples
x, y = x[shard] / 16.0, y[shard]
model = keras.Sequential([
    keras.Input((8, 8)), keras.layers.Flatten(), keras.layers.Dense(128, use_bias=False),
    hvdk.SyncBatchNormalization(),  # Horovod: batch statistics of the global batch
    keras.layers.ReLU(), keras.layers.Dropout(0.2), keras.layers.Dense(10, activation="softmax"),
])  # fmt: skip
# Horovod: the rate x workers, reached over 2 epochs; the gradients averaged over the workers
lr = hvdk.warmup(1e-3, warmup_steps=2 * steps)
optimizer = hvdk.DistributedOptimizer(keras.optimizers.Adam(lr))
# Horovod: no XLA around the all-reduce (jit_compile's "auto" means XLA on a GPU)
model.compile(optimizer, "sparse_categorical_crossentropy", metrics=["accuracy"], jit_compile=False)
callbacks = [hvdk.BroadcastInitialState(), hvdk.MetricAverage()]  # Horovod: first, in this order
verbose = 2 if hvdk.rank() == 0 else 0  # Horovod: rank 0 prints
model.fit(x, y, batch_size=batch, epochs=4, callbacks=callbacks, verbose=verbose)
if hvdk.rank() == 0:  # SyncBatchNormalization back to Keras' own: loads without hvd_train
    hvdk.plain_model(model).save("keras3_fit.keras")
