"""`RecordProgress`: summary.json follows the epochs (rank 0)."""

from __future__ import annotations

from collections.abc import Callable

from hvd_train.record.run_record import RunRecord
from hvd_train.train.callbacks.base import Callback
from hvd_train.train.callbacks.stop import RunControl


class RecordProgress(Callback):
    """Keeps summary.json's epochs_completed and last_checkpoint current (rank 0), so a record
    ended by the stop watcher or the keeper says how far the run got."""

    def __init__(
        self,
        record: RunRecord,
        control: RunControl,
        latest: Callable[[], str | None] | None,
        mid_epoch: bool = True,
    ):
        """`latest`: the Checkpointer's latest checkpoint (`Checkpointer.last`); None where
        no checkpoints are written. `mid_epoch`: whether one may be written mid-epoch in this
        run (`checkpoint.every_steps` is set). Defaults to True."""
        super().__init__()
        self.record, self.control, self.latest = record, control, latest
        self.mid_epoch = mid_epoch
        self._last = latest() if latest else None

    def acts_mid_epoch(self) -> bool:
        return self.mid_epoch and self.latest is not None

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self.latest and self.latest() != self._last:  # a mid-epoch one
            self._last = self.latest()
            self.record.update(last_checkpoint=self._last)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.control.stopped_mid_epoch():
            return
        self._last = self.latest() if self.latest else None
        self.record.update(epochs_completed=epoch + 1, last_checkpoint=self._last)
