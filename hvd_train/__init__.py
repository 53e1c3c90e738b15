"""hvd_train: distributed training of Keras models with Horovod, driven by one YAML config."""

__version__ = "0.1.0"
