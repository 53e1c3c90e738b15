"""A subclassed Keras 3 model, as keras.io's guides write one, for `model.factory:
tests/workers/subclassed_models.py:tiny_net`: its layers are made in `__init__` and built at its
first call, so it has no variables until then.

Registered as serializable: the exported `model.keras` loads where this module is imported.
"""

import keras


@keras.saving.register_keras_serializable(package="hvd_train_tests")
class TinyNet(keras.Model):
    def __init__(self, num_classes: int = 10, **kwargs):
        super().__init__(**kwargs)
        self.num_classes = num_classes
        self.conv = keras.layers.Conv2D(8, 3, activation="relu")
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.head = keras.layers.Dense(num_classes, activation="softmax")

    def call(self, x, training=None):
        return self.head(self.pool(self.conv(x)))

    def get_config(self) -> dict:
        return {**super().get_config(), "num_classes": self.num_classes}


def tiny_net(cfg, input_shape, num_classes) -> keras.Model:
    return TinyNet(num_classes)
