"""`build_callbacks`: every callback of a run, built and placed in the one order that works
(the one place that fixes it, as Keras' callback_list.py is); `RunLinks`, what the callbacks
talk to outside the model; and `RunCallbacks`, what it returns."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hvd_train.config import Derived
from hvd_train.data.diagnostics import advice_for
from hvd_train.data.job import Job, Position
from hvd_train.record.layout import RunDir
from hvd_train.record.run_record import RunRecord
from hvd_train.record.stops import StopSignals
from hvd_train.runtime import distributed
from hvd_train.runtime.keras import binding
from hvd_train.train.callbacks import perf
from hvd_train.train.callbacks.checkpointer import Checkpointer
from hvd_train.train.callbacks.epoch_lines import EpochLines
from hvd_train.train.callbacks.epoch_stats import EpochStats
from hvd_train.train.callbacks.exact_validation import ExactValidation
from hvd_train.train.callbacks.input_wait import InputWait
from hvd_train.train.callbacks.metrics_csv import MetricsCSV
from hvd_train.train.callbacks.progress_bar import ProgressBar, wants_progress_bar
from hvd_train.train.callbacks.random_states import RandomStates
from hvd_train.train.callbacks.record_progress import RecordProgress
from hvd_train.train.callbacks.stop import AgreedStop, RunControl
from hvd_train.train.callbacks.sync_points import AverageMovingStatistics, CheckReplicas
from hvd_train.train.callbacks.tensorboard import TensorBoard
from hvd_train.train.callbacks.tracker_epochs import EpochSink, TrackerEpochs
from hvd_train.train.callbacks.user_callbacks import build_user_callbacks
from hvd_train.train.checkpoint import (
    CheckpointStore,
)
from hvd_train.train.evaluation import Evaluator


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


@dataclass(frozen=True)
class RunLinks:
    """What a run's callbacks talk to outside the model: the process's stop signals, rank 0's
    record and its MLflow and W&B runs. The same for every membership under Horovod Elastic
    (but the record, which a survivor that became rank 0 lacks)."""

    signals: StopSignals  # the process's, which RunControl turns into agreed stops
    # rank 0's summary.json, kept current after each epoch; None elsewhere (and on a survivor
    # that became rank 0 under Horovod Elastic)
    record: RunRecord | None = None
    # rank 0's MLflow and W&B runs (logging.mlflow, logging.wandb; train/run/tracking.py,
    # wandb_tracking.py), which get each epoch's values
    trackers: Sequence[EpochSink] = ()


def build_callbacks(
    job: Job, model: Any, at: Position, links: RunLinks, leading: tuple[Any, ...] = ()
) -> RunCallbacks:
    """Every callback of the run, built and placed in the one order that works (see below).

    Args:
        job: the config, the derived sizes for this worker count and the data (its
            validation split).
        model: the compiled model (for the exact validation).
        at: where training starts: the epoch (0-based; metrics.csv keeps the rows before it)
            and the steps of it already done (a resume part-way).
        links: the stop signals, rank 0's record and trackers (`RunLinks`).
        leading: callbacks that run before all of these: Horovod Elastic's state commit and
            position tracking. Defaults to none.

    Raises:
        ConfigError: a `callbacks:` item that cannot be built (user_callbacks).
    """
    cfg, plan, record = job.cfg, job.plan, links.record
    active = binding.active()
    control = RunControl(
        links.signals, cfg.checkpoint, plan.steps_per_epoch, first_step_in_epoch=at.step
    )
    user = build_user_callbacks(cfg.callbacks, control)
    input_wait = InputWait(
        cfg.data.input_wait_warning, advice_for(cfg.data.source),
        steps_per_execution=cfg.train.steps_per_execution,
    )  # fmt: skip
    timer = perf.StepTimer(plan)
    evaluator = Evaluator(model, job.source, plan.per_worker_batch, cfg.model.from_logits)
    save_every = cfg.checkpoint.every_steps
    random = RandomStates(functools.partial(control.passed, save_every), bool(save_every))
    checking = cfg.runtime.check_replicas != "off"
    check_every = cfg.runtime.check_replicas_every_steps if checking else None
    # Whether sync_due below can hold mid-epoch in this run: when not, the callbacks that act
    # there have no batch hook to call (Keras 2's list leaves them out: runtime/keras/v2.py).
    syncing_mid_epoch = bool(save_every or check_every)

    def sync_due() -> bool:
        """Mid-epoch, where the replicated state must be every rank's alike: a checkpoint,
        and the replica checks asked for."""
        return control.passed(save_every) or control.passed(check_every)

    checkpointer = None
    if distributed.is_chief():
        store = CheckpointStore(cfg.run.dir, cfg.checkpoint)
        checkpointer = Checkpointer(job, store, control, random)
    chief = (
        _chief_callbacks(job, control, at.epoch, checkpointer, links.trackers)
        if checkpointer
        else []
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
        AverageMovingStatistics(control, sync_due, syncing_mid_epoch),
        # Validation sums and counts all-reduced: exact, and identical on every rank.
        ExactValidation(evaluator, control.stopped_mid_epoch),
        # The users' callbacks after the averaging and the exact validation: every rank's
        # EarlyStopping sees the same numbers. They end with AgreedStop (one all-reduce), so
        # their stops are every rank's, before the checkpoint below sees `stop_training`.
        *user.callbacks,
        # Every rank's random states to rank 0 where a checkpoint may be written (a
        # collective): after the users' stops, before the checkpoint that keeps them.
        random,
        # Every rank holds the same replicated state (a collective), checked before the
        # checkpoint writes it: a mismatch ends the run on every rank, with nothing written.
        *([CheckReplicas(control, sync_due, random, syncing_mid_epoch)] if checking else []),
        # The learning-rate warm-up is not a callback: it lives in the optimizer's schedule
        # (schedules.WarmupScaled), scaled by the worker count and stepped per batch.
        # Side effects on rank 0 only (none is a collective): console, files, TensorBoard,
        # MLflow and W&B, checkpoints, the record.
        *chief,
        # Last: the record follows what the callbacks before it wrote.
        *(
            [
                RecordProgress(
                    record, control, checkpointer and (lambda: checkpointer.last), bool(save_every)
                )
            ]
            if record
            else []
        ),
    ]
    return RunCallbacks(tuple(callbacks), plan, control, input_wait, timer, user.stop, checkpointer)


def _chief_callbacks(
    job: Job,
    control: RunControl,
    epoch: int,
    checkpointer: Checkpointer,
    trackers: Sequence[EpochSink] = (),
) -> list[Any]:
    """Rank 0's: the console after everything that fills the logs (Keras' bar on a terminal
    when asked for, fit_from then turns it on; else one line per epoch), metrics.csv,
    TensorBoard, MLflow and W&B, the checkpoints, the profiler."""
    cfg, run_dir = job.cfg, RunDir(job.cfg.run.dir)
    callbacks: list[Any] = []
    if wants_progress_bar(cfg.train.verbose):
        callbacks.append(ProgressBar())
    elif cfg.train.verbose:
        callbacks.append(EpochLines(cfg.train, job.plan, control))
    callbacks.append(MetricsCSV(run_dir.metrics, control, epoch))
    if cfg.logging.tensorboard:
        callbacks.append(TensorBoard(run_dir.tensorboard))
    callbacks += [TrackerEpochs(sink, control) for sink in trackers]
    callbacks.append(checkpointer)
    if cfg.logging.profile_steps:
        first, last = cfg.logging.profile_steps
        k = cfg.train.steps_per_execution
        callbacks.append(perf.ProfileSteps(first, last, run_dir.tensorboard, k))
    return callbacks
