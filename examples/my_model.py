"""A user's own model, trained by hvd_train unchanged: `model.factory: examples/my_model.py:build`.

Written with `import keras`, the Keras of today (Keras 3): hvd_train trains the model with the
Keras it was built with (a `tf_keras` model trains as Keras 2). hvd_train calls
`build(cfg, input_shape, num_classes)` (or `build(cfg)` if that is all the function takes) on
every worker, after Horovod has started, and expects an uncompiled Keras model back: it compiles
it with the configured optimizer (made distributed: the gradients averaged over the workers),
loss and metrics, and broadcasts rank 0's initial weights. Build a functional or sequential
model if you want `model.sync_batch_norm`; a subclassed model trains too.

The last layer gives probabilities (softmax), as hvd_train's loss expects unless
`model.from_logits: true`.
"""

import keras


def build(cfg, input_shape, num_classes):
    """A small residual convnet with batch normalisation, for small images."""
    layers = keras.layers
    inputs = keras.Input(shape=input_shape)
    x = _conv_bn_relu(inputs, 32)
    for width in (32, 64):
        x = _residual_block(x, width)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dropout(cfg.model.dropout)(x)  # any config value can steer your model
    outputs = layers.Dense(num_classes, activation="softmax")(x)
    return keras.Model(inputs, outputs, name="my_model")


# Keras' default momentum (0.99) needs hundreds of steps before the moving statistics that
# validation uses catch up with training; a small dataset gets only tens of steps an epoch.
BN_MOMENTUM = 0.9


def _conv_bn_relu(x, width):
    x = keras.layers.Conv2D(width, 3, padding="same", use_bias=False)(x)
    x = keras.layers.BatchNormalization(momentum=BN_MOMENTUM)(x)
    return keras.layers.ReLU()(x)


def _residual_block(x, width):
    layers = keras.layers
    shortcut = x if x.shape[-1] == width else layers.Conv2D(width, 1, use_bias=False)(x)
    y = _conv_bn_relu(x, width)
    y = layers.Conv2D(width, 3, padding="same", use_bias=False)(y)
    y = layers.BatchNormalization(momentum=BN_MOMENTUM)(y)
    return layers.ReLU()(layers.Add()([shortcut, y]))
