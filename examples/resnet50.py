"""Keras' ResNet-50, untrained, for configs/resnet50_synthetic.yaml
(`model.factory: examples/resnet50.py:resnet50`)."""

from __future__ import annotations

import tensorflow as tf


def resnet50(cfg) -> tf.keras.Model:
    """Keras' ResNet-50, untrained, as in Horovod's tensorflow2_synthetic_benchmark.py.

    The same network as `tf.keras.applications.ResNet50(weights=None)` (25.6 M weights at 1,000
    classes); the classifier is rebuilt with a float32 softmax so that mixed precision keeps the
    loss in float32.
    """
    shape = (*cfg.data.image_size, cfg.data.channels)
    base = tf.keras.applications.ResNet50(
        weights=None, include_top=False, pooling="avg", input_shape=shape
    )
    outputs = tf.keras.layers.Dense(
        cfg.data.num_classes, activation="softmax", dtype="float32", name="predictions"
    )(base.output)
    return tf.keras.Model(base.input, outputs, name="resnet50")
