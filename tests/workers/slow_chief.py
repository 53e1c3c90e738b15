"""Runs on every rank: trains from a config while rank 0 ends every epoch slowly, after the
collectives (as a slow checkpoint write would), and watches whether rank 1 starts its next
epoch's clock in the meantime. No clock is compared: only the order of events.

Each rank touches a marker file in ./order/ when it arrives at an epoch's start (before any
barrier) and when its epoch clock starts (EpochStats.on_epoch_begin). At the end of each epoch
but the last, rank 0 waits until rank 1 has arrived at the next epoch, then keeps ending its
own for SLOW_S more and prints one line:

    ORDER epoch N: rank 1 started its clock after rank 0 ended the previous epoch   (correct)
    ORDER epoch N: rank 1 started its clock while rank 0 was still ending the previous epoch

The second line is certain if rank 1's clock runs from its arrival (no barrier); the first is
certain if a barrier holds it until rank 0 arrives, whatever the load: SLOW_S only bounds how
long rank 0 looks, so a slow machine can hide the fault, never invent it.

Usage: slow_chief.py CONFIG [KEY=VALUE ...]
"""

import dataclasses
import pathlib
import sys
import time

from hvd_train.runtime.keras import binding

binding.import_tensorflow()  # as hvd_train's workers import it: base/deferred.py

# isort: split
import tensorflow as tf

from hvd_train.config import load_config
from hvd_train.runtime import distributed
from hvd_train.train.callbacks import epoch_stats
from hvd_train.train.run import trainer

SLOW_S = 2.0
ORDER = pathlib.Path("order")


def marker(what: str, rank: int, epoch: int) -> pathlib.Path:
    return ORDER / f"{what}-rank{rank}-epoch{epoch}"


class Arrival(tf.keras.callbacks.Callback):
    """Marks this rank's arrival at each epoch, before RunControl (and its barrier)."""

    def on_epoch_begin(self, epoch, logs=None):
        marker("arrived", distributed.rank(), epoch).touch()


class SlowChief(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if not distributed.is_chief() or epoch + 1 == self.params["epochs"]:
            return
        while not marker("arrived", 1, epoch + 1).exists():
            time.sleep(0.01)
        started = marker("clock", 1, epoch + 1)
        deadline = time.monotonic() + SLOW_S
        while time.monotonic() < deadline and not started.exists():
            time.sleep(0.01)
        order = "while rank 0 was still ending" if started.exists() else "after rank 0 ended"
        print(f"ORDER epoch {epoch + 2}: rank 1 started its clock {order} the previous epoch")


epoch_stats_begin = epoch_stats.EpochStats.on_epoch_begin


def marking_epoch_stats_begin(self, epoch, logs=None):
    marker("clock", distributed.rank(), epoch).touch()
    epoch_stats_begin(self, epoch, logs)


build = trainer.build_callbacks


def build_with_slow_chief(*args, **kwargs):
    built = build(*args, **kwargs)
    # Arrival first, before the barrier; SlowChief last, after every epoch-end collective.
    return dataclasses.replace(built, all=(Arrival(), *built.all, SlowChief()))


ORDER.mkdir(exist_ok=True)
epoch_stats.EpochStats.on_epoch_begin = marking_epoch_stats_begin
trainer.build_callbacks = build_with_slow_chief
trainer.train(load_config(sys.argv[1], sys.argv[2:]))
