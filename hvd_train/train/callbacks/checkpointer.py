"""`Checkpointer`: the resumable checkpoints and the best model, at their intervals (rank 0)."""

from __future__ import annotations

import math
import os
import time

import tensorflow as tf

from hvd_train.data.job import Job
from hvd_train.record.layout import RunDir
from hvd_train.runtime.keras import binding
from hvd_train.runtime.schedules import lr_multiplier
from hvd_train.train.callbacks.base import Callback
from hvd_train.train.callbacks.bookkeeping import is_number
from hvd_train.train.callbacks.random_states import RandomStates
from hvd_train.train.callbacks.stop import RunControl
from hvd_train.train.checkpoint import (
    CheckpointState,
    CheckpointStore,
    export_plain_model,
    monitor_mode,
    read_state,
    write_error,
)


class Checkpointer(Callback):
    """Writes resumable checkpoints where the workers agreed it is safe (rank 0 only).

    Every `checkpoint.every_epochs` epochs, the last epoch (`epochs`), every
    `checkpoint.every_steps` steps, and where a signal stopped the run. RunControl, earlier in the callback list, has
    already checked on every worker that loss and weights are finite at those points. The best
    epoch by `checkpoint.monitor` is also exported as the plain model `best.keras`.

    A write that fails (disk full, no permission) raises `CheckpointError` and ends the run:
    the previous checkpoints stay as they were, and summary.json says `failed`
    (record/run_record.py keeps room for it). The other ranks then fail in their next
    collective.

    Args:
        job: the derived sizes the checkpoints record (steps per epoch, batches, workers);
            from the config, the `checkpoint` section (when to write, and the metric for the
            best), the run's epochs (`train.epochs`), `runtime.seed` (recorded in every
            checkpoint's state) and run.dir (the best epoch's plain model goes to
            run.dir/best.keras).
        store: run.dir's checkpoints.
        control: the run's RunControl, earlier in the list: the position, and the stops.
        random: every rank's random states, gathered where a checkpoint may be written
            (earlier in the list); kept in each checkpoint's state. Defaults to None (none).
    """

    def __init__(
        self,
        job: Job,
        store: CheckpointStore,
        control: RunControl,
        random: RandomStates | None = None,
    ):
        super().__init__()
        cfg, checkpoint = job.cfg, job.cfg.checkpoint
        self.store, self.control, self.plan, self.k = store, control, job.plan, checkpoint
        self.epochs, self.seed, self.random = cfg.train.epochs, cfg.runtime.seed, random
        run = RunDir(cfg.run.dir)
        self.best_path = run.best
        self.last: str | None = store.newest()
        best = store.best()
        self.best_value = read_state(best)["metrics"][checkpoint.monitor] if best else None
        # A resumed run's best model, exported by an earlier job (best.keras, or its SavedModel
        # folder or weights: checkpoint.export_plain_model), stays its best until beaten.
        found = [p for p in run.best_forms() if os.path.exists(p)] if self.last is not None else []
        self.best_model: str | None = found[-1] if found else None

    def acts_mid_epoch(self) -> bool:
        return bool(self.k.every_steps)

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        c = self.control
        if c.stopping or c.step_in_epoch == self.plan.steps_per_epoch:
            return  # written at the epoch's end
        if c.passed(self.k.every_steps):
            self._save(c.epoch, c.step_in_epoch, "every_steps")

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        c, k = self.control, self.k
        if c.stopped_mid_epoch():
            self._save(*c.stopped_at, "stopped")
            return
        due = (
            (k.every_epochs and (epoch + 1) % k.every_epochs == 0)
            or epoch + 1 == self.epochs
            or c.stopping
            or self.model.stop_training  # the users' callbacks stopped early (agreed)
            or c.passed(k.every_steps)
        )
        metrics = {key: float(v) for key, v in (logs or {}).items() if is_number(v)}
        # best.keras before the checkpoint: if its write fails, a rerun resumes before this
        # epoch and exports it again (after the checkpoint, it would resume past it).
        self._export_if_best(metrics)
        if due:
            self._save(epoch + 1, 0, "stopped" if c.stopping else "epoch_end", metrics)

    def _save(self, epoch: int, step: int, reason: str, metrics: dict | None = None) -> None:
        plan = self.plan
        state: CheckpointState = {
            "global_step": int(self.model.optimizer.iterations.numpy()),
            "epoch": epoch,  # the epoch to continue (0-based); `step` of its steps are done
            "step": step,
            "examples_in_epoch": step * plan.global_batch,
            "epochs": self.epochs,
            "steps_per_epoch": plan.steps_per_epoch,
            "world_size": plan.world_size,
            "per_worker_batch": plan.per_worker_batch,
            "global_batch": plan.global_batch,
            "seed": self.seed,
            "reason": reason,
            "metrics": metrics or {},
            "lr_multiplier": float(lr_multiplier(self.model.optimizer) or 1.0),  # ReduceLROnPlateau
            "keras": binding.active().describe(),  # the other Keras cannot read it
            # Every rank's dropout generators: a resume at this worker count draws on as the
            # uninterrupted run (random_states.py).
            "random_states": self.random.gathered if self.random else None,
            "time": time.time(),
        }
        window = self.random.sums if self.random else None
        self.last = self.store.save(self.model, state, window)  # CheckpointError ends the run

    def _export_if_best(self, metrics: dict[str, float]) -> None:
        value = metrics.get(self.k.monitor)
        if value is None or not math.isfinite(value):
            return
        better = max if monitor_mode(self.k) == "max" else min
        if self.best_value is not None and better(value, self.best_value) != value:
            return
        if value == self.best_value and self.best_model:
            return
        self.best_value = value
        try:
            self.best_model = export_plain_model(self.model, self.best_path)
        except (OSError, tf.errors.OpError) as e:
            raise write_error(self.best_path, e, self.last) from e
