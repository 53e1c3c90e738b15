"""Stopping together: signals and non-finite values, agreed by all workers at step boundaries.

A worker that stops alone leaves the others waiting forever in the next all-reduce. So each
worker only records what it saw (a SIGTERM or SIGINT, a NaN or infinite loss, non-finite
weights before a checkpoint) and, at the same steps on every worker, one small all-reduce
turns the local observations into one decision that every worker then acts on.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from hvd_train import distributed
from hvd_train.errors import ANOTHER_FIRST, TrainingError, exit_description
from hvd_train.keras_stack import keras

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
AUTO_EVERY_S = 1.0  # with `every` 0: agree about once a second
AUTO_MAX_STEPS = 1000
DEFAULT_GRACE_S = 3.5  # horovodrun's SIGKILL follows its SIGTERM after 5 s
_UNDER_MPI = "OMPI_COMM_WORLD_RANK" in os.environ
MPIRUN_KILL_WINDOW_S = 3.0
MPIRUN_KILLED = (
    "mpirun ended the job (SIGCONT, then SIGTERM, then SIGKILL): another worker, or its host, "
    "failed first (mpirun's output names it), or mpirun itself was stopped (to stop an MPI job "
    "with a stop checkpoint, stop hvd-train launch or launch/*.sh instead)"
)


class StopSignals:
    """Records SIGTERM/SIGINT instead of dying, so training can stop at a step boundary.

    The main thread acts on a signal only between steps (RunControl agrees on it), but a step
    can run for seconds (the first, while TensorFlow traces and compiles), longer than a
    launcher waits: horovodrun sends SIGKILL 5 s after its SIGTERM. So a watcher thread learns
    of each signal at once, through Python's wakeup fd (written by the C-level handler even
    while the main thread is inside TensorFlow), and ends the process itself, after `abandon`
    has recorded the stop, when waiting would save nothing (no step has run in this process:
    the newest checkpoint already holds everything) or, on rank 0, when the stop has not
    finished within `grace_s`. A second signal of either kind ends the process at once,
    recorded the same way: a user who presses Ctrl-C twice gets the usual immediate stop.
    """

    def __init__(self, grace_s: float | None = None) -> None:
        self.signum = 0
        self.steps_run = 0  # steps completed in this process (RunControl counts them)
        self.grace_s = stop_grace_s() if grace_s is None else grace_s
        # abandon(signum, reason, ran, failed, failed_rank): records the ending (`ran`: any
        # step ran in this process; `failed`: the launcher is killing the job, after
        # `failed_rank` failed when it said which); the watcher then ends the process.
        self.abandon: Callable[[int, str, bool, bool, int | None], None] = lambda *args: None
        self.on_signal: Callable[[int], None] = lambda signum: None
        self.chief = True  # rank 0: only it waits out the grace (the others follow it)
        self.done = threading.Event()  # set when the run has written its own ending
        self.before_exit: list[Callable[[], None]] = []  # e.g. give run.dir back
        self._previous: dict[int, object] = {}
        self._wakeup: tuple[int, int] | None = None
        self._old_wakeup = -1

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signals reach only the main thread: a caller's thread trains unguarded
        for sig in (*STOP_SIGNALS, signal.SIGCONT):
            self._previous[sig] = signal.signal(sig, self._handle)
        r, w = os.pipe()
        os.set_blocking(w, False)
        self._wakeup = (r, w)
        self._old_wakeup = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(r,), name="hvd_train-stop", daemon=True).start()

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._old_wakeup)
            os.close(self._wakeup[1])  # the watcher reads EOF and ends
            self._wakeup = None

    def _handle(self, signum: int, frame: object) -> None:
        if signum != signal.SIGCONT:
            self.signum = self.signum or signum  # the main thread's view; the watcher acts

    def _watch(self, fd: int) -> None:
        seen, continued = 0, -1e9
        while True:
            try:
                data = os.read(fd, 1)
            except OSError:
                return
            if not data:
                os.close(fd)
                return
            if data[0] == signal.SIGCONT:
                continued = time.monotonic()
                continue
            if data[0] not in STOP_SIGNALS:
                continue
            if _UNDER_MPI and time.monotonic() - continued < MPIRUN_KILL_WINDOW_S:
                # mpirun ending the job: SIGCONT, SIGTERM 1 s later, SIGKILL 1 s after that.
                # Another worker failed (or mpirun itself was told to stop): no time to save.
                self._exit(data[0], MPIRUN_KILLED, failed=True)
            seen += 1
            if seen == 1:
                threading.Thread(target=self._first, args=(data[0],), daemon=True).start()
            else:
                self._exit(data[0], "a second signal: stopped at once, no stop checkpoint")

    def _first(self, signum: int) -> None:
        self.signum = self.signum or signum
        self.on_signal(signum)
        first = horovodrun_first_failure() if signum == signal.SIGTERM else None
        if first is not None:  # not a stop: horovodrun is ending the job after a failure
            self._exit(signum, _failed_first(first), failed=True, failed_rank=first["rank"])
        if self.steps_run == 0:
            self._exit(signum, "before any step ran: nothing to save")
        if not self.chief:
            return  # rank 0 decides; when it ends, this worker's next collective fails
        if not self.done.wait(self.grace_s):
            self._exit(
                signum,
                f"its stop did not finish within {self.grace_s:g} s (the launcher's grace "
                "before SIGKILL): no stop checkpoint",
            )

    def _exit(
        self, signum: int, reason: str, failed: bool = False, failed_rank: int | None = None
    ) -> None:
        if self.done.is_set():
            return  # the run wrote its own ending meanwhile: let it exit as it does
        try:
            self.abandon(signum, reason, self.steps_run > 0, failed, failed_rank)
            for release in self.before_exit:
                release()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(128 + signum)


def horovodrun_first_failure() -> dict | None:
    """The worker that failed first, as horovodrun (Gloo) noted it in its rendezvous server
    before it sent the others SIGTERM ({"rank", "exit_code"}; scripts/patch_horovod.py);
    None when there is no such note: a stop, another launcher, or an unpatched Horovod."""
    addr = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    port = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
    if not addr or not port or os.environ.get("HOROVOD_ELASTIC") == "1":
        return None
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy
    try:
        with opener.open(f"http://{addr}:{port}/hvd_train/first_failure", timeout=2) as r:
            found = json.loads(r.read())
    except (OSError, ValueError):  # 404: no failure noted
        return None
    ok = isinstance(found, dict) and all(
        isinstance(found.get(k), int) for k in ("rank", "exit_code")
    )
    return found if ok else None


def _failed_first(first: dict) -> str:
    how = exit_description(first["exit_code"])
    return f"{ANOTHER_FIRST}: rank {first['rank']} ({how}); horovodrun then ended the job"


def stop_grace_s() -> float:
    """How long rank 0 may take to stop after a signal before it ends without a checkpoint.

    horovodrun kills a worker 5 s after SIGTERM; this leaves room to record the stop. A
    launcher that waits longer (hvd-train launch under MPI, which signals the workers itself)
    says so in HVD_TRAIN_STOP_GRACE_S.
    """
    try:
        return max(0.0, float(os.environ.get("HVD_TRAIN_STOP_GRACE_S", DEFAULT_GRACE_S)))
    except ValueError:
        return DEFAULT_GRACE_S


class RunControl(keras.callbacks.Callback):
    """Agrees, every `every` steps and whenever `checkpoint_due(step)` holds, on going on.

    `every` 0 agrees about once a second: each agreement also sums the workers' step times (in
    whole microseconds, so the sum is exact in any order and every worker computes the same
    next step to agree at). An agreement is a synchronous all-reduce outside the compiled step,
    which costs a fraction of a short step; once a second it costs nothing visible.

    A signal anywhere makes every worker stop after the same step: `stopped_at` records the
    epoch and the steps done in it, or `(epoch + 1, 0)` when the epoch was complete. A
    non-finite loss, or non-finite weights where a checkpoint is due, raise `TrainingError` on
    every worker at the same step. It also agrees at every epoch's end.

    Args:
        signals: the process's StopSignals: what this worker saw.
        every: agree every this many steps; 0: about once a second.
        steps_per_epoch: the steps of a whole epoch.
        checkpoint_due: whether a checkpoint is due after a position step (then the weights
            are checked too).
        first_step_in_epoch: the steps of the first epoch already done (a resume part-way).
            Defaults to 0.
        clock: seconds, for the step times. Defaults to `time.perf_counter`.
    """

    def __init__(
        self,
        signals: StopSignals,
        every: int,
        steps_per_epoch: int,
        checkpoint_due: Callable[[int], bool],
        first_step_in_epoch: int = 0,
        clock: Callable[[], float] = time.perf_counter,
    ):
        super().__init__()
        self.signals = signals
        self._clock = clock
        self.every = every
        self.steps_per_epoch = steps_per_epoch
        self.checkpoint_due = checkpoint_due
        self.epoch = 0
        self.step_in_epoch = 0  # steps of `epoch` done, counting those before a resume
        self._offset = first_step_in_epoch
        self.stop_signal = 0
        self.stopped_at: tuple[int, int] | None = None
        self._loss = 0.0
        self._next = 1  # with `every` 0: the position step of the next agreement
        self._restart_clock()

    def _restart_clock(self) -> None:
        self._since, self._steps = self._clock(), 0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.epoch, self.step_in_epoch = epoch, self._offset
        self._offset = 0  # only the first epoch of a resumed run starts part-way
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
        self.signals.steps_run += 1
        self.step_in_epoch += 1
        self._steps += 1
        self._loss = (logs or {}).get("loss", 0.0)
        due = self.checkpoint_due(self.position_step)
        if due or self._agreement_due():
            self.sync(check_weights=due)

    def _agreement_due(self) -> bool:
        if self.every:
            return self.position_step % self.every == 0
        return self.position_step >= self._next

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
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
    return all(bool(np.isfinite(v.numpy()).all()) for v in variables if v.dtype.is_floating)
