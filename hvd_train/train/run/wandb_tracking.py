"""Rank 0's Weights & Biases logging (`logging.wandb: true`): what a run logs, from its start to
its end.

- At the start, before anything is written: wandb must be installed and, online, W&B's server
  must answer (`check_wandb`, one line and exit code 2 on every rank when not).
- Once training's start is known: the run's W&B run, the one of run.dir's record unless
  `train.resume: never` starts the run afresh (`start_wandb`), its config the resolved config
  (nested as config.yaml), this job's figures (`job`) and the versions.
- Every epoch: each value the console line and metrics.csv hold, at x = the epoch
  (callbacks/tracker_epochs.py `TrackerEpochs`).
- At the end, once summary.json holds the ending (`WandbTracking.end`): its status and
  fields (the last epoch's metrics as `final/<metric>`) in the W&B run's summary, a completed
  run's model as an artifact, and the W&B run ended with the record's exit code.

Where the runs go and how they end: record/wandb_run.py; docs/tracking.md.
"""

from __future__ import annotations

import os
import re
from typing import Any

from hvd_train import __version__
from hvd_train.config import Config, LoggingConfig, to_dict
from hvd_train.record import wandb_run
from hvd_train.record.run_record import RunRecord
from hvd_train.record.summary import Summary, Wandb
from hvd_train.runtime import distributed
from hvd_train.train.callbacks.bookkeeping import BOOKKEEPING
from hvd_train.train.run.tracking import JOB_PARAMS

# summary.json's fields that are W&B's own business or hold no single value.
NOT_IN_SUMMARY = ("wandb", "mlflow", "final_metrics")


def check_wandb(logs: LoggingConfig) -> None:
    """Rank 0 checks that wandb is installed and, online, that W&B answers, before anything is
    written; a UserError (exit code 2) is raised on every rank."""
    if logs.wandb:
        place = wandb_run.where(logs)
        distributed.chief_computes(lambda: wandb_run.check_reachable(place), "hvd_train.wandb")


class WandbTracking:
    """Rank 0's W&B run, from `start_wandb` to the record's end."""

    def __init__(self, tracked: wandb_run.WandbRun, log_model: bool):
        self.sender, self.log_model = tracked, log_model

    def end(self, summary: Summary) -> bool:
        """summary.json as it ended: its fields into the W&B run's summary, a completed run's
        model as an artifact, then the W&B run's end with the record's exit code. Returns
        whether W&B took the end."""
        s = self.sender
        if s.run is not None and not s.ended:
            s.call("at the run's end", s.run.summary.update, summary_fields(summary))
            model = summary.get("model_path")
            if summary.get("status") == "completed" and self.log_model and model:
                s.call("logging the model", _log_model, s.run, model)
        return s.end(wandb_run.exit_code(summary))


def start_wandb(cfg: Config, record: RunRecord | None, earlier: Wandb) -> WandbTracking | None:
    """Rank 0 (the one with the record) opens the run's W&B run: `earlier`'s (summary.json's
    `wandb` before this job, when it continues the run), else a new one; summary.json's
    `wandb` says which from here on. None without logging.wandb."""
    if not cfg.logging.wandb or record is None:
        return None
    try:
        tracked = wandb_run.start(
            wandb_run.Target(
                wandb_run.where(cfg.logging),
                name=os.path.basename(os.path.abspath(cfg.run.dir)),
                continues=earlier,
            ),
            config=config(cfg, record.summary),
            say=distributed.log,
            on_change=lambda fields: record.update(wandb=fields),
        )
    except Exception as e:  # no client at all (checked at the start, yet): never stop the run
        distributed.log(f"warning: W&B: {wandb_run.cause(e)}; training goes on without it")
        return None
    record.update(wandb=tracked.fields())
    return WandbTracking(tracked, cfg.logging.wandb_log_model)


def config(cfg: Config, summary: Summary) -> dict[str, Any]:
    """The W&B config: the resolved config as config.yaml nests it (`train.batch_size`), this
    job's worker count, batches and learning rates (`job.world_size`), and the versions
    (`versions.tensorflow`). A job that continues the run updates it: the latest job's wins."""
    versions = {**summary.get("versions", {}), "hvd_train": __version__}
    job = {k: summary[k] for k in JOB_PARAMS if k in summary}
    return {**to_dict(cfg), "job": job, "versions": versions}


def summary_fields(summary: Summary) -> dict[str, Any]:
    """summary.json's fields for the W&B run's summary: each one of a single value (status,
    epochs_completed, train_examples_per_sec, error, ...) and each of the last epoch's
    metrics as `final/<metric>`."""
    found = {k: v for k, v in summary.items()
             if k not in NOT_IN_SUMMARY and isinstance(v, (str, int, float, bool))}  # fmt: skip
    final = summary.get("final_metrics") or {}
    found.update({f"final/{k}": v for k, v in final.items() if k not in BOOKKEEPING})
    return found


def _log_model(run: Any, path: str) -> None:
    """The model file (model.keras) or SavedModel folder, as the artifact `<run>-model`."""
    import wandb

    name = re.sub(r"[^\w.-]", "-", f"{run.name or run.id}-model")  # W&B's allowed characters
    artifact = wandb.Artifact(name, type="model", metadata={"path": path})
    if os.path.isdir(path):
        artifact.add_dir(path)
    elif os.path.exists(path):
        artifact.add_file(path)
    else:
        return
    run.log_artifact(artifact)
