"""Models as keras.io's guides write them, as `model.factory` functions (Keras 3).

Each mirrors a guide's way of writing a model, not its exact network (the guides' networks
are for other data); none registers its class or writes `get_config`, as the guides do not:

- `subclassed`: "Making new layers and models via subclassing"
  (keras.io/guides/making_new_layers_and_models_via_subclassing): a `keras.Model` subclass
  whose `__init__` takes positional arguments and builds its layers, and whose `call` uses them.
- `custom_train_step`: "Customizing what happens in `fit()` with TensorFlow"
  (keras.io/guides/custom_train_step_in_tensorflow): a functional model of a `keras.Model`
  subclass that overrides `train_step` with a GradientTape, `self.compute_loss`,
  `self.optimizer.apply` and the compiled metrics.
- `with_lambda`: a `layers.Lambda` rescaling inside the model
  (keras.io/api/layers/core_layers/lambda).
- `augmented`: "Image classification from scratch"
  (keras.io/examples/vision/image_classification_from_scratch): `RandomFlip` and
  `RandomRotation` in a `Sequential` inside the model.
"""

import keras
import tensorflow as tf
from keras import layers


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
            loss = self.compute_loss(y=y, y_pred=y_pred)
        trainable_vars = self.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)
        self.optimizer.apply(gradients, trainable_vars)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
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
