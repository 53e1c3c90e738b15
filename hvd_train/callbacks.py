"""The training callbacks, and `build_callbacks`, the one place that fixes their order."""

from __future__ import annotations

import csv
import os
import time

import horovod.tensorflow.keras as hvd
import tensorflow as tf

from hvd_train import distributed, perf
from hvd_train.checkpoint import export_plain_model
from hvd_train.config import Config, Derived
from hvd_train.evaluation import Evaluator

METRICS_COLUMNS = [
    "epoch", "loss", "accuracy", "val_loss", "val_accuracy",
    "learning_rate", "epoch_time_s", "examples_per_sec",
    "examples_per_sec_per_worker", "step_time_ms",
]  # fmt: skip


class EpochStats(tf.keras.callbacks.Callback):
    """Adds `epoch_time_s` (training only), `examples_per_sec` (all workers) and
    `learning_rate` (the rate the epoch's last step used) to the epoch's logs."""

    def __init__(self, d: Derived):
        super().__init__()
        self.examples = d.steps_per_epoch * d.global_batch
        self._start = 0.0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        seconds = time.perf_counter() - self._start
        logs["epoch_time_s"] = seconds
        logs["examples_per_sec"] = self.examples / seconds
        # Keras reports, for a schedule, the rate its last apply_gradients used.
        logs["learning_rate"] = float(self.model.optimizer.learning_rate)


class ExactValidation(tf.keras.callbacks.Callback):
    """Puts exact `val_loss` and `val_accuracy` into the logs (a collective: every rank)."""

    def __init__(self, evaluator: Evaluator):
        super().__init__()
        self.evaluator = evaluator

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        logs.update(self.evaluator.evaluate())


class MetricsCSV(tf.keras.callbacks.Callback):
    """Appends one row per epoch to metrics.csv, flushed at once (rank 0 only)."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def on_train_begin(self, logs: dict | None = None) -> None:
        with open(self.path, "w", newline="") as f:
            csv.writer(f).writerow(METRICS_COLUMNS)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        row = {**logs, "epoch": epoch + 1}
        with open(self.path, "a", newline="") as f:
            csv.writer(f).writerow([_fmt(row.get(c, "")) for c in METRICS_COLUMNS])


class SavePlainModel(tf.keras.callbacks.Callback):
    """Exports the model after every epoch as a plain Keras model, atomically (rank 0 only)."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        export_plain_model(self.model, self.path)


def _fmt(v: object) -> object:
    return f"{v:.6g}" if isinstance(v, float) else v


def build_callbacks(cfg: Config, d: Derived, evaluator: Evaluator, run_dir: str) -> list:
    """The callbacks in the order they must run. Keras runs them in list order at each event,
    all on the same `logs` dict, so later callbacks see what earlier ones wrote."""
    callbacks = [
        # Horovod: rank 0's weights and optimizer state to every rank, after the first batch
        # has created the optimizer's slots (the model weights were broadcast before fit).
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Timing first, so validation time is not counted as training time.
        EpochStats(d),
        # Horovod: average the per-worker training metrics before anything reads them. All
        # workers run the same number of full batches, so the mean of means is exact here.
        hvd.callbacks.MetricAverageCallback(),
        # Step times and per-worker rate, after the averaging: it reads the workers' mean
        # epoch_time_s, as metrics.csv has it, and adds this worker's own median step.
        perf.StepTimer(d, cfg.train.epochs),
        # Validation sums and counts all-reduced: exact, and identical on every rank.
        ExactValidation(evaluator),
        # The learning-rate warm-up is not a callback: it lives in the optimizer's schedule
        # (schedules.WarmupScaled), scaled by the worker count and stepped per batch.
    ]
    if distributed.is_chief():
        # Side effects on rank 0 only: files, TensorBoard, checkpoints.
        callbacks.append(MetricsCSV(os.path.join(run_dir, "metrics.csv")))
        if cfg.logging.tensorboard:
            callbacks.append(
                tf.keras.callbacks.TensorBoard(
                    os.path.join(run_dir, "tensorboard"), profile_batch=0
                )
            )
        callbacks.append(SavePlainModel(os.path.join(run_dir, "checkpoints", "latest.keras")))
        if cfg.logging.profile_steps:
            first, last = cfg.logging.profile_steps
            callbacks.append(perf.ProfileSteps(first, last, os.path.join(run_dir, "tensorboard")))
    return callbacks
