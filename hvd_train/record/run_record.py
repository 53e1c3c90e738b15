"""The run record: summary.json, which never says `running` or `completed` when it is not.

Rank 0 writes summary.json atomically: at the start, after every epoch and checkpoint, and at
the end. The end is written once (`RunRecord.end`); a failed write of it is an error, and a
full disk gets the room kept in a small reserve file. A keeper process (keeper.py), started by
rank 0 outside the job's process tree (launchers kill the tree), outlives it: when rank 0 ends
without its final word (SIGKILL from a launcher after another worker failed, the
out-of-memory killer, a stop that outran the launcher's grace), the keeper writes `failed`
or `interrupted` itself, and releases rank 0's hold on run.dir.

Standard library only: rank 0 may record a stop before TensorFlow has loaded.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
from typing import Any

from hvd_train.base.errors import CheckpointError, RunDirError, TrainingError
from hvd_train.record import rundir
from hvd_train.record.layout import RunDir
from hvd_train.record.summary import (
    EARLIER_ENDING,
    Summary,
    early_summary,
    read_summary,
    write_summary,
)

# Room for the final summary.json on a full disk (run.dir's .hvd_train.reserve), freed just
# before it is written.
RESERVE_BYTES = 64 * 1024
# The keeper's module, run as `python -m` (keeper.py): outside this process, so not imported.
KEEPER = "hvd_train.record.keeper"


class RecordError(TrainingError):
    """summary.json could not be written: the run's status would be false (exit code 1)."""

    recurs = CheckpointError.recurs


class RunRecord:
    """summary.json of one run, on rank 0. Every write is atomic; `end` is written once."""

    def __init__(self, run_dir: str, summary: Summary):
        self.run_dir = run_dir
        self.path = RunDir(run_dir).summary
        self.summary = Summary(summary)
        self.ended = False
        self._lock = threading.Lock()  # the stop watcher thread may end the record too
        self._keeper: Any = None

    def start(self) -> None:
        """Writes the first summary, sets the reserve aside and starts the keeper.

        Raises:
            RecordError: run.dir has no room even for these (exit code 1).
        """
        with self._lock:
            if self.ended:
                return
            try:
                self._write()
                _reserve(self.run_dir)
            except OSError as e:
                free_reserve(self.run_dir)
                raise RecordError(
                    f"cannot start the run's record in {self.run_dir}: {e.strerror or e}; "
                    "free space there (or choose another run.dir)"
                ) from None
            self._keeper = _start_keeper(self.run_dir, os.getpid())

    def update(self, drop: tuple[str, ...] = (), **fields: Any) -> None:
        """Progress while running (epochs completed, newest checkpoint), the fields `drop`
        names left out; ignored once ended."""
        with self._lock:
            if self.ended:
                return
            for name in drop:
                self.summary.pop(name, None)
            self.summary.update(fields)
            try:
                self._write()
            except OSError:
                pass  # progress is best effort; the end is not (see `end`)

    def end(self, **fields: Any) -> bool:
        """Writes the final summary; False when it was already written (by another thread).

        Raises:
            RecordError: summary.json cannot be written even with the reserve freed.
        """
        with self._lock:
            if self.ended:
                return False
            self.ended = True
            self.summary.update(fields)
            try:
                self._write()
            except OSError as e:
                if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise RecordError(f"cannot write {self.path}: {e.strerror or e}") from None
                free_reserve(self.run_dir)
                try:
                    self._write()
                except OSError as e2:
                    raise RecordError(f"cannot write {self.path}: {e2.strerror or e2}") from None
            free_reserve(self.run_dir)
            return True

    def note(self, **event: Any) -> None:
        """Tells the keeper something it needs if rank 0 dies (a stop signal arrived)."""
        if self._keeper is None:
            return
        try:
            self._keeper.write(json.dumps(event) + "\n")
            self._keeper.flush()
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        """Lets the keeper go: it checks the summary once this process has exited."""
        if self._keeper is not None:
            try:
                self._keeper.close()
            except OSError:
                pass
            self._keeper = None

    def _write(self) -> None:
        write_summary(self.path, self.summary)


def end_before_start(
    run_dir: str, overwrite: bool, world_size: int, epochs: int, ending: Summary
) -> str:
    """Rank 0, stopped or failed in its start-up, before its RunRecord: writes `ending` into
    run.dir's summary.json, under the claim the run itself would have taken; returns what it
    did, in words for the console.

    A record of an earlier job gets `ending` (what that job achieved stays); none gets a new
    one. Nothing is written where the run would have been refused (run.dir another job's, not
    a run's, not writable) nor over a completed run.
    """
    # Rank 0 may hold run.dir already: it claimed it, then the collective that shares the
    # claim's outcome failed, or a stop came, before its record started.
    own = rundir.held_by_this_process(run_dir)
    try:
        claim = None if own else rundir.claim(run_dir, overwrite=overwrite, config_path=None,
                                              log=lambda _: None)  # fmt: skip
    except RunDirError:
        return f"nothing was written ({run_dir} is not this job's to write)"
    try:
        path = RunDir(run_dir).summary
        summary = read_summary(path)
        if summary.get("status") == "completed":
            return f"{path} is a completed run's: left as it is"
        for key in EARLIER_ENDING:
            summary.pop(key, None)
        summary = summary or early_summary(world_size, epochs, "start-up")
        summary.update(ending, recorded_by="start-up")
        write_summary(path, summary)
        return f"{path} says {summary['status']}"
    except OSError as e:
        return f"cannot write {path}: {e.strerror or e}"
    finally:
        if claim is not None:
            claim.release()


def _reserve(run_dir: str) -> None:
    with open(RunDir(run_dir).reserve, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, RESERVE_BYTES)  # real blocks, not a sparse file


def free_reserve(run_dir: str) -> None:
    try:
        os.remove(RunDir(run_dir).reserve)
    except OSError:
        pass


# --------------------------------------------------------------------------- the keeper


def _start_keeper(run_dir: str, pid: int) -> Any:
    """Starts the keeper of `pid`'s record; returns the pipe to it (EOF: `pid` has ended)."""
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", KEEPER, os.path.abspath(run_dir), str(pid)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
            start_new_session=True,  # not in the job's process group: spared by its kill
            env=_keeper_env(),
        )  # fmt: skip
    except OSError:
        return None
    proc.wait()  # the first child forks the keeper and exits at once (see keeper.keep)
    return proc.stdin


def _keeper_env() -> dict[str, str]:
    """The keeper's environment: this package importable, and no rank, so that no launcher
    or supervisor looking for the job's workers takes the keeper for one."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_RANK")}
    env["PYTHONPATH"] = _package_root()
    return env


def _package_root() -> str:
    """The folder that holds the hvd_train package (the package is two levels up from here)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    extra = os.environ.get("PYTHONPATH")
    return f"{root}{os.pathsep}{extra}" if extra else root
