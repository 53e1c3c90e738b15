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
    m = cfg.model
    model = convnet(input_shape, num_classes, m.filters, m.dense_units, m.dropout, m.from_logits)

    def in_float64(layer: tf.keras.layers.Layer) -> tf.keras.layers.Layer:
        return type(layer).from_config({**layer.get_config(), "dtype": "float64"})

    return tf.keras.models.clone_model(model, clone_function=in_float64)
