"""`hvd-train export`: a completed run's model written for serving, checked as it is written."""

from __future__ import annotations

import argparse
import importlib.util
import os

from hvd_train.base.errors import UserError
from hvd_train.commands.environment import setup_environment
from hvd_train.config import load_config
from hvd_train.record.layout import RunDir
from hvd_train.record.summary import read_summary

# No TensorFlow at its top: it loads once a command runs.
from hvd_train.train.inference.files import (
    EXPORT_NEEDS,
    EXTRA_HINT,
    MODEL_HINT,
    refuse_foreign_export,
)

_SHOWN = RunDir("RUN_DIR")


def main(argv: list[str], prog: str) -> int:
    """`hvd-train export RUN_DIR`: the run's model as a SavedModel, ONNX or LiteRT file."""
    args = _parser(prog).parse_args(argv)
    run = RunDir(args.run_dir)
    _check_format(args.format)
    _check_run(run, args.model)
    out = args.out or run.exported(args.format)
    refuse_foreign_export(out, args.format)  # before the slow start
    cfg = load_config(run.config)
    setup_environment(cfg, command="hvd-train export", run=run)
    from hvd_train.train.inference.export import export  # TensorFlow's side, loaded now

    export(cfg, args.model, args.format, out, args.batch_size or cfg.train.batch_size)
    return 0


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Write a completed run's model for serving, then load the export back "
        "with its own runtime (tf.saved_model.load, onnxruntime, the LiteRT interpreter) and "
        "compare its predictions on a batch of the run's validation data with the trained "
        "model's. Exits 0 only when they match, and prints where it wrote.",
        epilog="Docs: docs/models.md",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a completed run's folder (its run.dir)")
    p.add_argument(
        "--format", default="saved_model", metavar="FORMAT",
        help=f"{', '.join(EXPORT_NEEDS)} (default: saved_model, with a serving_default "
        "signature); onnx needs the extra hvd_train[export]",
    )  # fmt: skip
    p.add_argument(
        "--out", default="", metavar="PATH",
        help=f"where to write (default: {_SHOWN.exported('saved_model')}, "
        f"{_SHOWN.exported('onnx')} or {_SHOWN.exported('litert')}); an existing export of "
        "the format is written over",
    )  # fmt: skip
    p.add_argument(
        "--model", default="", metavar="PATH",
        help=f"the model to export: {MODEL_HINT} (default: the run's final model)",
    )  # fmt: skip
    p.add_argument(
        "--batch-size", type=int, default=0, metavar="B",
        help="validation examples the export is checked on (default: train.batch_size)",
    )  # fmt: skip
    return p


def _check_format(fmt: str) -> None:
    """An unknown format, or one whose optional packages are not installed: one line."""
    if fmt not in EXPORT_NEEDS:
        raise UserError(f"--format: expected one of {', '.join(EXPORT_NEEDS)}; got {fmt!r}")
    missing = [m for m in EXPORT_NEEDS[fmt] if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"--format {fmt} needs {', '.join(missing)}, not installed: {EXTRA_HINT}")


def _check_run(run: RunDir, model: str) -> None:
    """A folder with the run's config; without --model, a run that completed."""
    if not os.path.isfile(run.config):
        raise UserError(
            f"RUN_DIR: {run.root} is not a run's folder (no {os.path.basename(run.config)}); "
            "pass the run.dir of a run"
        )
    status = read_summary(run.summary).get("status", "not recorded")
    if not model and status != "completed":
        raise UserError(
            f"RUN_DIR: {run.root} has not completed (status: {status}); export a checkpoint "
            f"with --model {run.checkpoint_form}, or finish the run first"
        )
