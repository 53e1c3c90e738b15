"""The one start-up of every command that loads TensorFlow (train, data-bench, evaluate, predict,
export, lr-plot): what the process's environment must say before TensorFlow is imported, which
reads it then, and the import itself, as Lightning Fabric's `setup_environment` is one call for
every entry point.

In order: which Keras `tf.keras` means; on a training worker its MIG instance, its device and
XLA's flags; the start-up mark; the stop handling; TensorFlow's start-up lines kept off the
console; TensorFlow's import; on a training worker, XLA's decision checked against the GPUs
TensorFlow sees, before Horovod's library loads. TF_CPP_MIN_LOG_LEVEL is cli.py's, set before
any command (doctor and convert-tfrecord load TensorFlow without a config).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING

from hvd_train.base import logs, startup
from hvd_train.config import Config, RuntimeConfig
from hvd_train.record.layout import RunDir
from hvd_train.runtime.keras import binding

if TYPE_CHECKING:
    from hvd_train.record.stops import StopSignals


class Role(enum.Enum):
    """What the command's process is, for its start-up."""

    TOOL = "tool"  # evaluate, predict, export, lr-plot: TensorFlow's own device and XLA defaults
    # data-bench: a training worker's device and XLA set-up, as it times the training step
    TIMED_WORKER = "timed worker"
    TRAINER = "trainer"  # train: a worker whose stops are recorded and whose start-up is timed

    @property
    def worker(self) -> bool:
        return self is not Role.TOOL

    @property
    def trains(self) -> bool:
        return self is Role.TRAINER


def setup_environment(
    cfg: Config,
    *,
    command: str = "",
    run: RunDir | None = None,
    role: Role = Role.TOOL,
    check: Callable[[], None] | None = None,
) -> StopSignals | None:
    """Prepares this process for TensorFlow, then imports it; returns the stop handling of a
    `Role.TRAINER`.

    Args:
        cfg: the command's config.
        command: the header of this process's part of `run`'s rank logs (`hvd-train
            evaluate`). Empty for train, whose trainer starts its log once run.dir is claimed
            (it may be another job's), and for lr-plot, which writes no run. Defaults to `""`.
        run: the run whose logs `command` adds to, where a training job started it. Defaults
            to `cfg.run.dir`'s (export's run is the folder it was given).
        role: a training worker's device and XLA set-up (`TIMED_WORKER`, `TRAINER`), and for a
            `TRAINER` its stops recorded in summary.json from here on and its start-up phases
            timed. Defaults to `Role.TOOL`: TensorFlow's defaults.
        check: the command's own check of its input (evaluate's and predict's output file),
            run once `runtime.keras` is settled and before the slow import. Defaults to none.
    """
    binding.prepare(cfg.runtime.keras)  # what tf.keras means
    if check is not None:
        check()
    if role.worker:
        _worker_environment(cfg.runtime)
    signals = None
    if role.trains:
        from hvd_train.record import stops

        startup.mark("config")
        # From here a stop, or horovodrun ending the job after another worker failed, is
        # recorded (rank 0 writes summary.json), also during TensorFlow's import: Python's
        # default would end the process without a word.
        signals = stops.installed(cfg)
    log = (run or RunDir(cfg.run.dir)).started_run_logs() if command else None
    logs.quiet_tensorflow(log, command)
    binding.import_tensorflow()  # matplotlib deferred, the collector paused
    if role.worker:
        from hvd_train.runtime import xla

        # Before Horovod's library loads: its XLA all-reduce is registered then or never.
        xla.prepare(cfg.runtime.jit_compile)
    return signals


def _worker_environment(runtime: RuntimeConfig) -> None:
    """A worker's MIG instance, the GPUs hidden where `runtime.device` is cpu, and XLA's
    flags."""
    from hvd_train.base import device_choice, gpus, xla_env

    if runtime.device != "cpu":
        # Before CUDA loads: it shows a process one MIG instance at most, chosen by this variable.
        gpus.pin_mig_device()
    gpu = device_choice.prepare(
        runtime.device, 0 if runtime.device == "cpu" else len(gpus.devices())
    )
    xla_env.environment(runtime.jit_compile, gpu)
