"""`ExactValidation`: the epoch's validation metrics from counts summed over every worker."""

from __future__ import annotations

from hvd_train.train.callbacks.base import Callback
from hvd_train.train.callbacks.stop import RunControl
from hvd_train.train.evaluation import Evaluator


class ExactValidation(Callback):
    """Puts exact `val_loss` and `val_accuracy` into the logs (a collective: every rank).

    Skipped, on every rank alike, for an epoch that a stop cut short.
    """

    def __init__(self, evaluator: Evaluator, control: RunControl):
        super().__init__()
        self.evaluator = evaluator
        self.control = control

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if not self.control.stopped_mid_epoch():
            logs.update(self.evaluator.evaluate())
