"""A worker's start, the same for training and `data-bench`: its cores, Horovod, its device and
threads, then its Keras and seed."""

from __future__ import annotations

import dataclasses
import os

from hvd_train.config import Config
from hvd_train.runtime import binding, distributed, tuning


def start(cfg: Config, timeline: bool = True) -> str:
    """Starts Horovod and TensorFlow on this worker, activates the Keras `model.keras` chooses
    and seeds it; returns the device ("gpu" or "cpu").

    `timeline` False: no Horovod timeline (horovod.timeline, or a launcher's flag), which
    Horovod would empty at init.
    """
    tuning.before_init(cfg)  # core binding: before Horovod and TensorFlow start threads
    knobs = cfg.horovod
    if not timeline:
        os.environ.pop("HOROVOD_TIMELINE", None)
        knobs = dataclasses.replace(knobs, timeline=False)
    distributed.init(knobs, cfg.run.dir)
    device = distributed.configure_devices(
        cfg.runtime.intra_op_threads, cfg.runtime.inter_op_threads
    )
    # Same seed on every rank: identical initial weights, so the broadcast before training is a
    # no-op for built-in models and a guarantee for user factories that draw from other
    # generators.
    binding.activate(binding.resolve(cfg.model.keras)).seed(cfg.runtime.seed)
    return device
