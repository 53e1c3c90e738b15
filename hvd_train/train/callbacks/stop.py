"""Stopping together: signals and non-finite values, agreed by all workers at step boundaries
(`RunControl`), and the users' callbacks' stops, agreed at each epoch's end (`AgreedStop`).

A worker that stops alone leaves the others waiting forever in the next all-reduce. So each
worker only records what it saw (a SIGTERM or SIGINT, a NaN or infinite loss, non-finite
weights before a checkpoint) and, at the same steps on every worker, one small all-reduce
turns the local observations into one decision that every worker then acts on.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from hvd_train.base.errors import TrainingError
from hvd_train.config import CheckpointConfig
from hvd_train.record.stops import StopSignals
from hvd_train.record.summary import StoppedEarly
from hvd_train.runtime import distributed
from hvd_train.train.callbacks.base import Callback, passes

AUTO_EVERY_S = 1.0  # with `every` 0: agree about once a second
AUTO_MAX_STEPS = 1000


class RunControl(Callback):
    """Agrees, every `every` steps and wherever a checkpoint is due, on going on.

    `every` 0 agrees about once a second: each agreement also sums the workers' step times (in
    whole microseconds, so the sum is exact in any order and every worker computes the same
    next step to agree at). An agreement is a synchronous all-reduce outside the compiled step,
    which costs a fraction of a short step; once a second it costs nothing visible.

    A signal anywhere makes every worker stop after the same step: `stopped_at` records the
    epoch and the steps done in it, or `(epoch + 1, 0)` when the epoch was complete. A
    non-finite loss, or non-finite weights where a checkpoint is due, raise `TrainingError` on
    every worker at the same step. It also agrees at every epoch's end.

    The steps are counted from the batch index Keras gives the hook: with
    `train.steps_per_execution` K, the hooks run once per call into TensorFlow, after its K
    steps, so "every N steps" means at the end of the call that reaches or passes each Nth
    step (`passed`): the same steps on every worker.

    Args:
        signals: the process's StopSignals: what this worker saw.
        checkpoint: the `checkpoint` section: `check_every_steps`, agree every this many
            steps (0: about once a second); `every_steps`, a checkpoint is due every this
            many position steps (then the weights are checked too; None: none mid-epoch).
        steps_per_epoch: the steps of a whole epoch.
        first_step_in_epoch: the steps of the first epoch already done (a resume part-way).
            Defaults to 0.
        clock: seconds, for the step times. Defaults to `time.perf_counter`.
    """

    def __init__(
        self,
        signals: StopSignals,
        checkpoint: CheckpointConfig,
        steps_per_epoch: int,
        first_step_in_epoch: int = 0,
        clock: Callable[[], float] = time.perf_counter,
    ):
        super().__init__()
        self.signals = signals
        self._clock = clock
        self.every = checkpoint.check_every_steps
        self.steps_per_epoch = steps_per_epoch
        self.checkpoint_every = checkpoint.every_steps
        self.epoch = 0
        self.step_in_epoch = 0  # steps of `epoch` done, counting those before a resume
        self._offset = first_step_in_epoch
        self._fit_start = 0  # steps of `epoch` done before this `fit` began it
        self._previous = 0  # the position step before the last call's steps
        self.stop_signal = 0
        self.stopped_at: tuple[int, int] | None = None
        self._loss = 0.0
        self._next = 1  # with `every` 0: the position step of the next agreement
        self._restart_clock()

    def _restart_clock(self) -> None:
        self._since, self._steps = self._clock(), 0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.epoch, self.step_in_epoch = epoch, self._offset
        self._fit_start, self._offset = self._offset, 0  # only a resumed run's first epoch
        self._previous = self.position_step
        # Every rank starts the epoch when the last one arrives, so this clock and those of
        # the callbacks after it (EpochStats, StepTimer) do not count an early rank's wait
        # for rank 0's side effects of the last epoch (checkpoint, metrics.csv) as step time.
        distributed.barrier("hvd_train.epoch_start")
        self._restart_clock()  # validation and epoch-end work are not step time
        # Auto interval: agree at the epoch's first step too. A signal that came during the
        # epoch-end work (or between a resumed run's part-done epoch and the rest) is then
        # acted on one step later, not a second later; launchers give ~5 s before SIGKILL.
        self._next = min(self._next, self.position_step + 1)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        # A part-done epoch's fit counts its steps from its first step left.
        done = self._fit_start + self.steps_done(batch)
        ran = done - self.step_in_epoch
        self._previous = self.position_step
        self.signals.steps_run += ran
        self.step_in_epoch = done
        self._steps += ran
        self._loss = (logs or {}).get("loss", 0.0)
        due = self.passed(self.checkpoint_every)
        if due or self._agreement_due():
            self.sync(check_weights=due)

    def passed(self, every: int | None) -> bool:
        """Whether the last call's steps reached or passed a multiple of `every` position
        steps (with one step a call: whether the position is a multiple of it)."""
        return passes(every, self._previous, self.position_step)

    def _agreement_due(self) -> bool:
        if self.every:
            return self.passed(self.every)
        return self.position_step >= self._next

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.stopped_at is None and self.step_in_epoch < self.steps_per_epoch:
            # Keras ends an epoch early, quietly, on TensorFlow's end-of-data error from a
            # step, a callback or the input (and leaves later epochs empty): not a stop.
            raise TrainingError(
                f"epoch {epoch + 1} ended after {self.step_in_epoch} of its "
                f"{self.steps_per_epoch} steps, with no stop: Keras took an end-of-data error "
                "(OutOfRangeError) raised in a step, a callback or the input for the end of "
                "its data; the run is not complete (its log has Keras' warning)"
            )
        if self.stopped_at is None:
            self._loss = (logs or {}).get("loss", self._loss)
            self.sync(check_weights=True)

    @property
    def position_step(self) -> int:
        """Steps since the run began, by position: the same on every worker, across resumes."""
        return self.epoch * self.steps_per_epoch + self.step_in_epoch

    @property
    def stopping(self) -> bool:
        return self.stopped_at is not None

    def stopped_mid_epoch(self) -> bool:
        return self.stopped_at is not None and self.stopped_at[1] > 0

    def sync(self, check_weights: bool = False) -> None:
        """One all-reduce of every worker's observations; acts on the agreed decision."""
        weights_bad = check_weights and not _all_finite(self.model.weights)
        step_us = round(1e6 * (self._clock() - self._since) / max(self._steps, 1))
        local = [
            float(self.signals.signum),
            0.0 if _finite(self._loss) else 1.0,
            1.0 if weights_bad else 0.0,
            float(step_us),
        ]
        if distributed.size() > 1:
            agreed = distributed.allreduce_sum(local, name="run_control")
        else:
            agreed = local
        signals, bad_loss, bad_weights, step_us_sum = agreed
        mean_step_s = step_us_sum / distributed.size() / 1e6
        steps = AUTO_EVERY_S / mean_step_s if mean_step_s > 0 else 1
        self._next = self.position_step + int(min(max(steps, 1), AUTO_MAX_STEPS))
        self._restart_clock()
        where = f"epoch {self.epoch + 1}, step {self.step_in_epoch}"
        if bad_loss or bad_weights:
            what = "loss" if bad_loss else "weights"
            raise TrainingError(
                f"the training {what} became NaN or infinite at {where}; stopped without "
                "writing a checkpoint (the last good one is kept). Lower optimizer.learning_rate, "
                "add optimizer.warmup_epochs, or check the data for invalid values"
            )
        if signals and self.stopped_at is None:
            self.stop_signal = self.signals.signum or int(signal.SIGTERM)
            # After an epoch's last step the epoch is complete: its end-of-epoch work
            # (validation, metrics, checkpoint) runs, and training resumes at the next epoch.
            if self.step_in_epoch >= self.steps_per_epoch:
                self.stopped_at = (self.epoch + 1, 0)
            else:
                self.stopped_at = (self.epoch, self.step_in_epoch)
            self.model.stop_training = True
            distributed.log(f"{signal.Signals(self.stop_signal).name}: stopping after {where}")


def _finite(value: object) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return True


def _all_finite(variables: list[tf.Variable]) -> bool:
    # tf.as_dtype: Keras 3 names a variable's dtype as a string ("float32").
    return all(
        bool(np.isfinite(v.numpy()).all()) for v in variables if tf.as_dtype(v.dtype).is_floating
    )


class AgreedStop(Callback):
    """Makes the users' stop requests one decision of all workers, at each epoch's end.

    Within an epoch, a user's stop is held (`model.stop_training` put back to False): Keras
    would leave the epoch at once on this rank alone. At the epoch's end every rank sends which
    of the user callbacks asked to stop; if any did on any rank, every rank stops there.

    Args:
        names: the class name of each `callbacks:` item, in config order (the same on every
            rank, whichever of them run here).
        control: RunControl, whose stops (signals) are left alone.
    """

    def __init__(self, names: list[str], control: RunControl):
        super().__init__()
        self.names, self.control = names, control
        self.asked: set[int] = set()  # indices of the user callbacks that asked to stop
        self.stopped_early: StoppedEarly | None = None

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self.asked and not self.control.stopping:
            self.model.stop_training = False  # held until the epoch's end, on every rank

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        local = [1.0 if i in self.asked else 0.0 for i in range(len(self.names))]
        # Horovod: one small all-reduce on every rank at every epoch's end, asked or not.
        agreed = (
            distributed.allreduce_sum(local, name="user_stop") if distributed.size() > 1 else local
        )
        self.asked.clear()
        if not any(agreed):
            return
        self.model.stop_training = True
        if self.stopped_early is None and not self.control.stopping:
            by = self.names[next(i for i, n in enumerate(agreed) if n)]
            self.stopped_early = {"epoch": epoch + 1, "by": by}
            distributed.log(f"{by} stopped the run after epoch {epoch + 1}")
