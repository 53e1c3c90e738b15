"""hvd_train: distributed training of Keras models with Horovod, driven by one YAML config.

Importing it imports no TensorFlow and chooses no Keras: the commands choose (runtime/keras/binding.py)
once they have read the config. Keras 3 users' own `model.fit` scripts take the distributed
pieces from `hvd_train.keras3` (docs/models.md).
"""

__version__ = "0.1.0"
