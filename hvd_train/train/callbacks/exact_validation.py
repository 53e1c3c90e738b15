"""`ExactValidation`: the epoch's validation metrics from counts summed over every worker."""

from __future__ import annotations

from collections.abc import Callable

from hvd_train.train.callbacks.base import Callback
from hvd_train.train.evaluation import Evaluator


class ExactValidation(Callback):
    """Puts exact `val_loss` and `val_accuracy` into the logs (a collective: every rank).

    Skipped, on every rank alike, for an epoch that a stop cut short (`stopped_mid_epoch`, the
    run's agreed stop: `RunControl.stopped_mid_epoch`).
    """

    def __init__(self, evaluator: Evaluator, stopped_mid_epoch: Callable[[], bool]):
        super().__init__()
        self.evaluator = evaluator
        self.stopped_mid_epoch = stopped_mid_epoch

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if not self.stopped_mid_epoch():
            logs.update(self.evaluator.evaluate())
