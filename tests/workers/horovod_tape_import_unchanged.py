"""Horovod v0.28.1's examples/tensorflow2/tensorflow2_mnist.py training step with its import
unchanged (`import horovod.tensorflow as hvd`), on Keras 3: Horovod's tape cannot key Keras 3
variables by `.ref()`, and the patched Horovod says so in one line naming hvd_train.horovod
(patches/horovod-0.28.1/0017; run by tests/test_horovod_tape.py, one worker)."""

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

hvd.init()
mnist_model = keras.Sequential([keras.layers.Flatten(), keras.layers.Dense(10)])
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
opt = keras.optimizers.Adam(0.001 * hvd.size())


@tf.function
def training_step(images, labels, first_batch):
    with tf.GradientTape() as tape:
        probs = mnist_model(images, training=True)
        loss_value = loss(labels, probs)

    # Horovod: add Horovod Distributed GradientTape.
    tape = hvd.DistributedGradientTape(tape)

    grads = tape.gradient(loss_value, mnist_model.trainable_variables)
    opt.apply_gradients(zip(grads, mnist_model.trainable_variables, strict=False))
    if first_batch:
        hvd.broadcast_variables(mnist_model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)
    return loss_value


training_step(tf.zeros((2, 28, 28, 1)), tf.zeros((2,), tf.int64), True)
