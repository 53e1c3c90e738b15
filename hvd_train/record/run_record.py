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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hvd_train.base.errors import CheckpointError, RunDirError, TrainingError
from hvd_train.record import rundir
from hvd_train.record.layout import RunDir
from hvd_train.record.summary import (
    EARLIER_ENDING,
    EarlierJob,
    Mlflow,
    Summary,
    Versions,
    Wandb,
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


@dataclass(frozen=True)
class Opened:
    """run.dir as this job opened it: the record's opening fields and what the job carries
    forward from run.dir's record before it, read once (rank 0's; other ranks carry none)."""

    base: Summary  # this job's own opening fields (train/run/outcome.py summary_base)
    earlier_jobs: list[EarlierJob] = field(default_factory=list)  # the jobs that trained run.dir
    so_far: Summary = field(default_factory=dict)  # what they left, until this job's start
    mlflow: Mlflow = field(default_factory=dict)  # the MLflow run it continues ({}: a new one)
    wandb: Wandb = field(default_factory=dict)  # the W&B run it continues ({}: a new one)

    def opening(self, so_far: bool = True) -> Summary:
        """summary.json as the record starts: the runs it continues named from the start, so
        that an ending before MLflow or W&B opens keeps them; with `so_far`, the run so far
        (until this job's start is known, and after it where the job resumes)."""
        carried: Summary = {"mlflow": self.mlflow} if self.mlflow else {}
        carried.update({"wandb": self.wandb} if self.wandb else {})
        if self.earlier_jobs and so_far:
            carried.update(self.so_far, earlier_jobs=self.earlier_jobs)
        return {**self.base, **carried}


class RunRecord:
    """summary.json of one run, on rank 0: the one writer of the record while rank 0 runs. It
    opens with `Opened`, puts this job's start in place of the run so far (`begins`), keeps
    `versions` as the stack says at each write, and writes the end once. Every write is atomic.
    """

    def __init__(
        self, run_dir: str, opened: Opened, stack: Callable[[], Versions] | None = None
    ) -> None:
        self.run_dir = run_dir
        self.path = RunDir(run_dir).summary
        self.opened = opened
        self._stack = stack  # the Keras may change once, when a model factory's model is built
        self.summary = self._opening(so_far=True)
        self.ended = False
        self._lock = threading.Lock()  # the stop watcher thread may end the record too
        self._keeper: Any = None

    @classmethod
    def taken_over(
        cls, run_dir: str, opened: Opened, stack: Callable[[], Versions] | None = None
    ) -> RunRecord:
        """Horovod Elastic: the record of a survivor that became rank 0 when rank 0 was lost.
        It continues the MLflow and W&B runs the lost rank 0 opened, which only that one's
        record names (its keeper has meanwhile written `failed` there)."""
        lost = read_summary(RunDir(run_dir).summary)
        mlflow, wandb = Mlflow(lost.get("mlflow") or {}), Wandb(lost.get("wandb") or {})
        return cls(run_dir, Opened(opened.base, mlflow=mlflow, wandb=wandb), stack)

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

    def begins(self, resumed: bool, **fields: Any) -> None:
        """This job's start is known (where it trains from, its model's figures): the record
        is its opening with `fields`, and the run so far only where the job `resumed`. A job
        that starts afresh keeps nothing the earlier jobs left. Ignored once ended."""
        with self._lock:
            if self.ended:
                return
            earlier = self.opened.earlier_jobs if resumed else []
            self.summary = {**self._opening(so_far=resumed), **fields,
                            "earlier_jobs": earlier}  # fmt: skip
            self._write_progress()

    def update(self, **fields: Any) -> None:
        """Progress while running (epochs completed, newest checkpoint); ignored once ended."""
        with self._lock:
            if self.ended:
                return
            self.summary.update(fields)
            self._write_progress()

    def _write_progress(self) -> None:
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

    def _opening(self, so_far: bool) -> Summary:
        """`Opened.opening`, with `versions` after the job's own fields."""
        versions: Summary = {"versions": self._stack()} if self._stack else {}
        return {**self.opened.base, **versions, **self.opened.opening(so_far)}

    def _write(self) -> None:
        if self._stack is not None:
            self.summary["versions"] = self._stack()
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
