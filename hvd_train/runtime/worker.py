"""A worker's start, the same for training and `data-bench`: its cores, Horovod, its device and
threads, then its Keras and seed."""

from __future__ import annotations

import dataclasses
import os

from hvd_train.base import nccl_log
from hvd_train.config import Config
from hvd_train.runtime import device, distributed, tuning
from hvd_train.runtime.keras import binding


def start(cfg: Config, timeline: str | None) -> str:
    """Starts Horovod and TensorFlow on this worker, activates the Keras `runtime.keras` chooses
    and seeds it; returns the device ("gpu" or "cpu"). Raises DeviceError where
    `runtime.device` needs a GPU that TensorFlow does not see (runtime/device.py).

    `timeline`: where Horovod writes its timeline when `horovod.timeline` asks (run.dir's
    timeline.json); None: no timeline (nor a launcher's flag), which Horovod would empty at init.
    """
    tuning.before_init(cfg.runtime)  # core binding: before Horovod and TensorFlow start threads
    knobs = cfg.horovod
    if timeline is None:
        os.environ.pop("HOROVOD_TIMELINE", None)
        knobs = dataclasses.replace(knobs, timeline=False)
    distributed.init(knobs, timeline or "")
    # A GPU TensorFlow cannot use ends the job here, before any rank trains on the CPU.
    device.require(cfg.runtime.device)
    kind = distributed.configure_devices(
        cfg.runtime.intra_op_threads, cfg.runtime.inter_op_threads, cfg.runtime.device != "cpu"
    )
    if kind == "gpu":  # before the first collective on the GPU: which network NCCL takes
        nccl_log.route(os.environ)
    # Same seed on every rank: identical initial weights, so the broadcast before training is a
    # no-op for built-in models and a guarantee for user factories that draw from other
    # generators.
    binding.activate(binding.resolve(cfg.runtime.keras)).seed(cfg.runtime.seed)
    return kind
