"""Built-in models by name, and users' own models through `model.factory: "module:function"`."""

from __future__ import annotations

import importlib
import sys

import tensorflow as tf

from hvd_train.config import Config
from hvd_train.errors import ConfigError


def build_model(cfg: Config, input_shape: tuple[int, ...], num_classes: int) -> tf.keras.Model:
    """The uncompiled model: `model.factory` if set, else the built-in `model.name`."""
    if cfg.model.factory:
        return _from_factory(cfg)
    if cfg.model.name == "convnet7":
        return convnet7(
            input_shape,
            num_classes,
            cfg.model.filters,
            cfg.model.dense_units,
            cfg.model.dropout,
            cfg.model.from_logits,
        )
    return mlp(
        input_shape, num_classes, cfg.model.dense_units, cfg.model.dropout, cfg.model.from_logits
    )


def convnet7(
    input_shape: tuple[int, ...],
    num_classes: int,
    filters: tuple[int, ...] = (32, 32, 64, 64),
    dense_units: tuple[int, ...] = (256,),
    dropout: float = 0.25,
    from_logits: bool = False,
) -> tf.keras.Model:
    """The seed experiments' small convnet (Keras' classic CIFAR-10 example), for small images.

    Layer by layer, with the default widths: conv 3x3x32, conv 3x3x32, max-pool 2, conv 3x3x64,
    conv 3x3x64, max-pool 2 (dropout after each pool), flatten, dense 256 (dropout), dense to the
    classes. All convolutions pad `same`, so it fits inputs as small as 4x4. At 32x32x3 it has
    about 1.1 M weights; wide `dense_units` (for example [2816, 256]) make the 12 M-weight
    gradient-heavy variant.
    """
    layers = tf.keras.layers
    x = inputs = tf.keras.Input(shape=input_shape)
    if len(input_shape) == 2:  # grey images given as height x width
        x = layers.Reshape((*input_shape, 1))(x)
    for i, width in enumerate(filters):
        x = layers.Conv2D(width, 3, padding="same", activation="relu")(x)
        if i % 2 == 1:
            x = layers.MaxPooling2D(2)(x)
            x = layers.Dropout(dropout)(x) if dropout else x
    x = layers.Flatten()(x)
    for units in dense_units:
        x = layers.Dense(units, activation="relu")(x)
        x = layers.Dropout(dropout)(x) if dropout else x
    outputs = _head(x, num_classes, from_logits)
    return tf.keras.Model(inputs, outputs, name="convnet7")


def mlp(
    input_shape: tuple[int, ...],
    num_classes: int,
    dense_units: tuple[int, ...] = (256,),
    dropout: float = 0.0,
    from_logits: bool = False,
) -> tf.keras.Model:
    """A multilayer perceptron over the flattened input."""
    layers = tf.keras.layers
    x = inputs = tf.keras.Input(shape=input_shape)
    x = layers.Flatten()(x)
    for units in dense_units:
        x = layers.Dense(units, activation="relu")(x)
        x = layers.Dropout(dropout)(x) if dropout else x
    return tf.keras.Model(inputs, _head(x, num_classes, from_logits), name="mlp")


def _head(x: tf.Tensor, num_classes: int, from_logits: bool) -> tf.Tensor:
    # float32 output keeps the loss stable under mixed precision.
    activation = None if from_logits else "softmax"
    return tf.keras.layers.Dense(num_classes, activation=activation, dtype="float32")(x)


def _from_factory(cfg: Config) -> tf.keras.Model:
    spec = cfg.model.factory
    module_name, _, fn_name = spec.partition(":")
    if "" not in sys.path:  # the working directory, as `python -m` would have it
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(
            f"model.factory: cannot import module {module_name!r} ({e}); it must be importable "
            "from the working directory or PYTHONPATH"
        ) from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ConfigError(f"model.factory: {module_name!r} has no function {fn_name!r}")
    model = fn(cfg)
    if not isinstance(model, tf.keras.Model):
        raise ConfigError(
            f"model.factory: {spec} returned {type(model).__name__}, expected a Keras model"
        )
    return model
