"""The state a run carries to every ending (completed, failed, interrupted): the stop handling,
rank 0's claim on run.dir and its record, the current callbacks, and where training began;
and the run's one way out (`Run.end`).

`Run` is filled in as start-up makes each part, because the stop watcher thread may end the
process at any moment and must find what exists by then; the record itself is built by its one
writer (record/run_record.py `RunRecord`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hvd_train.base import logs
from hvd_train.config import Config, RunConfig
from hvd_train.data.job import Position
from hvd_train.record import rundir
from hvd_train.record.run_record import Opened, RecordError, RunRecord, end_before_start
from hvd_train.record.stops import StopSignals
from hvd_train.record.summary import Summary
from hvd_train.runtime import distributed
from hvd_train.train.callbacks.callback_list import RunCallbacks
from hvd_train.train.callbacks.checkpointer import Checkpointer
from hvd_train.train.run.tracking import Tracking
from hvd_train.train.run.wandb_tracking import WandbTracking


@dataclass(frozen=True)
class Start(Position):
    """Where training begins (`epoch`, 0-based, with `step` of its steps already done), and
    the checkpoint it resumes from."""

    checkpoint: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # the checkpoint's epoch-end metrics


@dataclass
class Run:
    """What every ending of the run needs: the stop handling, rank 0's claim on run.dir and its
    record, and the current callbacks (their Checkpointer knows the last checkpoint)."""

    settings: RunConfig  # run.dir and run.overwrite, for an ending before the record
    epochs: int  # train.epochs, likewise
    signals: StopSignals
    started: float = field(default_factory=time.perf_counter)
    claim: rundir.Claim | None = None  # rank 0's, the moment it claims run.dir
    record: RunRecord | None = None  # rank 0's
    opened: Opened | None = None  # run.dir as this job opened it (every rank)
    callbacks: RunCallbacks | None = None  # the latest build (one per elastic membership)
    tracker: Tracking | None = None  # rank 0's MLflow run (logging.mlflow)
    wandb: WandbTracking | None = None  # rank 0's W&B run (logging.wandb)
    start: Start | None = None  # where training began, once known (a forced exit's stopped_at)

    def release(self) -> None:
        if self.claim is not None:
            self.claim.release()

    def end(
        self, status: str | None, *, before_record: bool = False, forced: bool = False,
        cause: Callable[[], Summary] | None = None, **fields: Any,
    ) -> None:  # fmt: skip
        """The run's one way out: records its ending, lets the stop watcher go and releases
        run.dir. Every ending calls it: completed, stopped, failed, and the watcher's.

        Args:
            status: summary.json's `status`; None: the run leaves with nothing of it written
                (a refusal, nothing to train, bad input before run.dir was claimed).
            before_record: rank 0 failed in its start-up, before its record started: the
                ending is written under the claim the run would have taken.
            forced: the stop watcher ends the process next: a failed write is said, not
                raised, and nothing waits for MLflow (the keeper ends its run).
            cause: with `before_record`, the ending's `error` fields, asked for once the
                watcher is told (they may wait seconds for horovodrun's note).
            **fields: the ending's other summary.json fields.
        """
        try:
            if status is None:
                return
            if before_record:
                self._end_before_record(status, cause, fields)
            elif forced:
                self._end_forced(status, fields)
            else:
                self._end_record(status, fields)
        finally:
            self.signals.done.set()  # the ending is written: the watcher lets the process end
            self.release()

    def _end_record(self, status: str, fields: Summary) -> None:
        """Rank 0: the run's final summary.json (once; a stop already recorded wins).

        With logging.mlflow, a completed run's last points and files go to MLflow first, so that
        summary.json says what could not be sent; then summary.json itself and the MLflow run's
        ending. A stop or a failure, which the launcher may kill seconds later, is recorded
        first: MLflow gets what it can after that. The W&B run ends after summary.json, with
        its status and fields, whichever the ending (also one a stop recorded first).
        """
        if not self.record:
            return
        fields = {"status": status, **fields, "wall_time_s": time.perf_counter() - self.started}
        if self.checkpointer is not None:
            fields["last_checkpoint"] = self.checkpointer.last
            fields["best_model_path"] = self.checkpointer.best_model
        tracker, self.tracker = self.tracker, None  # once, also when a write below fails
        wandb, self.wandb = self.wandb, None
        completed = status == "completed"
        try:
            if wandb and not self.record.ended:
                fields["wandb"] = wandb.sender.fields()
            if tracker and not self.record.ended:
                fields["mlflow"] = (
                    tracker.before_end({**self.record.summary, **fields})
                    if completed
                    else tracker.sender.fields()
                )
            if self.record.end(**fields) and tracker:
                if not completed:
                    tracker.before_end(self.record.summary)
                # The keeper ends the MLflow run when rank 0 did not (mlflow_run.follow_record).
                self.record.note(mlflow_ended=tracker.after_end(self.record.summary["status"]))
        finally:
            if wandb:
                wandb.end(self.record.summary)
            self.record.close()

    def _end_forced(self, status: str, fields: Summary) -> None:
        """The stop watcher's ending of the record: a failed write is said, not raised."""
        if not self.record:
            return
        try:
            wall_time_s = time.time() - self.record.summary["started_at"]
            self.record.end(status=status, **fields, wall_time_s=wall_time_s)
        except RecordError as e:
            logs.say(f"hvd_train: error: {e}")
        self.record.close()

    def _end_before_record(
        self, status: str, cause: Callable[[], Summary] | None, fields: Summary
    ) -> None:
        """Rank 0's ending before its record (run_record.end_before_start)."""
        # First: the watcher, told the run writes its ending, leaves the process alone.
        self.signals.done.set()
        ending: Summary = {"status": status, **(cause() if cause else {}), **fields}
        s = self.settings
        end_before_start(s.dir, s.overwrite, distributed.size(), self.epochs, ending)

    def note_signal(self, signum: int) -> None:
        """Tells rank 0's keeper which stop signal came (it records it if rank 0 dies)."""
        if self.record:
            self.record.note(signal=signum)

    @property
    def checkpointer(self) -> Checkpointer | None:
        return self.callbacks.checkpointer if self.callbacks else None

    def note_start(self, start: Start, **model: Any) -> None:
        """Where training begins, for a stop's record and for summary.json, with `model`'s
        figures (`gradient_size`)."""
        self.start = start  # a forced exit before any step ran says where to continue
        if self.record:
            # Afresh, this job has no model yet; resumed, the newest checkpoint is its start.
            afresh = {} if start.checkpoint else {"model_path": None, "best_model_path": None}
            self.record.begins(
                resumed=bool(start.checkpoint),
                **model,
                **afresh,
                epochs_completed=start.epoch,
                resumed_from=start.checkpoint,
                last_checkpoint=start.checkpoint,
                trained_from={"epoch": start.epoch + 1, "step": start.step},
            )


@contextlib.contextmanager
def running(cfg: Config, signals: StopSignals) -> Iterator[Run]:
    """The run, its stops handled from the first moment: a stop during start-up ends at once,
    recorded through `signals.recorded_by` (stops.installed's until the trainer hands it to
    the run; the watcher thread may end the process). Every ending leaves through `Run.end`,
    which releases run.dir: completed, failed, interrupted."""
    run = Run(cfg.run, cfg.train.epochs, signals)
    run.signals.before_exit.append(run.release)
    try:
        yield run
    finally:
        run.end(None)  # an ending already written stays: this lets the watcher go, run.dir too
        run.signals.uninstall()
