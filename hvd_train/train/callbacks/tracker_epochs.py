"""`TrackerEpochs`: each epoch's metrics to a run tracker (rank 0: `logging.mlflow`'s MLflow run,
`logging.wandb`'s W&B run)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from hvd_train.train.callbacks.base import Callback
from hvd_train.train.callbacks.bookkeeping import is_number
from hvd_train.train.callbacks.stop import RunControl


class EpochSink(Protocol):
    """A tracker's run that takes one epoch's values and never makes the step wait for its
    server (record/mlflow_run.py `Sender`, record/wandb_run.py `WandbRun`)."""

    def log_epoch(self, epoch: int, values: Mapping[str, float], /) -> None: ...


class TrackerEpochs(Callback):
    """Hands each completed epoch's values to a tracker's run (the epoch, 1-based): the model's
    metrics, the learning rate, examples/s, the step time, the epoch's seconds, the input wait:
    what the console line and metrics.csv hold. The tracker sends them without the step waiting
    for it. An epoch a stop cut short is left out, as metrics.csv leaves it out."""

    def __init__(self, sink: EpochSink, control: RunControl):
        super().__init__()
        self.sink, self.control = sink, control

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.control.stopped_mid_epoch():
            return
        values = {k: float(v) for k, v in (logs or {}).items()
                  if k != "epoch_examples" and is_number(v)}  # fmt: skip
        self.sink.log_epoch(epoch + 1, values)
