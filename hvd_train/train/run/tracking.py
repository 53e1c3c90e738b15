"""Rank 0's MLflow logging (`logging.mlflow: true`): what a run logs, from its start to its end.

- At the start, before anything is written: the tracking server must answer (`check_tracker`,
  one line and exit code 2 on every rank when it does not).
- Once training's start is known: the run's MLflow run, the one of run.dir's record unless
  `train.resume: never` starts the run afresh (`start_tracking`); its parameters (the resolved config as dotted keys,
  the worker count, the batches, the learning rates, the versions) and tags (controller,
  device, run.dir).
- Every epoch: a point (step = the epoch) of each value the console line and metrics.csv hold
  (callbacks/tracker_epochs.py `TrackerEpochs`), sent by a thread.
- At the end (`Tracking`): the final metrics and the job's figures, config.yaml, the model of a
  completed run; then, once summary.json holds the ending, summary.json and the MLflow run's
  status.

Where the runs go, the sender and the statuses: record/mlflow_run.py; docs/tracking.md.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Mapping
from typing import Any

from hvd_train import __version__
from hvd_train.config import Config, LoggingConfig, to_dict
from hvd_train.record import mlflow_run
from hvd_train.record.layout import RunDir
from hvd_train.record.run_record import RunRecord
from hvd_train.record.summary import Mlflow, Summary
from hvd_train.runtime import distributed
from hvd_train.train.callbacks.bookkeeping import BOOKKEEPING

# How long a completed run's end waits for its last epoch points; a stop or a failure, which a
# launcher may kill seconds later (its keeper then ends the MLflow run), waits less.
END_WAIT_S = 30.0
STOP_WAIT_S = 2.0
# summary.json's run-level figures, logged at the end (step = epochs completed) beside
# `final/<metric>` (the model's metrics of the last epoch): the job's throughput and time.
FIGURES = ("train_examples_per_sec", "train_examples_per_sec_per_worker", "step_time_ms",
           "input_wait_fraction", "wall_time_s", "epochs_completed")  # fmt: skip
# The summary.json fields logged as parameters (`latest.<key>` tags once they change).
JOB_PARAMS = ("world_size", "per_worker_batch_size", "global_batch_size", "steps_per_epoch",
              "base_learning_rate", "scaled_learning_rate", "batch_size_mode")  # fmt: skip


def check_tracker(logs: LoggingConfig) -> None:
    """Rank 0 checks that the tracking server answers, before anything is written; a UserError
    (MLflow not installed, or no answer: exit code 2) is raised on every rank."""
    if logs.mlflow:
        place = mlflow_run.where(logs)
        distributed.chief_computes(lambda: mlflow_run.check_reachable(place), "hvd_train.mlflow")


class Tracking:
    """Rank 0's MLflow run, from `start_tracking` to the record's end."""

    def __init__(self, sender: mlflow_run.Sender, run_dir: str, log_model: bool):
        self.sender, self.run_dir, self.log_model = sender, RunDir(run_dir), log_model

    def before_end(self, summary: Summary) -> Mlflow:
        """Everything but the ending: the last points, the final metrics and figures,
        config.yaml and a completed run's model. Returns summary.json's `mlflow`."""
        completed = summary.get("status") == "completed"
        s = self.sender
        s.flush(END_WAIT_S if completed else STOP_WAIT_S)
        final = summary.get("final_metrics") or {}
        values = {f"final/{k}": v for k, v in final.items() if k not in BOOKKEEPING}
        values.update({k: summary[k] for k in FIGURES if _is_number(summary.get(k))})
        step = int(summary.get("epochs_completed") or 0)
        points = [mlflow_run.point(k, float(v), step) for k, v in values.items()]
        s.call("at the run's end", mlflow_run.log_metrics, s.tracker, s.run_id, points)
        s.call("at the run's end", s.tracker.log_artifact, s.run_id, self.run_dir.config)
        model = summary.get("model_path")
        if completed and self.log_model and model and os.path.exists(model):
            self._upload_model(model)
        return s.fields()

    def after_end(self, status: str) -> str | None:
        """Once summary.json holds the ending: it goes up, and the MLflow run ends with the
        status the record says. Returns that status, or None when the server did not take it
        (the keeper tries again once rank 0 has gone)."""
        s = self.sender
        s.call("at the run's end", s.tracker.log_artifact, s.run_id, self.run_dir.summary)
        want = mlflow_run.STATUS[status]
        s.call("at the run's end", s.tracker.set_terminated, s.run_id, want)
        s.close()
        return want if s.lost is None else None

    def _upload_model(self, path: str) -> None:
        s = self.sender
        if os.path.isdir(path):  # a subclassed model's SavedModel folder
            name = os.path.basename(path.rstrip(os.sep))
            s.call("uploading the model", s.tracker.log_artifacts, s.run_id, path, name)
        else:
            s.call("uploading the model", s.tracker.log_artifact, s.run_id, path)


def start_tracking(cfg: Config, record: RunRecord | None, earlier: Mlflow) -> Tracking | None:
    """Rank 0 (the one with the record) opens the run's MLflow run: `earlier`'s (summary.json's
    `mlflow` before this job, when it continues the run), else a new one; summary.json's
    `mlflow` says which from here on. None without logging.mlflow."""
    if not cfg.logging.mlflow or record is None:
        return None
    try:
        sender = mlflow_run.start(
            mlflow_run.Target(
                mlflow_run.where(cfg.logging),
                name=os.path.basename(os.path.abspath(cfg.run.dir)),
                continues=earlier,
            ),
            params=params(cfg, record.summary),
            tags=tags(cfg.run.dir, record.summary),
            say=distributed.log,
            on_change=lambda fields: record.update(mlflow=fields),
        )
    except Exception as e:  # no client at all (checked at the start, yet): never stop the run
        distributed.log(f"warning: MLflow: {mlflow_run.cause(e)}; training goes on without it")
        return None
    record.update(mlflow=sender.fields())
    record.note(mlflow_uri=sender.uri)  # the keeper ends the MLflow run if rank 0 cannot
    return Tracking(sender, cfg.run.dir, cfg.logging.mlflow_log_model)


def params(cfg: Config, summary: Summary) -> dict[str, str]:
    """The MLflow parameters: the resolved config as dotted keys (`train.batch_size`), this
    job's worker count, batches and learning rates, and the versions (`versions.tensorflow`)."""
    found = {k: mlflow_run.param_value(v) for k, v in flatten(to_dict(cfg)).items()}
    found.update({k: mlflow_run.param_value(summary[k]) for k in JOB_PARAMS if k in summary})
    versions = {**summary.get("versions", {}), "hvd_train": __version__}
    found.update({f"versions.{k}": str(v) for k, v in versions.items()})
    return found


def tags(run_dir: str, summary: Summary) -> dict[str, str]:
    """The MLflow tags: controller, device, and where run.dir is (its host and path)."""
    return {
        "controller": str(summary.get("controller", "")),
        "device": str(summary.get("device", "")),
        "run.dir": os.path.abspath(run_dir),
        "host": socket.gethostname(),
    }


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _is_number(v: object) -> bool:
    try:
        return math.isfinite(float(v))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
