"""`EpochLines`: the console's line per epoch (and progress lines), rank 0."""

from __future__ import annotations

import time
from collections.abc import Callable

from hvd_train.config import Derived, TrainConfig
from hvd_train.runtime import distributed
from hvd_train.train.callbacks.base import Callback
from hvd_train.train.callbacks.bookkeeping import without_bookkeeping
from hvd_train.train.callbacks.stop import RunControl


class EpochLines(Callback):
    """Rank 0's console: one line per epoch and, inside a long epoch, a progress line every
    `train.log_every_s` seconds. Put it after the callbacks that fill the epoch's logs.

    Args:
        train: the `train` section: the run's epochs (`epochs`), and the seconds between
            progress lines inside an epoch (`log_every_s`; 0: none).
        plan: the run's derived sizes (steps per epoch, global batch).
        control: the run's RunControl, run before this: the step in the epoch (counting the
            steps before a resume) and whether a stop cut the epoch short.
        log: prints one line. Defaults to `distributed.log` (rank 0, `[hvd_train]` prefix).
        clock: seconds. Defaults to `time.monotonic`.
    """

    def __init__(
        self,
        train: TrainConfig,
        plan: Derived,
        control: RunControl,
        log: Callable[[str], None] = distributed.log,
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__()
        self.epochs, self.plan, self.control = train.epochs, plan, control
        self.every_s = train.log_every_s
        self._log, self._clock = log, clock
        self._start = self._next = 0.0
        self._first_step = 0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._start = self._clock()
        self._next = self._start + self.every_s
        self._first_step = self.control.step_in_epoch  # a resumed epoch starts part-way

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        now = self._clock()
        if not self.every_s or now < self._next:
            return
        self._next = now + self.every_s
        c = self.control
        rate = (c.step_in_epoch - self._first_step) * self.plan.global_batch / (now - self._start)
        self._log(
            f"epoch {c.epoch + 1}/{self.epochs}, step {c.step_in_epoch}/{self.plan.steps_per_epoch}"
            f": {_metrics(logs)} (rank 0, so far), {rate:.0f} examples/s"
        )

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        logs = logs or {}
        if self.control.stopped_mid_epoch():
            steps = f"{self.control.step_in_epoch}/{self.plan.steps_per_epoch}"
            self._log(f"epoch {epoch + 1}/{self.epochs} stopped after step {steps}: "
                      f"{_metrics(logs)}")  # fmt: skip
            return
        extra = [
            f"lr {logs['learning_rate']:.3g}" if "learning_rate" in logs else "",
            f"{logs['examples_per_sec']:.0f} examples/s" if "examples_per_sec" in logs else "",
            f"step {logs['step_time_ms']:.1f} ms" if "step_time_ms" in logs else "",
            f"{logs['epoch_time_s']:.1f} s" if "epoch_time_s" in logs else "",
        ]
        line = ", ".join([_metrics(logs), *filter(None, extra)])
        self._log(f"epoch {epoch + 1}/{self.epochs}: {line}")


def _metrics(logs: dict | None) -> str:
    """`loss 0.4123, accuracy 0.8812, ...`: the model's metrics, the loss first, then in Keras'
    order (Keras 3 puts the compiled metrics before the loss)."""
    shown = without_bookkeeping(logs)
    first = [k for k in ("loss", "val_loss") if k in shown and k.startswith("loss")]
    order = first + [k for k in shown if k not in first]
    return ", ".join(f"{k} {float(shown[k]):.4f}" for k in order)
