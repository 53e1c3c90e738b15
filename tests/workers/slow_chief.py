"""Runs on every rank: trains from a config while rank 0 spends 2 s at the end of every epoch
after the collectives (as a slow checkpoint write would), so rank 1 reaches the next epoch
first.

Usage: slow_chief.py CONFIG [KEY=VALUE ...]
"""

import sys
import time

import tensorflow as tf

from hvd_train import distributed, trainer
from hvd_train.config import load_config

SLOW_S = 2.0


class SlowChief(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if distributed.is_chief():
            time.sleep(SLOW_S)


build = trainer.build_callbacks


def build_with_slow_chief(*args, **kwargs):
    callbacks, checkpointer = build(*args, **kwargs)
    return [*callbacks, SlowChief()], checkpointer  # last: after every epoch-end collective


trainer.build_callbacks = build_with_slow_chief
trainer.train(load_config(sys.argv[1], sys.argv[2:]))
