"""The callbacks that act where the replicated state must be every rank's alike: averaging
BatchNormalization's moving statistics, and the replica check."""

from __future__ import annotations

from collections.abc import Callable

from hvd_train.base.errors import ReplicaMismatch
from hvd_train.runtime import distributed, replicas
from hvd_train.train.callbacks.base import Callback
from hvd_train.train.callbacks.random_states import RandomStates
from hvd_train.train.callbacks.stop import RunControl


class _AtSyncPoints(Callback):
    """Calls `act()` where the replicated state must be every rank's alike: at each epoch's end
    and after each call into TensorFlow where `due()` holds (a checkpoint, a replica check). A
    collective: every rank at the same steps."""

    def __init__(self, control: RunControl, due: Callable[[], bool], mid_epoch: bool = True):
        """`mid_epoch`: whether `due()` can hold in this run (a mid-epoch checkpoint or check
        is set). Defaults to True."""
        super().__init__()
        self.control, self.due, self.mid_epoch = control, due, mid_epoch

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self.due():
            self.act()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.act()

    def act(self) -> None:
        raise NotImplementedError


class AverageMovingStatistics(_AtSyncPoints):
    """Averages BatchNormalization's moving statistics over the ranks at those points: before
    the exact validation at an epoch's end (the model validated is the model saved) and before
    a mid-epoch checkpoint or check (runtime/replicas.py)."""

    def act(self) -> None:
        replicas.average_moving_statistics(self.model)


class CheckReplicas(_AtSyncPoints):
    """`runtime.check_replicas`: every rank compares a fingerprint of every replicated variable
    at those points, before the checkpoint is written. Where a checkpoint may be written, the
    fingerprints ride in RandomStates' all-gather, just before (`carrier`); elsewhere they are
    all-gathered alone. A mismatch raises ReplicaMismatch on every rank alike (exit code 3),
    so none is left waiting."""

    def __init__(
        self,
        control: RunControl,
        due: Callable[[], bool],
        carrier: RandomStates,
        mid_epoch: bool = True,
    ):
        super().__init__(control, due, mid_epoch)
        self.carrier = carrier

    def on_train_begin(self, logs: dict | None = None) -> None:
        # The replicated variables, found once a `fit` (the checkpoint's graph is walked once).
        self._fingerprints = replicas.Fingerprints(self.model)
        self.carrier.also = self._fingerprints.mine

    def act(self) -> None:
        every, self.carrier.also_gathered = self.carrier.also_gathered, None
        if distributed.size() == 1:
            return
        prints = self._fingerprints
        found = replicas.disagreement([n for n, _ in prints.named], every or prints.gather())
        if found is not None:
            c = self.control
            raise ReplicaMismatch(
                f"the ranks hold different model or optimizer state at epoch {c.epoch + 1}, "
                f"step {c.step_in_epoch}: {found}; stopped without writing a checkpoint (the "
                "last one was checked before it was written: docs/faults.md#replica-check)"
            )
