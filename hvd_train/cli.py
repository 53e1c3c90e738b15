"""Command line: `hvd-train --config FILE [--set key=value ...]` trains; sub-commands do the rest.

User errors (bad config, bad input) end in one line on stderr and exit code 2; a traceback and
exit code 1 are for everything else.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from hvd_train.errors import UserError


def _train_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Train a Keras model with Horovod. Launch with "
        "`horovodrun -np N hvd-train --config FILE`, or run alone as one worker.",
    )
    p.add_argument("--config", required=True, help="YAML config file")
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a config key, e.g. --set train.epochs=5 (repeatable, applied in order)",
    )  # fmt: skip
    return p


def _cmd_train(argv: list[str], prog: str) -> int:
    args = _train_parser(prog).parse_args(argv)
    from hvd_train.config import load_config

    cfg = load_config(args.config, args.overrides)  # before TensorFlow loads: fast to fail
    from hvd_train.trainer import train

    train(cfg)
    return 0


def _cmd_config(argv: list[str], prog: str) -> int:
    from hvd_train.config import main as config_main

    return config_main(argv)


def _cmd_sweep(argv: list[str], prog: str) -> int:
    from hvd_train.sweep import main as sweep_main

    return sweep_main(argv, prog)


COMMANDS: dict[str, Callable[[list[str], str], int]] = {
    "train": _cmd_train,
    "config": _cmd_config,
    "sweep": _cmd_sweep,
}


def main(argv: list[str] | None = None, prog: str = "hvd-train") -> int:
    argv = sys.argv[1:] if argv is None else argv
    # TensorFlow's C++ INFO lines (CPU features, oneDNN) drown the training log; opt back in
    # with TF_CPP_MIN_LOG_LEVEL=0.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    if argv and argv[0] in COMMANDS:
        command, argv, prog = COMMANDS[argv[0]], argv[1:], f"{prog} {argv[0]}"
    else:
        command = _cmd_train
    try:
        return command(argv, prog)
    except UserError as e:
        print(f"hvd_train: error: {e}", file=sys.stderr, flush=True)
        return 2
