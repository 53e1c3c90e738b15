"""summary.json: what it holds, how it is read and written, and what a rerun makes of it.

Rank 0 writes it through `RunRecord` (run_record.py); its keeper (keeper.py) and `hvd-train
launch` end it when rank 0 could not. Standard library only.
"""

from __future__ import annotations

import json
from typing import Any

from hvd_train.base import startup
from hvd_train.base.files import atomic_write

ENDINGS = ("completed", "failed", "interrupted")
# What an ending says of its cause: replaced, not mixed, when a later job ends the record.
EARLIER_ENDING = ("error", "error_type", "stopped_by", "stop_detail", "stop_signal",
                  "failed_rank", "failure", "recorded_by")  # fmt: skip


def write_json(path: str, data: dict[str, Any]) -> None:
    """Writes `data` to `path` atomically (base/files.py: a reader sees the old or the new)."""
    with atomic_write(path) as f:
        json.dump(data, f, indent=2)


def read_json(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def nothing_to_train(summary: dict[str, Any], epochs: int, run_dir: str) -> str | None:
    """Why a rerun with `train.epochs: epochs` of the run whose record is `summary` has nothing
    to train (one line), or None when it has.

    Nothing to train: the run completed with `epochs` or more epochs done, or its users'
    callbacks ended it early and `epochs` is no more than it was asked for. A rerun then
    changes nothing in run.dir, whatever its worker count. A run that failed or was
    interrupted past its last step (writing model.keras, say) has its end still to do: a rerun
    resumes and does it.
    """
    done = summary.get("epochs_completed")
    if summary.get("status") != "completed" or not isinstance(done, int):
        return None
    asked = summary.get("epochs", done)
    early = summary.get("stopped_early")
    if early and epochs <= asked:
        return (
            f"{run_dir} already completed: its callbacks stopped it early at epoch "
            f"{early.get('epoch')} of {asked} ({early.get('by')}); nothing to train (raise "
            f"train.epochs above {asked} to continue)"
        )
    if epochs > done:
        return None
    more = (
        "raise train.epochs to continue"
        if epochs == done
        else f"train.epochs is {epochs}: raise it above {done} to continue"
    )
    return f"{run_dir} already completed {done} of {asked} epochs; nothing to train ({more})"


def earlier_job(summary: dict[str, Any]) -> dict[str, Any]:
    """What summary.json's `earlier_jobs` keeps of a job that trained the run before."""
    keys = ("started_at", "status", "world_size", "controller", "global_batch_size",
            "trained_from", "epochs_completed", "stopped_at", "train_examples_per_sec",
            "wall_time_s")  # fmt: skip
    return {k: summary[k] for k in keys if summary.get(k) is not None}


def early_summary(world_size: int, epochs: int, recorded_by: str) -> dict[str, Any]:
    """summary.json of a job that ended before rank 0 started its record (in its first
    seconds), written by `recorded_by`: "start-up" (rank 0 itself) or "launcher"."""
    return {
        "status": "failed",
        "started_at": startup.process_created(),
        "world_size": world_size,
        "epochs": epochs,
        "epochs_completed": 0,
        "resumed_from": None,
        "last_checkpoint": None,
        "recorded_by": recorded_by,
    }
