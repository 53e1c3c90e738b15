"""The files evaluate and predict read and write by name: the model of a run they take by
default (`MODEL_HINT`), and the JSON and CSV they write, which they write over only where they
wrote it. No TensorFlow here: the commands check their output before TensorFlow loads."""

from __future__ import annotations

import csv
import json
import os
from typing import Any

from hvd_train.base.errors import UserError
from hvd_train.base.files import atomic_write
from hvd_train.record.layout import RunDir

_RUN = RunDir("")


MODEL_HINT = (
    f"{_RUN.model}, {_RUN.best}, {_RUN.model_weights}, {_RUN.best_weights} or a "
    f"{_RUN.checkpoint_form} folder of the run"
)

EVALUATION_KIND = "hvd-train evaluate"  # marks a file evaluate may write over

PREDICTION_COLUMNS = ["path", "class", "class_index", "probability"]


def refuse_foreign_json(path: str) -> None:
    """Refuses an existing `path` that evaluate did not write (it would be written over)."""
    if not os.path.exists(path):
        return
    try:
        with open(path) as f:
            ours = json.load(f).get("kind") == EVALUATION_KIND
    except (OSError, ValueError, AttributeError):
        ours = False
    if not ours:
        raise UserError(
            f"--out: {path} exists and was not written by hvd-train evaluate; choose another "
            "--out or move the file away"
        )


def refuse_foreign_csv(path: str) -> None:
    """Refuses an existing `path` that predict did not write (it would be written over)."""
    if not os.path.exists(path):
        return
    try:
        with open(path, newline="") as f:
            ours = next(csv.reader(f), None) == PREDICTION_COLUMNS
    except (OSError, UnicodeDecodeError, csv.Error):
        ours = False
    if not ours:
        raise UserError(
            f"--out: {path} exists and is not a predictions CSV of hvd-train predict; choose "
            "another --out or move the file away"
        )


def write_atomic(path: str, write: Any, newline: str | None = None) -> None:
    """`write(file)` into `path` atomically (base/files.py: a reader sees the old or the new)."""
    try:
        with atomic_write(path, newline=newline) as f:
            write(f)
    except OSError as e:
        raise UserError(f"--out: cannot write {path} ({e.strerror})") from None


# `hvd-train export`'s formats: the modules each needs beyond the default install (the extra
# hvd_train[export]: pyproject.toml), and the file or folder it writes.
EXPORT_NEEDS = {"saved_model": (), "onnx": ("tf2onnx", "onnx", "onnxruntime"), "litert": ()}
EXTRA_HINT = "pip install 'hvd_train[export]', or HVD_TRAIN_EXPORT=1 scripts/install.sh"


def refuse_foreign_export(path: str, fmt: str) -> None:
    """Refuses an existing `path` that is not an export of `fmt` (it would be written over)."""
    if not os.path.exists(path):
        return
    if fmt == "saved_model":
        ours = os.path.isfile(os.path.join(path, "saved_model.pb"))
    else:
        ours = os.path.isfile(path) and path.endswith(os.path.splitext(RunDir("").exported(fmt))[1])
    if not ours:
        raise UserError(
            f"--out: {path} exists and is not an export of --format {fmt}; choose another --out or "
            "move it away"
        )
