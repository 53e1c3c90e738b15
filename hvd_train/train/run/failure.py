"""How a run that fails says so: each rank's one line, the record's `error` (this rank's, or
that another rank failed first), the data reader's own error behind a TensorFlow one, and the
ending the stop watcher records when it ends the process (`record_forced_exit`)."""

from __future__ import annotations

import signal

import tensorflow as tf

from hvd_train.base import logs
from hvd_train.base.errors import (
    ANOTHER_FIRST,
    KNOCK_ON,
    DataError,
    TrainingError,
    UserError,
    users_frame,
)
from hvd_train.data import images
from hvd_train.record.run_record import RecordError
from hvd_train.record.stops import (
    ForcedExit,
    end_in_start_up,
    failed_first,
    first_failure_awaited,
)
from hvd_train.record.summary import Summary
from hvd_train.train.run.messages import one_line
from hvd_train.train.run.state import Run


def fail(run: Run, e: BaseException) -> None:
    """Every rank says why it stopped, in one line (the launcher names the rank whose error
    came first and was not a consequence of another rank's failure); rank 0 records it. A
    traceback goes to the rank's log only, and not for the errors that are one line by design."""
    one_line = isinstance(e, (UserError, TrainingError))
    where = None if one_line else users_frame(e)  # in a model factory, a callback
    at = f" (at {where})" if where else ""
    logs.failed(console_cause(e) + at, None if one_line else e)
    try:
        cause = record_cause(e, recorded=run.record is not None)
        cause["error"] += at
        run.end("failed", **cause, error_type=type(e).__name__)
    except RecordError as e2:
        logs.say(f"hvd_train: error: {e2}")


def reading_cause(e: BaseException) -> BaseException:
    """For a TensorFlow error of the input pipeline, the error the data reader raised (a
    DataError names the file and what changed); else `e`."""
    failure = images.read_failure() if isinstance(e, tf.errors.OpError) else None
    if failure is None:
        return e
    if isinstance(failure, UserError):
        return failure
    return DataError(f"reading the data failed: {one_line(failure)}")


def record_cause(e: BaseException, recorded: bool) -> Summary:
    """The summary's `error`: this rank's own error, or that another rank failed first, with
    `failed_rank` when horovodrun noted which (under Gloo; stops.first_failure_awaited).
    `recorded`: this rank writes the record (rank 0, once it started): only it asks."""
    text = one_line(e)
    if not any(c in text for c in KNOCK_ON):
        return {"error": text}
    if recorded and (first := first_failure_awaited()) is not None:
        return {"error": f"{failed_first(first)}; rank 0 then saw: {text}",
                "failed_rank": first["rank"]}  # fmt: skip
    return {"error": f"{ANOTHER_FIRST}; rank 0 then saw: {text}"}


def console_cause(e: BaseException) -> str:
    """This rank's failure line: its error, or, for Horovod shut down under it, that another
    rank failed first and the short form of what this one then saw (the rest is in its log)."""
    text = one_line(e)
    seen = next((c for c in KNOCK_ON if c in text), None)
    if seen is None:
        return text
    return f"{ANOTHER_FIRST}; this rank then saw {type(e).__name__}: {seen}"


def record_forced_exit(run: Run, forced: ForcedExit) -> None:
    """Called by the stop watcher just before it ends this process: records the ending, failed
    or interrupted, and says it. Where no step ran (`forced.ran`), training continues where
    `run.start` says."""
    if run.record is None:  # before rank 0's record, or another rank: as in its start-up
        end_in_start_up(run.settings, run.epochs, forced)
        run.end(None)
        return
    name, reason = signal.Signals(forced.signum).name, forced.reason
    if forced.failed:
        known = {} if forced.failed_rank is None else {"failed_rank": forced.failed_rank}
        run.end("failed", forced=True, error=reason, **known)
        logs.failed(reason if known else f"{ANOTHER_FIRST}, or the job was stopped: {reason}")
        return
    fields: Summary = {"stopped_by": name, "stop_detail": reason}
    if not forced.ran and run.start is not None:
        fields["stopped_at"] = {"epoch": run.start.epoch + 1, "step": run.start.step}
    run.end("interrupted", forced=True, **fields)
    last = run.record.summary.get("last_checkpoint")
    resume = f"resumes from {last}" if last else "starts afresh"
    logs.say(f"hvd_train: stopped by {name} {reason}; the same command {resume}")
