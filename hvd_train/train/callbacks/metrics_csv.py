"""`MetricsCSV`: run.dir's metrics.csv, one row per epoch (rank 0)."""

from __future__ import annotations

import csv

from hvd_train.train.callbacks.base import Callback
from hvd_train.train.callbacks.stop import RunControl

METRICS_COLUMNS = [
    "epoch", "loss", "accuracy", "val_loss", "val_accuracy",
    "learning_rate", "epoch_time_s", "examples_per_sec",
    "input_wait_fraction",
    "examples_per_sec_per_worker", "step_time_ms",
]  # fmt: skip


class MetricsCSV(Callback):
    """Appends one row per completed epoch to metrics.csv, flushed at once (rank 0 only).

    A fresh run starts the file; a resumed run keeps the rows of the epochs it resumes after
    and drops any later ones (written after the checkpoint it resumed from). The file is
    started when training begins (as Keras' CSVLogger opens its file), once: a resumed epoch
    and the epochs after it are two `fit` calls with the same callbacks.
    """

    def __init__(self, path: str, control: RunControl, keep_epochs: int = 0):
        super().__init__()
        self.path = path
        self.control = control
        self.keep_epochs = keep_epochs
        self._started = False

    def on_train_begin(self, logs: dict | None = None) -> None:
        if self._started:
            return
        self._started = True
        kept = _read_rows(self.path)[: self.keep_epochs] if self.keep_epochs else []
        with open(self.path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(METRICS_COLUMNS)
            w.writerows([row.get(c, "") for c in METRICS_COLUMNS] for row in kept)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.control.stopped_mid_epoch():
            return
        row = {**logs, "epoch": epoch + 1}
        with open(self.path, "a", newline="") as f:
            csv.writer(f).writerow([_fmt(row.get(c, "")) for c in METRICS_COLUMNS])


def _read_rows(path: str) -> list[dict[str, str]]:
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        return []


def _fmt(v: object) -> object:
    return f"{v:.6g}" if isinstance(v, float) else v
