"""`MlflowEpochs`: each epoch's metrics to MLflow (rank 0, `logging.mlflow`)."""

from __future__ import annotations

from hvd_train.record.mlflow_run import Sender
from hvd_train.train.callbacks.base import Callback
from hvd_train.train.callbacks.bookkeeping import is_number
from hvd_train.train.callbacks.stop import RunControl


class MlflowEpochs(Callback):
    """Hands each completed epoch's values to rank 0's MLflow run (step = the epoch, 1-based):
    the model's metrics, the learning rate, examples/s, the step time, the epoch's seconds,
    the input wait: what the console line and metrics.csv hold. The sender's thread sends
    them: the step never waits for MLflow. An epoch a stop cut short is left out, as
    metrics.csv leaves it out."""

    def __init__(self, sender: Sender, control: RunControl):
        super().__init__()
        self.sender, self.control = sender, control

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.control.stopped_mid_epoch():
            return
        values = {k: float(v) for k, v in (logs or {}).items()
                  if k != "epoch_examples" and is_number(v)}  # fmt: skip
        self.sender.log_epoch(epoch + 1, values)
