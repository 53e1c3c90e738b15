"""hvd_train: distributed training of Keras models with Horovod, driven by one YAML config."""

from hvd_train.runtime import keras_stack

# Before anything imports TensorFlow: on TensorFlow 2.16+, tf.keras must be Keras 2 (tf_keras),
# the only Keras Horovod's Keras API works with. Reads package metadata; imports no TensorFlow.
keras_stack.select()

__version__ = "0.1.0"
