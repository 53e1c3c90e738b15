"""Model factories for exact comparisons (`model.factory: float64_models:...`).

`convnet7_float64` is the built-in convnet7, layer for layer, computing and storing in float64:
where two runs may differ only by the order of a float sum, float64 makes that difference
about 2^29 times smaller than float32 does, far below anything a test could mistake for a bug.
(TensorFlow's op determinism cannot be turned on here: it refuses `tf.timestamp`, which the
input-wait measurement uses. On CPU a run repeats itself bit for bit anyway when its thread
counts are fixed: set `runtime.intra_op_threads`.)
"""

import tensorflow as tf

from hvd_train.train.models import convnet


def convnet7_float64(cfg, input_shape, num_classes) -> tf.keras.Model:
    model = convnet(input_shape, num_classes, cfg.model)

    def in_float64(layer: tf.keras.layers.Layer) -> tf.keras.layers.Layer:
        return type(layer).from_config({**layer.get_config(), "dtype": "float64"})

    return tf.keras.models.clone_model(model, clone_function=in_float64)


def bn_net_float64(cfg, input_shape, num_classes) -> tf.keras.Model:
    """A small convnet with a BatchNormalization after each convolution, in float64: batch
    statistics decide its every step, so sync batch norm across workers shows at once."""
    keras = tf.keras
    x = inputs = keras.Input(input_shape, dtype="float64")
    if len(input_shape) == 2:
        x = keras.layers.Reshape((*input_shape, 1), dtype="float64")(x)
    for width in (8, 16):
        # No bias: the batch norm after it subtracts the mean, so a bias would get no gradient.
        x = keras.layers.Conv2D(width, 3, padding="same", use_bias=False, dtype="float64")(x)
        x = keras.layers.BatchNormalization(dtype="float64")(x)
        x = keras.layers.Activation("relu", dtype="float64")(x)
    x = keras.layers.Flatten(dtype="float64")(x)
    outputs = keras.layers.Dense(num_classes, activation="softmax", dtype="float64")(x)
    return keras.Model(inputs, outputs)
