"""keras_io_models.py's models as the same guides wrote them for Keras 2 (`import tf_keras as
keras`: tensorflow.org/guide/keras, the guides' TensorFlow 2 versions), as `model.factory`
functions. What differs is Keras 2's own API: the custom step applies its gradients with
`self.optimizer.apply_gradients(zip(...))` and uses `self.compiled_loss` and
`self.compiled_metrics` ("Customizing what happens in fit()", tensorflow.org/guide/keras/
customizing_what_happens_in_fit); the subclassed model and the Lambda are as in Keras 3.
"""

import tensorflow as tf
import tf_keras as keras
from tf_keras import layers


class Classifier(keras.Model):
    def __init__(self, hidden_units, num_classes, name="classifier", **kwargs):
        super().__init__(name=name, **kwargs)
        self.flatten = layers.Flatten()
        self.hidden = layers.Dense(hidden_units, activation="relu")
        self.out = layers.Dense(num_classes, activation="softmax")

    def call(self, inputs):
        return self.out(self.hidden(self.flatten(inputs)))


def subclassed(cfg, input_shape, num_classes):
    return Classifier(32, num_classes)


class CustomModel(keras.Model):
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compiled_loss(y, y_pred, regularization_losses=self.losses)
        trainable_vars = self.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)
        self.optimizer.apply_gradients(zip(gradients, trainable_vars))  # noqa: B905 - the guide
        self.compiled_metrics.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


def custom_train_step(cfg, input_shape, num_classes):
    inputs = keras.Input(shape=input_shape)
    x = layers.Flatten()(inputs)
    x = layers.Dense(32, activation="relu")(x)
    outputs = layers.Dense(num_classes, activation="softmax")(x)
    return CustomModel(inputs, outputs)


def with_lambda(cfg, input_shape, num_classes):
    inputs = keras.Input(shape=input_shape)
    x = layers.Lambda(lambda t: t * 2.0 - 1.0)(inputs)
    x = layers.Flatten()(x)
    x = layers.Dense(32, activation="relu")(x)
    outputs = layers.Dense(num_classes, activation="softmax")(x)
    return keras.Model(inputs, outputs)


def augmented(cfg, input_shape, num_classes):
    data_augmentation = keras.Sequential(
        [layers.RandomFlip("horizontal"), layers.RandomRotation(0.1)]
    )
    inputs = keras.Input(shape=input_shape)
    x = data_augmentation(inputs)
    x = layers.Flatten()(x)
    x = layers.Dense(32, activation="relu")(x)
    outputs = layers.Dense(num_classes, activation="softmax")(x)
    return keras.Model(inputs, outputs)


def custom_train_step_float64(cfg, input_shape, num_classes):
    """`custom_train_step` computing in float64, for an exact comparison of runs that differ
    only in the order of a sum (tests/workers/float64_models.py says why)."""
    inputs = keras.Input(shape=input_shape, dtype="float64")
    x = layers.Flatten(dtype="float64")(inputs)
    x = layers.Dense(32, activation="relu", dtype="float64")(x)
    outputs = layers.Dense(num_classes, activation="softmax", dtype="float64")(x)
    return CustomModel(inputs, outputs)
