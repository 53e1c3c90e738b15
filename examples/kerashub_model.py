"""A KerasHub model trained by hvd_train: `model.factory: examples/kerashub_model.py:build`.

KerasHub (`pip install keras-hub`, or `HVD_TRAIN_KERAS_HUB=1 make install`: docs/install.md)
builds on Keras 3, so hvd_train trains this model with its Keras 3 binding (`model.keras:
auto`). The backbone is built from its class with explicit sizes, with random weights: nothing
is downloaded. (`ResNetBackbone.from_preset("resnet_18_imagenet")` would fetch a preset from
a model hub at run time; to start from pretrained weights, save them once on a machine with
internet and load the file here.)

A ResNet of two stages of one basic block each, 64 filters, about 155,000 weights: at 32x32
it is small enough to train in seconds on a CPU. Under KerasHub's ResNetImageClassifier: global
pooling (`model.pooling`), dropout (`model.dropout`) and the classifier, which gives
probabilities (or logits with `model.from_logits: true`), as hvd_train's loss expects.
"""

import keras
import keras_hub

# KerasHub's ResNet takes a first stage of 64 filters, and a stem as wide as that stage (the
# first basic block adds its input to its output without a projection).
WIDTH = 64


def build(cfg, input_shape, num_classes) -> keras.Model:
    """ResNetImageClassifier over a two-stage ResNetBackbone, for `input_shape` images."""
    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[WIDTH],
        input_conv_kernel_sizes=[3],
        stackwise_num_filters=[WIDTH, WIDTH],
        stackwise_num_blocks=[1, 1],
        stackwise_num_strides=[1, 2],
        block_type="basic_block",
        image_shape=tuple(input_shape),
    )
    return keras_hub.models.ResNetImageClassifier(
        backbone=backbone,
        num_classes=num_classes,
        pooling=cfg.model.pooling,
        dropout=cfg.model.dropout,
        activation=None if cfg.model.from_logits else "softmax",
        head_dtype="float32",  # the classifier in float32 under mixed precision, as the loss wants
    )
