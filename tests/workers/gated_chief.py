"""Runs on every rank: trains from a config while rank 0 holds at the end of the first epoch
(after every epoch-end write) until the test lets it go, so that another job can be started on
the same run.dir while this one is certainly running.

Usage: gated_chief.py GATE_DIR CONFIG [KEY=VALUE ...]. Rank 0 creates GATE_DIR/waiting, then
waits for GATE_DIR/go (at most 600 s).
"""

import dataclasses
import os
import sys
import time

from hvd_train.runtime.keras import binding

binding.import_tensorflow()  # as hvd_train's workers import it: base/deferred.py

# isort: split
import tensorflow as tf

from hvd_train.config import load_config
from hvd_train.runtime import distributed
from hvd_train.train.run import trainer

GATE_DIR, CONFIG, SETS = sys.argv[1], sys.argv[2], sys.argv[3:]


class Gate(tf.keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.passed = False

    def on_epoch_end(self, epoch, logs=None):
        if self.passed or not distributed.is_chief():
            return
        self.passed = True
        open(os.path.join(GATE_DIR, "waiting"), "w").close()
        deadline = time.monotonic() + 600
        while not os.path.exists(os.path.join(GATE_DIR, "go")) and time.monotonic() < deadline:
            time.sleep(0.1)


build = trainer.build_callbacks


def build_with_gate(*args, **kwargs):
    built = build(*args, **kwargs)
    # Last: after metrics.csv and the checkpoint.
    return dataclasses.replace(built, all=(*built.all, Gate()))


trainer.build_callbacks = build_with_gate
trainer.train(load_config(CONFIG, SETS), config_path=CONFIG)
