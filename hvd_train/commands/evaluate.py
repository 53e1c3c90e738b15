"""`hvd-train evaluate`: exact metrics of a saved model or checkpoint, at any worker count."""

from __future__ import annotations

import argparse

from hvd_train.commands.environment import setup_environment
from hvd_train.config import add_config_arguments, load_config
from hvd_train.record.layout import RunDir

# No TensorFlow at its top: it loads once a command runs.
from hvd_train.train.inference.files import MODEL_HINT, refuse_foreign_json

# How the help shows a path in run.dir: `run.dir/model.keras`.
_SHOWN = RunDir("run.dir")


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description, epilog="Docs: docs/models.md")
    add_config_arguments(p, config_help=f"the run's YAML config ({_SHOWN.config} will do)")
    p.add_argument(
        "--model", default="", metavar="PATH",
        help=f"the model: {MODEL_HINT} (default: {_SHOWN.model})",
    )  # fmt: skip
    p.add_argument(
        "--batch-size", type=int, default=0, metavar="B",
        help="examples per worker per step, the same at any worker count (default: "
        "train.batch_size)",
    )  # fmt: skip
    return p


def main(argv: list[str], prog: str) -> int:
    """`hvd-train evaluate`: loss and accuracy of a saved model, exact at any worker count."""
    p = parser(
        prog,
        "Evaluate a saved model exactly: every example counted once, in float64 sums added "
        "in one order, so the metrics are the same to the last bit at any worker count. Run "
        "alone or under `horovodrun -np N`. Rank 0 prints one line and writes JSON.",
    )
    p.add_argument(
        "--data", default="", metavar="PATH",
        help="an image folder (one sub-folder per class) or a folder of *.tfrecord files, with "
        "the training classes (default: the config's validation split)",
    )  # fmt: skip
    p.add_argument(
        "--out", default="", metavar="FILE",
        help=f"JSON to write (default: {_SHOWN.evaluation}); an existing file is written "
        "over only if evaluate wrote it",
    )  # fmt: skip
    args = p.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    out = args.out or RunDir(cfg.run.dir).evaluation
    setup_environment(cfg, command="hvd-train evaluate", check=lambda: refuse_foreign_json(out))
    from hvd_train.train.inference.evaluate import evaluate  # TensorFlow's side, loaded now

    evaluate(cfg, args.model, args.data, out, args.batch_size or cfg.train.batch_size)
    return 0
