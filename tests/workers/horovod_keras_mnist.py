"""Horovod v0.28.1's examples/tensorflow2/tensorflow2_keras_mnist.py, as its user runs it on
Keras 3 with hvd_train: the same model, the same calls of Horovod's API with the same arguments.
What differs, and only that: the import line (`import hvd_train.horovod as hvd` for
`import horovod.tensorflow.keras as hvd`); what Keras 3 removed (`experimental_run_tf_function`;
ModelCheckpoint's `.h5` file, now `.keras`); local data in place of the MNIST download
(28x28 digits drawn per rank, seeded); 3 epochs of 16 // size steps in place of 24 of
500 // size. Added: each rank prints a digest of its weights at the end (the test checks that
every rank holds the same), and `OUT` is the working folder.

Usage: horovod_keras_mnist.py OUT
"""

import hashlib
import os
import sys

import numpy as np
import tensorflow as tf

import hvd_train.horovod as hvd


def local_mnist(rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Stands in for `tf.keras.datasets.mnist.load_data()`: 2048 28x28 uint8 images whose
    label is which of 10 fixed patterns each one is noise around."""
    rng = np.random.default_rng(rank)
    patterns = np.random.default_rng(1234).integers(0, 256, (10, 28, 28))
    labels = rng.integers(0, 10, 2048)
    images = np.clip(patterns[labels] + rng.normal(0, 40, (2048, 28, 28)), 0, 255)
    return images.astype(np.uint8), labels.astype(np.uint8)


def train():
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

    mnist_model = tf.keras.Sequential([
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
    opt = hvd.DistributedOptimizer(
        opt, backward_passes_per_step=1, average_aggregated_gradients=True
    )

    mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(),
                        optimizer=opt,
                        metrics=["accuracy"])  # fmt: skip

    callbacks = [
        # Horovod: broadcast initial variable states from rank 0 to all other processes.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Horovod: average metrics among workers at the end of every epoch.
        hvd.callbacks.MetricAverageCallback(),
        # Horovod: warm the learning rate up to scaled_lr over the first three epochs.
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=3, verbose=1),
    ]

    # Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
    if hvd.rank() == 0:
        callbacks.append(tf.keras.callbacks.ModelCheckpoint("./checkpoint-{epoch}.keras"))

    # Horovod: write logs on worker 0.
    verbose = 2 if hvd.rank() == 0 else 0

    # Train the model.
    # Horovod: adjust number of steps based on number of GPUs.
    mnist_model.fit(dataset, steps_per_epoch=16 // hvd.size(), callbacks=callbacks, epochs=3,
                    verbose=verbose)  # fmt: skip

    # Return the model
    return mnist_model


if __name__ == "__main__":
    os.chdir(sys.argv[1])
    model = train()
    weights = np.concatenate([np.ravel(w) for w in model.get_weights()])
    digest = hashlib.sha256(weights.tobytes()).hexdigest()[:16]
    print(f"WEIGHTS rank {hvd.rank()} {digest} lr {float(model.optimizer.learning_rate.numpy()):g}")
