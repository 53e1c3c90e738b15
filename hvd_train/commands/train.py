"""`hvd-train train` (the default command): train as one worker of the job, or alone."""

from __future__ import annotations

import argparse

from hvd_train.commands.environment import Role, setup_environment
from hvd_train.config import add_config_arguments, load_config


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
    cfg = load_config(args.config, args.overrides)  # before TensorFlow loads: fast to fail
    # A launcher's worker: its output waits for its log in run.dir, which the trainer starts
    # once run.dir is this job's; alone, TensorFlow's start-up lines are kept for that log.
    signals = setup_environment(cfg, role=Role.TRAINER)
    from hvd_train.base import startup
    from hvd_train.train.run.trainer import train

    startup.mark("imports")  # TensorFlow, Horovod and the trainer
    train(cfg, config_path=args.config, signals=signals)
    return 0
