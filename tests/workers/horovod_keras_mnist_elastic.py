"""Horovod v0.28.1's examples/elastic/tensorflow2/tensorflow2_keras_mnist_elastic.py, as its user
runs it on Keras 3 with hvd_train: the same model, the same calls of Horovod's API with the same
arguments. What differs, and only that: the import line (`import hvd_train.horovod as hvd`);
what Keras 3 removed (`experimental_run_tf_function`; `tf.keras.backend.set_value(
optimizer.lr, ...)`, now `optimizer.learning_rate.assign(...)`; ModelCheckpoint's `.h5`, now
`.keras`); local data in place of the MNIST download (tests/workers/horovod_keras_mnist.py's);
3 epochs of 16 // size steps in place of 24 of 500 // size. Added: each rank prints a digest of
its weights at the end, and the working folder is the first argument.

Usage: horovod_keras_mnist_elastic.py OUT [--use-mixed-precision]
"""

import argparse
import hashlib
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from horovod_keras_mnist import local_mnist

import hvd_train.horovod as hvd

parser = argparse.ArgumentParser(description="Tensorflow 2.0 Keras MNIST Example")
parser.add_argument("out")
parser.add_argument("--use-mixed-precision", action="store_true", default=False,
                    help="use mixed precision for training")  # fmt: skip
args = parser.parse_args()
os.chdir(args.out)

if args.use_mixed_precision:
    from tensorflow.keras import mixed_precision

    mixed_precision.set_global_policy("mixed_float16")

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process)
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

mnist_images, mnist_labels = local_mnist(hvd.rank())

dataset = tf.data.Dataset.from_tensor_slices(
    (tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32),
     tf.cast(mnist_labels, tf.int64))
)  # fmt: skip
dataset = dataset.repeat().shuffle(10000).batch(128)

model = tf.keras.Sequential([
    tf.keras.layers.Conv2D(32, [3, 3], activation="relu"),
    tf.keras.layers.Conv2D(64, [3, 3], activation="relu"),
    tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
    tf.keras.layers.Dropout(0.25),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(128, activation="relu"),
    tf.keras.layers.Dropout(0.5),
    tf.keras.layers.Dense(10, activation="softmax"),
])  # fmt: skip

# Horovod: adjust learning rate based on number of GPUs.
scaled_lr = 0.001 * hvd.size()
opt = tf.optimizers.Adam(scaled_lr)

# Horovod: add Horovod DistributedOptimizer.
opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1, average_aggregated_gradients=True)

model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt,
              metrics=["accuracy"])  # fmt: skip

# Horovod: initialize optimizer state so we can synchronize across workers
model.fit(dataset, steps_per_epoch=1, epochs=1, callbacks=None, verbose=0)

state = hvd.elastic.KerasState(model, batch=0, epoch=0)


def on_state_reset():
    state.model.optimizer.learning_rate.assign(0.001 * hvd.size())
    # Re-initialize, to join with possible new ranks
    state.model.fit(dataset, steps_per_epoch=1, epochs=1, callbacks=None, verbose=0)


state.register_reset_callbacks([on_state_reset])

callbacks = [
    hvd.elastic.UpdateEpochStateCallback(state),
    hvd.elastic.UpdateBatchStateCallback(state),
    hvd.elastic.CommitStateCallback(state),
]

# Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
if hvd.rank() == 0:
    callbacks.append(tf.keras.callbacks.ModelCheckpoint("./checkpoint-{epoch}.keras"))


# Train the model.
# Horovod: adjust number of steps based on number of GPUs.
@hvd.elastic.run
def train(state):
    state.model.fit(dataset, steps_per_epoch=16 // hvd.size(), epochs=3 - state.epoch,
                    callbacks=callbacks, verbose=2 if hvd.rank() == 0 else 0)  # fmt: skip


train(state)
weights = np.concatenate([np.ravel(w) for w in model.get_weights()])
digest = hashlib.sha256(weights.tobytes()).hexdigest()[:16]
print(f"WEIGHTS rank {hvd.rank()} {digest} epoch {state.epoch}", flush=True)
