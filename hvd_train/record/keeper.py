"""The keeper: a process that outlives rank 0 and makes sure its record tells the truth.

Rank 0's RunRecord starts it (`python -m hvd_train.record.keeper RUN_DIR PID`) outside the
job's process tree. It waits for rank 0 to end; when summary.json still says `running`, rank 0
died without its final word, and the keeper writes `failed` or `interrupted` itself, frees the
reserve and releases rank 0's hold on run.dir. Then, with logging.mlflow, it sets the run's
MLflow run to the record's ending, unless rank 0 said it had (mlflow_run.follow_record).

Standard library only: it starts in a moment and holds no TensorFlow (MLflow loads only when
the MLflow run is left for it to end).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time

from hvd_train.base import logs
from hvd_train.base.errors import NO_STATUS
from hvd_train.record import mlflow_run, rundir
from hvd_train.record.layout import RunDir
from hvd_train.record.run_record import free_reserve
from hvd_train.record.summary import Summary, read_summary, write_summary


def keep(run_dir: str, pid: int) -> None:
    """The keeper: waits for `pid` to end, then makes sure its record tells the truth."""
    # Leave the process tree: a launcher that kills the job's tree (horovodrun kills the
    # children of a worker that outlived its grace) must not take the keeper with it.
    if os.fork():
        os._exit(0)
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):  # it ends when rank 0 has
        signal.signal(sig, signal.SIG_IGN)
    stop_signal = 0
    mlflow: dict[str, str] = {}  # rank 0's MLflow run: its URI, and the status rank 0 set
    for line in sys.stdin:  # until rank 0's end of the pipe closes: it has ended
        try:
            event = json.loads(line)
        except ValueError:
            continue
        stop_signal = stop_signal or int(event.get("signal", 0))
        mlflow.update({k: v for k, v in event.items() if k.startswith("mlflow_")})
    if not _wait_gone(pid):
        return  # rank 0's process lives on (it ran train() and goes on): its run.dir, its job
    path = RunDir(run_dir).summary
    summary = read_summary(path)
    said = ""
    if summary.get("status") == "running":
        summary.update(ended_without_rank0(summary, pid, stop_signal))
        free_reserve(run_dir)
        try:
            write_summary(path, summary)
            said = f"[hvd_train] {summary['error']}; {path} says {summary['status']}"
        except OSError as e:
            said = f"[hvd_train] cannot write {path}: {e}"
    free_reserve(run_dir)
    _release(run_dir, pid)
    try:  # the launcher that read rank 0's output may be gone with it
        if said:
            logs.print_line(said, sys.stderr)
    except OSError:
        pass
    _end_mlflow_run(run_dir, mlflow)


def _end_mlflow_run(run_dir: str, mlflow: dict[str, str]) -> None:
    """With logging.mlflow, the MLflow run's status as the record ends, unless rank 0 set it
    (`mlflow_ended`). Last: it may take a few seconds, and no one waits for it."""
    summary = read_summary(RunDir(run_dir).summary)
    run = summary.get("mlflow") or {}
    want = mlflow_run.STATUS.get(summary.get("status", ""))
    if not run.get("run_id") or not want or mlflow.get("mlflow_ended") == want:
        return
    try:
        mlflow_run.follow_record(run_dir, mlflow.get("mlflow_uri"))
    except Exception as e:
        try:
            print(f"[hvd_train] cannot set the MLflow run {run['run_id']} to {want}: "
                  f"{mlflow_run.cause(e)}", file=sys.stderr, flush=True)  # fmt: skip
        except OSError:
            pass


def ended_without_rank0(summary: Summary, pid: int, stop_signal: int) -> Summary:
    """The fields that end a record whose rank 0 died before writing its end."""
    who = f"rank 0 (pid {pid} on {socket.gethostname()})"
    fields: Summary = {"recorded_by": "keeper"}
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
