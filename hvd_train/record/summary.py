"""The run record: summary.json, which never says `running` or `completed` when it is not.

Rank 0 writes summary.json atomically: at the start, after every epoch and checkpoint, and at
the end. The end is written once (`RunRecord.end`); a failed write of it is an error, and a
full disk gets the room kept in a small reserve file. A keeper process, started by rank 0
outside the job's process tree (launchers kill the tree), outlives it: when rank 0 ends
without its final word (SIGKILL from a launcher after another worker failed, the
out-of-memory killer, a stop that outran the launcher's grace), the keeper writes `failed`
or `interrupted` itself, and releases rank 0's hold on run.dir.

This module imports nothing heavy: the keeper runs it as `python -m hvd_train.record.summary`.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from hvd_train.base import startup
from hvd_train.base.errors import NO_STATUS, CheckpointError, RunDirError, TrainingError
from hvd_train.record import rundir

SUMMARY = "summary.json"
ENDINGS = ("completed", "failed", "interrupted")
# Room for the final summary.json on a full disk, freed just before it is written.
RESERVE = ".hvd_train.reserve"
RESERVE_BYTES = 64 * 1024
# What an ending says of its cause: replaced, not mixed, when a later job ends the record.
EARLIER_ENDING = ("error", "error_type", "stopped_by", "stop_detail", "stop_signal",
                  "failed_rank", "failure", "recorded_by")  # fmt: skip


class RecordError(TrainingError):
    """summary.json could not be written: the run's status would be false (exit code 1)."""

    recurs = CheckpointError.recurs


class RunRecord:
    """summary.json of one run, on rank 0. Every write is atomic; `end` is written once."""

    def __init__(self, run_dir: str, summary: dict[str, Any]):
        self.run_dir = run_dir
        self.path = os.path.join(run_dir, SUMMARY)
        self.summary = dict(summary)
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
                _free_reserve(self.run_dir)
                raise RecordError(
                    f"cannot start the run's record in {self.run_dir}: {e.strerror or e}; "
                    "free space there (or choose another run.dir)"
                ) from None
            self._keeper = _start_keeper(self.run_dir, os.getpid())

    def update(self, **fields: Any) -> None:
        """Progress while running (epochs completed, newest checkpoint); ignored once ended."""
        with self._lock:
            if self.ended:
                return
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
                _free_reserve(self.run_dir)
                try:
                    self._write()
                except OSError as e2:
                    raise RecordError(f"cannot write {self.path}: {e2.strerror or e2}") from None
            _free_reserve(self.run_dir)
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
        write_json(self.path, self.summary)


def write_json(path: str, data: dict[str, Any]) -> None:
    """Writes `data` to a temporary file next to `path`, then renames it over `path`."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


def read_json(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def nothing_to_train(summary: dict[str, Any], epochs: int, run_dir: str) -> str | None:
    """Why a rerun with `train.epochs: epochs` of the run whose record is `summary` has nothing
    to train (one line), or None when it has.

    Nothing to train: the run completed with `epochs` or more epochs done, or its users'
    callbacks ended it early and `epochs` is no more than it was asked for. A rerun then
    changes nothing in run.dir, whatever its worker count. A run that failed or was
    interrupted past its last step (writing model.keras, say) has its end still to do: a rerun
    resumes and does it.
    """
    done = summary.get("epochs_completed")
    if summary.get("status") != "completed" or not isinstance(done, int):
        return None
    asked = summary.get("epochs", done)
    early = summary.get("stopped_early")
    if early and epochs <= asked:
        return (
            f"{run_dir} already completed: its callbacks stopped it early at epoch "
            f"{early.get('epoch')} of {asked} ({early.get('by')}); nothing to train (raise "
            f"train.epochs above {asked} to continue)"
        )
    if epochs > done:
        return None
    more = (
        "raise train.epochs to continue"
        if epochs == done
        else f"train.epochs is {epochs}: raise it above {done} to continue"
    )
    return f"{run_dir} already completed {done} of {asked} epochs; nothing to train ({more})"


def earlier_job(summary: dict[str, Any]) -> dict[str, Any]:
    """What summary.json's `earlier_jobs` keeps of a job that trained the run before."""
    keys = ("started_at", "status", "world_size", "controller", "global_batch_size",
            "trained_from", "epochs_completed", "stopped_at", "train_examples_per_sec",
            "wall_time_s")  # fmt: skip
    return {k: summary[k] for k in keys if summary.get(k) is not None}


def early_summary(world_size: int, epochs: int, recorded_by: str) -> dict[str, Any]:
    """summary.json of a job that ended before rank 0 started its record (in its first
    seconds), written by `recorded_by`: "start-up" (rank 0 itself) or "launcher"."""
    return {
        "status": "failed",
        "started_at": startup.process_created(),
        "world_size": world_size,
        "epochs": epochs,
        "epochs_completed": 0,
        "resumed_from": None,
        "last_checkpoint": None,
        "recorded_by": recorded_by,
    }


def end_before_start(
    run_dir: str, overwrite: bool, world_size: int, epochs: int, ending: dict[str, Any]
) -> str:
    """Rank 0, stopped or failed in its start-up, before its RunRecord: writes `ending` into
    run.dir's summary.json, under the claim the run itself would have taken; returns what it
    did, in words for the console.

    A record of an earlier job gets `ending` (what that job achieved stays); none gets a new
    one. Nothing is written where the run would have been refused (run.dir another job's, not
    a run's, not writable) nor over a completed run.
    """
    try:
        claim = rundir.claim(run_dir, overwrite=overwrite, config_path=None, log=lambda _: None)
    except RunDirError:
        return f"nothing was written ({run_dir} is not this job's to write)"
    try:
        path = os.path.join(run_dir, SUMMARY)
        summary = read_json(path)
        if summary.get("status") == "completed":
            return f"{path} is a completed run's: left as it is"
        for key in EARLIER_ENDING:
            summary.pop(key, None)
        summary = summary or early_summary(world_size, epochs, "start-up")
        summary.update(ending, recorded_by="start-up")
        write_json(path, summary)
        return f"{path} says {summary['status']}"
    except OSError as e:
        return f"cannot write {path}: {e.strerror or e}"
    finally:
        claim.release()


def _reserve(run_dir: str) -> None:
    with open(os.path.join(run_dir, RESERVE), "wb") as f:
        os.posix_fallocate(f.fileno(), 0, RESERVE_BYTES)  # real blocks, not a sparse file


def _free_reserve(run_dir: str) -> None:
    try:
        os.remove(os.path.join(run_dir, RESERVE))
    except OSError:
        pass


# --------------------------------------------------------------------------- the keeper


def _start_keeper(run_dir: str, pid: int) -> Any:
    """Starts the keeper of `pid`'s record; returns the pipe to it (EOF: `pid` has ended)."""
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hvd_train.record.summary", os.path.abspath(run_dir), str(pid)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
            start_new_session=True,  # not in the job's process group: spared by its kill
            env=_keeper_env(),
        )  # fmt: skip
    except OSError:
        return None
    proc.wait()  # the first child forks the keeper and exits at once (see keep)
    return proc.stdin


def _keeper_env() -> dict[str, str]:
    """The keeper's environment: this package importable, and no rank, so that no launcher
    or supervisor looking for the job's workers takes the keeper for one."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_RANK")}
    env["PYTHONPATH"] = _package_root()
    return env


def _package_root() -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    extra = os.environ.get("PYTHONPATH")
    return f"{root}{os.pathsep}{extra}" if extra else root


def keep(run_dir: str, pid: int) -> None:
    """The keeper: waits for `pid` to end, then makes sure its record tells the truth."""
    # Leave the process tree: a launcher that kills the job's tree (horovodrun kills the
    # children of a worker that outlived its grace) must not take the keeper with it.
    if os.fork():
        os._exit(0)
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):  # it ends when rank 0 has
        signal.signal(sig, signal.SIG_IGN)
    stop_signal = 0
    for line in sys.stdin:  # until rank 0's end of the pipe closes: it has ended
        try:
            event = json.loads(line)
        except ValueError:
            continue
        stop_signal = stop_signal or int(event.get("signal", 0))
    if not _wait_gone(pid):
        return  # rank 0's process lives on (it ran train() and goes on): its run.dir, its job
    path = os.path.join(run_dir, SUMMARY)
    summary = read_json(path)
    said = ""
    if summary.get("status") == "running":
        summary.update(ended_without_rank0(summary, pid, stop_signal))
        _free_reserve(run_dir)
        try:
            write_json(path, summary)
            said = f"[hvd_train] {summary['error']}; {path} says {summary['status']}"
        except OSError as e:
            said = f"[hvd_train] cannot write {path}: {e}"
    _free_reserve(run_dir)
    _release(run_dir, pid)
    try:  # last: the launcher that read rank 0's output may be gone with it
        if said:
            print(said, file=sys.stderr, flush=True)
    except OSError:
        pass


def ended_without_rank0(summary: dict[str, Any], pid: int, stop_signal: int) -> dict[str, Any]:
    """The fields that end a record whose rank 0 died before writing its end."""
    who = f"rank 0 (pid {pid} on {socket.gethostname()})"
    fields: dict[str, Any] = {"recorded_by": "keeper"}
    if stop_signal:
        name = signal.Signals(stop_signal).name
        fields.update(
            status="interrupted",
            stop_signal=name,
            error=f"stopped by {name}: {who} was killed before it finished its stop; resume "
            f"continues from the last checkpoint ({summary.get('last_checkpoint')})",
        )
    else:
        fields.update(
            status="failed",
            error=f"{who} {NO_STATUS}: killed (SIGKILL by the launcher "
            "after another worker failed, the out-of-memory killer, or by hand); the "
            "launcher's output names the first failure",
        )
    started = summary.get("started_at")
    if isinstance(started, (int, float)):
        fields["wall_time_s"] = time.time() - started
    return fields


def _wait_gone(pid: int, limit_s: float = 30.0) -> bool:
    """Whether `pid` exits within `limit_s` (its final write, if any, is then on disk)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if _state(pid) in ("", "Z", "X"):  # gone, or a zombie its parent has yet to reap
            return True
        time.sleep(0.05)
    return False


def _state(pid: int) -> str:
    """The process's state letter from /proc (R, S, Z, ...), or "" when there is none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _release(run_dir: str, pid: int) -> None:
    rundir.release_stale(run_dir, pid, socket.gethostname())


if __name__ == "__main__":
    keep(sys.argv[1], int(sys.argv[2]))
