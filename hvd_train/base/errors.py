"""The errors hvd_train reports in one line, each with the exit code the CLI ends with.

summary.json's `error_type` is the class name of the error that ended a run; the launcher looks
the class up (`error_class`) to tell whether a restart from the last checkpoint could help.
"""

from __future__ import annotations

import os
import signal
import sysconfig
import traceback


class OneLineError(Exception):
    """An expected failure: one line on stderr (or the rank's failure line), no traceback."""

    exit_code = 1
    # Why a restart from the last checkpoint would fail the same way; "" when it may not.
    recurs = ""


class UserError(OneLineError):
    """A problem the user can fix (bad config, bad input): one line, exit code 2, no traceback."""

    exit_code = 2
    recurs = "a bad config, bad input or an unusable run.dir (exit code 2) would fail again"


class ConfigError(UserError):
    """The config file or a `--set` override is invalid."""


class DataError(UserError):
    """The training or validation data cannot be used as configured."""


# What a rank reports when another rank's failure took Horovod down under it.
KNOCK_ON = (
    "Horovod has been shut down",
    "HorovodInternalError",
    "Connection closed by peer",
    "Connection reset by peer",  # Gloo's read from a peer that was killed mid-collective
    "Horovod's shared-memory all-reduce",  # patch 0013: a rank it waited for has gone
)
# How rank 0 and its keeper say that they do not know the first cause (the launcher may).
ANOTHER_FIRST = "another worker ended first"
NO_STATUS = "ended without writing its status"


class DeviceError(UserError):
    """`runtime.device` asks for a GPU that TensorFlow cannot use (a CPU build, CUDA libraries
    that do not load): the job ends in one line, exit code 2, before any rank trains on the
    CPU."""

    recurs = "TensorFlow would see no GPU again: its build or the CUDA libraries must change"


class RunDirError(UserError):
    """run.dir cannot be this run's: another job holds it, it is not a writable folder, or it
    holds files that are not a run's (see rundir.py)."""


class TrainingError(OneLineError):
    """Training cannot go on (a non-finite loss): one line, exit code 1, no checkpoint written."""

    recurs = "a non-finite loss would recur from the same checkpoint and data"


class ExportError(OneLineError):
    """An export that, loaded back with its own runtime, does not give the trained model's
    predictions (or does not load): one line, exit code 1, nothing left at --out."""


class CheckpointError(TrainingError):
    """A checkpoint, `model.keras` or `best.keras` could not be written (disk full, no
    permission): one line, exit code 1. The previous checkpoints are left as they were.
    """

    recurs = "a write to run.dir failed (full disk, no permission): it would fail again"


class ReplicaMismatch(TrainingError):
    """The ranks hold different values of a replicated variable (`runtime.check_replicas`):
    one line naming the first variable that differs and the ranks that disagree, exit code 3.
    No checkpoint is written; the last one was checked before it was written, so a restart
    from it (`hvd-train launch --max-restarts`) is sound: a bit flip does not recur."""

    exit_code = 3
    recurs = ""


class Interrupted(Exception):
    """A stop signal (SIGTERM, SIGINT, SIGUSR1) ended the run at a step, after a checkpoint.

    The CLI exits with 128 + the signal's number, as a shell does for a process it signalled.
    """

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def error_class(name: str) -> type[OneLineError] | None:
    """The one-line error class called `name` (summary.json's `error_type`), or None: a bug's
    exception, or a class from a module not imported here."""
    todo: list[type[OneLineError]] = [OneLineError]
    while todo:
        cls = todo.pop()
        if cls.__name__ == name:
            return cls
        todo += cls.__subclasses__()
    return None


_SIGNAL_NAMES = {s.value: s.name for s in signal.Signals}


def exit_description(code: int | None) -> str:
    """`exit code 137, killed by SIGKILL` (a shell's 128 + N, or Python's -N), or `exit code 1`."""
    how = f"exit code {code}"
    signum = None if code is None else code - 128 if code > 128 else -code
    if signum in _SIGNAL_NAMES:
        how += f", killed by {_SIGNAL_NAMES[signum]}"
    return how


def users_frame(e: BaseException) -> str | None:
    """`file:line` of the innermost frame of `e`'s traceback in the user's code (a model
    factory, a callback): outside this package, Python's library and installed packages."""
    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # hvd_train/
    library = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        path = os.path.abspath(frame.filename)
        if frame.filename.startswith("<") or any(
            path.startswith(d + os.sep) for d in (ours, *library)
        ):
            continue
        shown = os.path.relpath(path) if path.startswith(os.getcwd() + os.sep) else path
        return f"{shown}:{frame.lineno}"
    return None
