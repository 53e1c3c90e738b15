"""Horovod Elastic for Keras: training goes on when workers leave (or join).

Launched by `horovodrun --host-discovery-script ... --min-np ... --max-np ...` (`hvd-train
launch` builds that command when `elastic.enabled` is true). The model and optimizer state are
committed in memory every `elastic.commit_every_steps` steps and at every epoch's end. When a
worker fails, the survivors roll back to the last commit, Horovod re-forms the ring with the
workers that are left, and training continues: batch sizes, the learning-rate scaling and the
data shards are recomputed for the new worker count, and the epoch continues after the
examples already used (rounded down to a whole global batch). Checkpoints to disk go on as
usual, written by whichever worker is rank 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hvd_train.config import Derived
from hvd_train.data.job import Job, Position
from hvd_train.runtime import distributed, replicas
from hvd_train.runtime.keras import binding
from hvd_train.runtime.schedules import continue_at, learning_rate_schedule, lr_multiplier
from hvd_train.train.callbacks.base import Callback, passes
from hvd_train.train.callbacks.callback_list import RunCallbacks
from hvd_train.train.run.fitting import fit_from


class TrackPosition(Callback):
    """Keeps the elastic state's position (epoch, steps done, their global batch) current, and
    commits the state (in memory) with it: every `every_steps` steps and at each epoch's end.

    Counted from the batch index Keras gives (the last step of each call into TensorFlow: one
    call runs `train.steps_per_execution` steps), so a commit comes at the end of the call that
    reaches or passes each `every_steps`th step of the epoch, and holds the position of the
    weights it holds.
    """

    def __init__(self, state: Any, d: Derived, every_steps: int):
        super().__init__()
        self.state, self.d, self.every_steps = state, d, every_steps
        self._fit_start = 0  # the epoch's steps done before this `fit` began it

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._fit_start = self.state.batch

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        before = self.state.batch
        self.state.batch = self._fit_start + self.steps_done(batch)
        self.state.global_batch = self.d.global_batch
        if passes(self.every_steps, before, self.state.batch):
            self.state.commit()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.epoch, self.state.batch = epoch + 1, 0
        self.state.commit()


def fit_elastic(
    model: Any,
    job: Job,
    start: Position,
    make_callbacks: Callable[[Job, Position, tuple], RunCallbacks],
) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Trains to `train.epochs` under Horovod Elastic from `start`; returns the history and a
    report.

    `make_callbacks(job, at, leading)` builds this membership's callbacks (they depend on the
    worker count, which `job`'s plan is for, and on which worker is rank 0), with `leading`
    first.
    """
    history: dict[str, list[float]] = {}
    report: dict[str, Any] = {"resets": 0, "world_sizes": []}
    active = binding.active()
    state = active.elastic_state(model, epoch=start.epoch, batch=start.step, global_batch=0)

    def on_reset() -> None:
        report["resets"] += 1
        distributed.log(f"elastic reset: now {distributed.size()} worker(s)")

    state.register_reset_callbacks([on_reset])

    @replicas.elastic_run
    def run(state: Any) -> None:
        # The plan follows the worker count: a new job for this membership, `job` unchanged.
        resized = job.resized(distributed.size())
        d = resized.plan
        report["world_sizes"].append(d.world_size)
        epoch, step = state.epoch, state.batch
        if step and state.global_batch and state.global_batch != d.global_batch:
            step = step * state.global_batch // d.global_batch  # same examples, new batch
        if step >= d.steps_per_epoch:
            epoch, step = epoch + 1, 0
        state.epoch, state.batch = epoch, step
        rescale_learning_rate(model, resized, epoch + step / d.steps_per_epoch)
        # Horovod Elastic: the position, committed (in memory) with the state every N steps
        # and at each epoch's end.
        leading = (TrackPosition(state, d, job.cfg.elastic.commit_every_steps),)
        callbacks = make_callbacks(resized, Position(epoch, step), leading)
        fit_from(model, resized, Position(epoch, step), callbacks, history)

    run(state)
    return history, report


def rescale_learning_rate(model: Any, job: Job, epoch: float) -> None:
    """Gives the optimizer the schedule of `job`'s worker count, with the rate multiplier it
    had, its next step at `epoch` of the run (the step counter went on at other steps per
    epoch), and retraces the step (the traced step holds the old rates as constants)."""
    schedule = learning_rate_schedule(job.cfg, job.plan)
    multiplier = lr_multiplier(model.optimizer)
    if multiplier is not None:
        schedule.multiplier.assign(multiplier)
    model.optimizer.learning_rate = schedule  # Keras's setter takes a schedule, built or not
    continue_at(model.optimizer, epoch)
    model.train_function = None
