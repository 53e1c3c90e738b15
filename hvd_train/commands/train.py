"""`hvd-train train` (the default command): train as one worker of the job, or alone."""

from __future__ import annotations

import argparse

from hvd_train.config import RuntimeConfig, add_config_arguments


def parser(
    prog: str, docs: str = "docs/config.md (every key), docs/launching.md"
) -> argparse.ArgumentParser:
    """`--config FILE [--set KEY=VALUE ...]`, as training reads them; data-bench and lr-plot
    start from it."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Train a Keras model with Horovod. Launch with "
        "`horovodrun -np N hvd-train --config FILE`, or run alone as one worker.",
        epilog=f"Docs: {docs}",
    )
    add_config_arguments(p)
    return p


def main(argv: list[str], prog: str) -> int:
    args = parser(prog).parse_args(argv)
    from hvd_train.config import load_config

    cfg = load_config(args.config, args.overrides)  # before TensorFlow loads: fast to fail
    from hvd_train.base import logs, startup
    from hvd_train.record import stops
    from hvd_train.runtime.keras import binding

    binding.prepare(cfg.runtime.keras)  # before TensorFlow loads: what tf.keras means
    before_tensorflow(cfg.runtime)

    startup.mark("config")
    # From here a stop, or horovodrun ending the job after another worker failed, is recorded
    # (rank 0 writes summary.json), also during TensorFlow's import: Python's default would
    # end the process without a word.
    signals = stops.installed(cfg)
    # A launcher's worker: its output waits for its log in run.dir, which the trainer starts
    # once run.dir is this job's; alone, TensorFlow's start-up lines are kept for that log.
    logs.quiet_tensorflow()
    binding.import_tensorflow()  # matplotlib deferred, the collector paused
    from hvd_train.runtime import xla

    # Before Horovod's library loads: its XLA all-reduce is registered then or never.
    xla.prepare(cfg.runtime.jit_compile)
    from hvd_train.train.run.trainer import train

    startup.mark("imports")  # TensorFlow, Horovod and the trainer
    train(cfg, config_path=args.config, signals=signals)
    return 0


def before_tensorflow(runtime: RuntimeConfig) -> None:
    """What a worker's environment must say before TensorFlow is imported, which reads it
    then: its MIG instance, the GPUs hidden where `runtime.device` is cpu, and XLA's flags."""
    from hvd_train.base import device_choice, gpus, xla_env

    if runtime.device != "cpu":
        # Before CUDA loads: it shows a process one MIG instance at most, chosen by this variable.
        gpus.pin_mig_device()
    gpu = device_choice.prepare(
        runtime.device, 0 if runtime.device == "cpu" else len(gpus.devices())
    )
    xla_env.environment(runtime.jit_compile, gpu)
