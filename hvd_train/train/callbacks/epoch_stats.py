"""`EpochStats`: the epoch's time, examples per second and learning rate, into its logs."""

from __future__ import annotations

import time

from hvd_train.runtime.keras import binding
from hvd_train.train.callbacks.base import Callback


class EpochStats(Callback):
    """Adds `epoch_time_s` (training only), `examples_per_sec` (all workers) and
    `learning_rate` (the rate the epoch's last step used) to the epoch's logs."""

    def __init__(self, global_batch: int):
        super().__init__()
        self.global_batch = global_batch
        self._start = 0.0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        seconds = time.perf_counter() - self._start
        # The steps of this fit call's epoch: fewer than steps_per_epoch in a resumed epoch.
        logs["epoch_examples"] = self.params["steps"] * self.global_batch
        logs["epoch_time_s"] = seconds
        logs["examples_per_sec"] = logs["epoch_examples"] / seconds
        # The rate the epoch's last step used (for a schedule, Keras 3's learning_rate is the
        # next step's).
        logs["learning_rate"] = binding.active().last_learning_rate(self.model.optimizer)
