"""The training callbacks, and `build_callbacks`, the one place that fixes their order."""

from __future__ import annotations

import csv
import functools
import inspect
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import tensorflow as tf

from hvd_train.base.errors import ReplicaMismatch, UserError
from hvd_train.config import CheckpointConfig, Config, Derived, LoggingConfig
from hvd_train.data.diagnostics import advice_for
from hvd_train.data.sources import Source
from hvd_train.record.layout import RunDir, saved_model_folder, weights_file
from hvd_train.record.mlflow_run import Sender
from hvd_train.record.run_record import RunRecord
from hvd_train.record.stops import StopSignals
from hvd_train.runtime import distributed, replicas
from hvd_train.runtime.keras import binding
from hvd_train.runtime.schedules import lr_multiplier
from hvd_train.train import perf
from hvd_train.train.callback_base import Callback
from hvd_train.train.checkpoint import (
    CheckpointStore,
    export_plain_model,
    monitor_mode,
    read_state,
    write_error,
)
from hvd_train.train.control import RunControl
from hvd_train.train.evaluation import Evaluator
from hvd_train.train.input_wait import InputWait
from hvd_train.train.random_states import RandomStates
from hvd_train.train.user_callbacks import AgreedStop, build_user_callbacks

METRICS_COLUMNS = [
    "epoch", "loss", "accuracy", "val_loss", "val_accuracy",
    "learning_rate", "epoch_time_s", "examples_per_sec",
    "input_wait_fraction",
    "examples_per_sec_per_worker", "step_time_ms",
]  # fmt: skip

# Bookkeeping that the callbacks below put into the epoch's logs for metrics.csv, the history
# and summary.json, and that stays out of what Keras prints. TensorBoard gets it under these
# tags: Keras' own callback prefixes `epoch_` to every key (`epoch_epoch_examples`).
# `learning_rate` is left to that callback, which writes `epoch_learning_rate` from the schedule.
BOOKKEEPING_TAGS = {
    "epoch_examples": "throughput/epoch_examples",
    "epoch_time_s": "throughput/epoch_time_s",
    "examples_per_sec": "throughput/examples_per_sec",
    "examples_per_sec_per_worker": "throughput/examples_per_sec_per_worker",
    "step_time_ms": "throughput/step_time_ms_median",
    "input_wait_fraction": "input/wait_fraction",
}
BOOKKEEPING = frozenset([*BOOKKEEPING_TAGS, "learning_rate"])


def without_bookkeeping(logs: dict | None) -> dict:
    """The logs a person reads: the model's metrics, without `BOOKKEEPING`."""
    return {k: v for k, v in (logs or {}).items() if k not in BOOKKEEPING}


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


class _AtSyncPoints(Callback):
    """Calls `act()` where the replicated state must be every rank's alike: at each epoch's end
    and after each call into TensorFlow where `due()` holds (a checkpoint, a replica check). A
    collective: every rank at the same steps."""

    def __init__(self, control: RunControl, due: Callable[[], bool]):
        super().__init__()
        self.control, self.due = control, due

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

    def __init__(self, control: RunControl, due: Callable[[], bool], carrier: RandomStates):
        super().__init__(control, due)
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


class MetricsCSV(Callback):
    """Appends one row per completed epoch to metrics.csv, flushed at once (rank 0 only).

    A fresh run starts the file; a resumed run keeps the rows of the epochs it resumes after
    and drops any later ones (written after the checkpoint it resumed from). The file is
    started when training begins (as Keras' CSVLogger opens its file), once: a resumed epoch
    and the epochs after it are two `fit` calls with the same callbacks.
    """

    def __init__(self, path: str, control: RunControl, keep_epochs: int = 0):
        super().__init__()
        self.path = path
        self.control = control
        self.keep_epochs = keep_epochs
        self._started = False

    def on_train_begin(self, logs: dict | None = None) -> None:
        if self._started:
            return
        self._started = True
        kept = _read_rows(self.path)[: self.keep_epochs] if self.keep_epochs else []
        with open(self.path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(METRICS_COLUMNS)
            w.writerows([row.get(c, "") for c in METRICS_COLUMNS] for row in kept)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.control.stopped_mid_epoch():
            return
        row = {**logs, "epoch": epoch + 1}
        with open(self.path, "a", newline="") as f:
            csv.writer(f).writerow([_fmt(row.get(c, "")) for c in METRICS_COLUMNS])


class MlflowEpochs(Callback):
    """Hands each completed epoch's values to rank 0's MLflow run (step = the epoch, 1-based):
    the model's metrics, the learning rate, examples/s, the step time, the epoch's seconds,
    the input wait: what the console line and metrics.csv hold. The sender's thread sends
    them: the step never waits for MLflow. An epoch a stop cut short is left out, as
    metrics.csv leaves it out."""

    def __init__(self, sender: Sender, control: RunControl):
        super().__init__()
        self.sender, self.control = sender, control

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.control.stopped_mid_epoch():
            return
        values = {k: float(v) for k, v in (logs or {}).items()
                  if k != "epoch_examples" and _is_number(v)}  # fmt: skip
        self.sender.log_epoch(epoch + 1, values)


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
        store: run.dir's checkpoints.
        control: the run's RunControl, earlier in the list: the position, and the stops.
        plan: the derived sizes the checkpoints record (steps per epoch, batches, workers).
        checkpoint: the `checkpoint` section: when to write, and the metric for the best.
        epochs: the run's epochs (`train.epochs`).
        seed: `runtime.seed`, recorded in every checkpoint's state.
        best_path: where the best epoch's plain model goes (run.dir/best.keras).
        random: every rank's random states, gathered where a checkpoint may be written
            (earlier in the list); kept in each checkpoint's state. Defaults to None (none).
    """

    def __init__(
        self,
        store: CheckpointStore,
        control: RunControl,
        plan: Derived,
        checkpoint: CheckpointConfig,
        epochs: int,
        seed: int,
        best_path: str,
        random: RandomStates | None = None,
    ):
        super().__init__()
        self.store, self.control, self.plan, self.k = store, control, plan, checkpoint
        self.epochs, self.seed, self.best_path, self.random = epochs, seed, best_path, random
        self.last: str | None = store.newest()
        best = store.best()
        self.best_value = read_state(best)["metrics"][checkpoint.monitor] if best else None
        # A resumed run's best model, exported by an earlier job (best.keras, or its SavedModel
        # folder or weights: checkpoint.export_plain_model), stays its best until beaten.
        exported = [saved_model_folder(best_path), weights_file(best_path), best_path]
        found = [p for p in exported if os.path.exists(p)] if self.last is not None else []
        self.best_model: str | None = found[-1] if found else None

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
        metrics = {key: float(v) for key, v in (logs or {}).items() if _is_number(v)}
        # best.keras before the checkpoint: if its write fails, a rerun resumes before this
        # epoch and exports it again (after the checkpoint, it would resume past it).
        self._export_if_best(metrics)
        if due:
            self._save(epoch + 1, 0, "stopped" if c.stopping else "epoch_end", metrics)

    def _save(self, epoch: int, step: int, reason: str, metrics: dict | None = None) -> None:
        plan = self.plan
        state = {
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


class EpochLines(Callback):
    """Rank 0's console: one line per epoch and, inside a long epoch, a progress line every
    `every_s` seconds. Put it after the callbacks that fill the epoch's logs.

    Args:
        epochs: the run's epochs (`train.epochs`).
        plan: the run's derived sizes (steps per epoch, global batch).
        control: the run's RunControl, run before this: the step in the epoch (counting the
            steps before a resume) and whether a stop cut the epoch short.
        every_s: seconds between progress lines inside an epoch; 0: none.
        log: prints one line. Defaults to `distributed.log` (rank 0, `[hvd_train]` prefix).
        clock: seconds. Defaults to `time.monotonic`.
    """

    def __init__(
        self,
        epochs: int,
        plan: Derived,
        control: RunControl,
        every_s: float,
        log: Callable[[str], None] = distributed.log,
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__()
        self.epochs, self.plan, self.control, self.every_s = epochs, plan, control, every_s
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


def wants_progress_bar(verbose: int) -> bool:
    """Keras' live bar: `train.verbose: 2`, on rank 0, when its stdout is a terminal. In a pipe
    (horovodrun, a file) its frames pile up into kilobyte-long lines. Under mpirun too, whose
    ranks write to a terminal of its own (a pseudo-terminal it reads, then prefixes and
    forwards each line: `isatty()` says yes, and the console got the frames, tagged)."""
    under_mpirun = distributed.controller() == "mpi"
    return verbose == 2 and distributed.is_chief() and sys.stdout.isatty() and not under_mpirun


def ProgressBar() -> Any:  # noqa: N802 - a callback class to its callers
    """Keras' progress bar without the bookkeeping (see `wants_progress_bar`). In the callback
    list, Keras uses it instead of adding its own."""
    return _progress_bar_class(binding.keras())()


@functools.cache
def _progress_bar_class(keras: ModuleType) -> type:
    class ProgressBar(keras.callbacks.ProgbarLogger):
        def __init__(self) -> None:
            # Keras 2 counts steps when told (its default is samples); Keras 3 always does.
            steps = "count_mode" in inspect.signature(keras.callbacks.ProgbarLogger).parameters
            super().__init__(**({"count_mode": "steps"} if steps else {}))

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            super().on_train_batch_end(batch, without_bookkeeping(logs))

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            super().on_epoch_end(epoch, without_bookkeeping(logs))

    return ProgressBar


def TensorBoard(log_dir: str) -> Any:  # noqa: N802 - a callback class to its callers
    """Keras' TensorBoard callback, with the bookkeeping under `BOOKKEEPING_TAGS` (rank 0)."""
    return _tensorboard_class(binding.keras())(log_dir, profile_batch=0)


@functools.cache
def _tensorboard_class(keras: ModuleType) -> type:
    class TensorBoard(keras.callbacks.TensorBoard):
        # Epoch summaries only (update_freq "epoch", no profiling): at a batch's end it has
        # nothing to do but write the model's graph, once; with the logs left as tensors.
        _supports_tf_logs = True

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            if self._should_write_train_graph:
                super().on_train_batch_end(batch, logs)

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            logs = logs or {}
            super().on_epoch_end(epoch, without_bookkeeping(logs))
            # Keras' own "train" writer: one event file per run folder, which TensorBoard reads
            # as it grows (a second writer's file there would stop the first being re-read).
            with tf.summary.record_if(True), self._train_writer.as_default():
                for key, tag in BOOKKEEPING_TAGS.items():
                    if key in logs:
                        tf.summary.scalar(tag, logs[key], step=epoch)

    return TensorBoard


def _is_number(v: object) -> bool:
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def _read_rows(path: str) -> list[dict[str, str]]:
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        return []


def _fmt(v: object) -> object:
    return f"{v:.6g}" if isinstance(v, float) else v


class RecordProgress(Callback):
    """Keeps summary.json's epochs_completed and last_checkpoint current (rank 0), so a record
    ended by the stop watcher or the keeper says how far the run got."""

    def __init__(self, record: RunRecord, control: RunControl, checkpointer: Checkpointer | None):
        super().__init__()
        self.record, self.control, self.checkpointer = record, control, checkpointer
        self._last = checkpointer.last if checkpointer else None

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self.checkpointer and self.checkpointer.last != self._last:  # a mid-epoch one
            self._last = self.checkpointer.last
            self.record.update(last_checkpoint=self._last)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.control.stopped_mid_epoch():
            return
        self._last = self.checkpointer.last if self.checkpointer else None
        self.record.update(epochs_completed=epoch + 1, last_checkpoint=self._last)


@dataclass(frozen=True)
class RunCallbacks:
    """The callbacks of one `fit` (of one membership, under Horovod Elastic): `all` in the
    order Keras runs them, and the ones the trainer talks to."""

    all: tuple[Any, ...]
    plan: Derived  # the sizes they were built for
    control: RunControl  # the agreed stop: where and why the run stopped
    input_wait: InputWait  # `fit` takes the dataset its `attach` returns
    timer: perf.StepTimer  # the step times for summary.json
    user_stop: AgreedStop | None  # whether the users' callbacks ended the run early
    checkpointer: Checkpointer | None  # rank 0's; None elsewhere


def build_callbacks(
    cfg: Config,
    plan: Derived,
    model: Any,
    source: Source,
    signals: StopSignals,
    epoch: int,
    first_step: int,
    record: RunRecord | None = None,
    leading: tuple[Any, ...] = (),
    mlflow: Sender | None = None,
) -> RunCallbacks:
    """Every callback of the run, built and placed in the one order that works (see below).

    Args:
        cfg: the config.
        plan: the derived sizes for this worker count.
        model: the compiled model (for the exact validation).
        source: the data (its validation split).
        signals: the process's StopSignals, which RunControl turns into agreed stops.
        epoch: the epoch training starts at (0-based); metrics.csv keeps the rows before it.
        first_step: the steps of that epoch already done (a resume part-way).
        record: rank 0's summary.json, kept current after each epoch; None elsewhere (and on
            a survivor that became rank 0 under Horovod Elastic). Defaults to None.
        leading: callbacks that run before all of these: Horovod Elastic's state commit and
            position tracking. Defaults to none.
        mlflow: rank 0's MLflow run (logging.mlflow; train/tracking.py), which gets each
            epoch's values. Defaults to None (none).

    Raises:
        ConfigError: a `callbacks:` item that cannot be built (user_callbacks).
    """
    active = binding.active()
    control = RunControl(
        signals,
        cfg.checkpoint.check_every_steps,
        plan.steps_per_epoch,
        cfg.checkpoint.every_steps,
        first_step_in_epoch=first_step,
    )
    user = build_user_callbacks(cfg.callbacks, control)
    input_wait = InputWait(
        cfg.data.input_wait_warning, advice_for(cfg.data.source),
        steps_per_execution=cfg.train.steps_per_execution,
    )  # fmt: skip
    timer = perf.StepTimer(plan)
    evaluator = Evaluator(model, source, plan.per_worker_batch, cfg.model.from_logits)
    random = RandomStates(control, cfg.checkpoint.every_steps)
    checking = cfg.runtime.check_replicas != "off"

    def sync_due() -> bool:
        """Mid-epoch, where the replicated state must be every rank's alike: a checkpoint,
        and the replica checks asked for."""
        every = cfg.runtime.check_replicas_every_steps if checking else None
        return control.passed(cfg.checkpoint.every_steps) or control.passed(every)

    checkpointer = None
    if distributed.is_chief():
        store = CheckpointStore(cfg.run.dir, cfg.checkpoint)
        best_path = RunDir(cfg.run.dir).best
        checkpointer = Checkpointer(
            store, control, plan, cfg.checkpoint, cfg.train.epochs, cfg.runtime.seed, best_path,
            random,
        )  # fmt: skip
    chief = (
        _chief_callbacks(cfg, plan, control, epoch, checkpointer, mlflow) if checkpointer else []
    )
    # Keras runs callbacks in list order at each event, all on the same `logs` dict, so later
    # callbacks see what earlier ones wrote. The order, and why:
    callbacks = [
        # Horovod Elastic's commit and position tracking, when elastic (they see every step).
        *leading,
        # The input wait first: its epoch end is a collective, and its value must reach the
        # files written below.
        input_wait,
        # Horovod: rank 0's weights and optimizer state to every rank (already broadcast once
        # before fit; this also covers anything created in the first step). Not under Horovod
        # Elastic, whose state sync does that job.
        *([] if cfg.elastic.enabled else [active.broadcast_callback()]),
        # Stop decisions (signals, NaN) agreed by all ranks at the same step, before anything
        # acts on the step: a rank that stopped alone would hang the others. Each epoch starts
        # on all ranks together here (a barrier), before any clock below starts.
        control,
        # Timing next, so validation time is not counted as training time.
        EpochStats(plan.global_batch),
        # Horovod: average the per-worker training metrics before anything reads them. All
        # workers run the same number of full batches, so the mean of means is exact here.
        active.metric_average_callback(),
        # Step times and per-worker rate (see perf.py), after the averaging: it reads the
        # workers' mean epoch_time_s, the one metrics.csv records.
        timer,
        # BatchNormalization's moving statistics averaged over the ranks (a collective) before
        # the validation reads them and the checkpoint saves them: each rank's own until then.
        AverageMovingStatistics(control, sync_due),
        # Validation sums and counts all-reduced: exact, and identical on every rank.
        ExactValidation(evaluator, control),
        # The users' callbacks after the averaging and the exact validation: every rank's
        # EarlyStopping sees the same numbers. They end with AgreedStop (one all-reduce), so
        # their stops are every rank's, before the checkpoint below sees `stop_training`.
        *user.callbacks,
        # Every rank's random states to rank 0 where a checkpoint may be written (a
        # collective): after the users' stops, before the checkpoint that keeps them.
        random,
        # Every rank holds the same replicated state (a collective), checked before the
        # checkpoint writes it: a mismatch ends the run on every rank, with nothing written.
        *([CheckReplicas(control, sync_due, random)] if checking else []),
        # The learning-rate warm-up is not a callback: it lives in the optimizer's schedule
        # (schedules.WarmupScaled), scaled by the worker count and stepped per batch.
        # Side effects on rank 0 only (none is a collective): console, files, TensorBoard,
        # MLflow, checkpoints, the record.
        *chief,
        # Last: the record follows what the callbacks before it wrote.
        *([RecordProgress(record, control, checkpointer)] if record else []),
    ]
    return RunCallbacks(tuple(callbacks), plan, control, input_wait, timer, user.stop, checkpointer)


def require_tensorboard(logs: LoggingConfig) -> None:
    """`logging.tensorboard: true` without the tensorboard package (TensorFlow 2.21 no longer
    installs it; scripts/install.sh does) would fail at the first summary, after the first
    epoch: one line before training instead, on every rank."""
    import importlib.util

    if logs.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise UserError(
            f"logging.tensorboard is true, but the tensorboard package is not installed (TensorFlow "
            f"{tf.__version__} does not bring it): pip install tensorboard, or set "
            "logging.tensorboard: false"
        )


def _chief_callbacks(
    cfg: Config,
    plan: Derived,
    control: RunControl,
    epoch: int,
    checkpointer: Checkpointer,
    mlflow: Sender | None = None,
) -> list[Any]:
    """Rank 0's: the console after everything that fills the logs (Keras' bar on a terminal
    when asked for, fit_from then turns it on; else one line per epoch), metrics.csv,
    TensorBoard, MLflow, the checkpoints, the profiler."""
    run_dir = RunDir(cfg.run.dir)
    callbacks: list[Any] = []
    if wants_progress_bar(cfg.train.verbose):
        callbacks.append(ProgressBar())
    elif cfg.train.verbose:
        callbacks.append(EpochLines(cfg.train.epochs, plan, control, cfg.train.log_every_s))
    callbacks.append(MetricsCSV(run_dir.metrics, control, epoch))
    if cfg.logging.tensorboard:
        callbacks.append(TensorBoard(run_dir.tensorboard))
    if mlflow is not None:
        callbacks.append(MlflowEpochs(mlflow, control))
    callbacks.append(checkpointer)
    if cfg.logging.profile_steps:
        first, last = cfg.logging.profile_steps
        k = cfg.train.steps_per_execution
        callbacks.append(perf.ProfileSteps(first, last, run_dir.tensorboard, k))
    return callbacks
