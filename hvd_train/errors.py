"""The errors hvd_train reports in one line: exit code 2 for the user's, 1 for training's."""


class UserError(Exception):
    """A problem the user can fix (bad config, bad input): one line, exit code 2, no traceback."""


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
)
# How rank 0 and its keeper say that they do not know the first cause (the launcher may).
ANOTHER_FIRST = "another worker ended first"
NO_STATUS = "ended without writing its status"


class RunDirError(UserError):
    """run.dir cannot be this run's: another job holds it, it is not a writable folder, or it
    holds files that are not a run's (see rundir.py)."""


class TrainingError(Exception):
    """Training cannot go on (a non-finite loss): one line, exit code 1, no checkpoint written."""


class CheckpointError(TrainingError):
    """A checkpoint, `model.keras` or `best.keras` could not be written (disk full, no
    permission): one line, exit code 1. The previous checkpoints are left as they were.
    """


class Interrupted(Exception):
    """SIGTERM or SIGINT stopped the run at a step boundary after a checkpoint was written.

    The CLI exits with 128 + the signal's number, as a shell does for a process it signalled.
    """

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum
