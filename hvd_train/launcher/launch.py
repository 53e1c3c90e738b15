"""horovodrun under a supervisor that restarts a failed job from its checkpoint (`hvd-train launch`).

    hvd-train launch --config FILE [--set k=v ...] [--np N] [--hosts H:S,...] [--mpi | --gloo]
                     [--max-restarts N] [--network-interface IF] [--ssh-port P]
                     [--ssh-identity-file F] [--print-command]

The command is horovodrun.command's, as for every launcher; `--print-command` prints it (one
line, shell-quoted) instead of running it: launch/*.sh run what it prints.

Each attempt is one real `horovodrun` job. When it fails, the supervisor names the rank that
failed first (from horovodrun's or mpirun's report), marks summary.json `failed` (unless the
attempt never claimed run.dir: rank 0 holds its lock, the supervisor does not), and, while
restarts remain, starts the same job again with `train.resume=auto`, which continues from the
newest checkpoint. It does not restart after a bad config, bad input or a run.dir another job
holds (exit code 2), a non-finite loss (the same data would fail again), or a SIGTERM/SIGINT
(or Slurm's warning, SIGUSR1) sent to the supervisor itself (passed on to the workers, which
stop at a step boundary and checkpoint).

The console shows rank 0's lines as they are and the others' marked `[rank N]` (their full
output is in run.dir/logs/rank-N.log, see logs.py), without horovodrun's own traceback: each
failed attempt ends in one verdict line naming the rank, its host, its log and what to do.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import os
import re
import shlex
import shutil
import signal
import sys
import time

from hvd_train.base import logs, startup
from hvd_train.base.errors import (
    ANOTHER_FIRST,
    KNOCK_ON,
    NO_STATUS,
    RunDirError,
    UserError,
    error_class,
    exit_description,
)
from hvd_train.config import Config
from hvd_train.launcher import horovodrun, srun_ssh
from hvd_train.launcher.horovodrun import on_loopback
from hvd_train.launcher.supervise import Supervisor
from hvd_train.record import mlflow_run, rundir
from hvd_train.record.layout import RunDir
from hvd_train.record.stops import STOP_SIGNALS
from hvd_train.record.summary import (
    LaunchFailure,
    Summary,
    early_summary,
    read_summary,
    write_summary,
)

GLOO_FIRST = re.compile(r"Terminating remaining workers after failure of Process (\d+)")
GLOO_NAMED = re.compile(r"Process name: (\d+)\s+Exit code: (-?\d+)")
# The same, in the one line that ends the job under Horovod as patches/horovod-0.28.1/0005 leaves it.
GLOO_ENDING = re.compile(r"^horovodrun: process (\d+) exited first, with code (-?\d+)", re.M)
HOROVODRUN_ENDING = re.compile(r"horovodrun: (?:process \d+ exited first|mpirun failed)")
GLOO_EXIT = re.compile(r"Process (\d+) exit with status code (-?\d+)")
MPI_NAMED = re.compile(r"Process name:\s+\[\[\d+,\d+\],(\d+)\]\s+Exit code:\s+(-?\d+)")
# mpirun's report of a rank killed by a signal (it names no exit code): 128 + the signal's.
MPI_SIGNALED = re.compile(r"mpirun noticed that process rank (\d+) with PID \d+ on node \S+ "
                          r"exited on signal (\d+)")  # fmt: skip
# A rank's failure line (logs.failed); the path of its log after `; full log: ` is left out.
RANK_FAILED = re.compile(r"\[rank (\d+)\] failed: (.*?)(?:; full log: .*)?$", re.MULTILINE)
# horovodrun's prefix of a worker's line: `[1]<stderr>:` (Gloo), `[1,0]<stderr>:` (MPI's
# --tag-output, job id first).
WORKER_PREFIX = re.compile(r"\[(?:\d+,)?(\d+)\]<(?:stdout|stderr)>:")


def attempts(cfg: Config, args: argparse.Namespace, np_: int) -> int:
    """Runs the job (`args` as `hvd-train launch` parsed them) until it completes, is stopped,
    fails for a reason a restart cannot fix, or has used `--max-restarts`; returns the exit
    code (see `_exit_code`)."""
    summary_path = RunDir(cfg.run.dir).summary
    before = read_summary(summary_path)  # unchanged by a job that had nothing to train
    history: list[LaunchFailure] = []
    supervisor = Supervisor()  # SIGTERM/SIGINT/SIGUSR1 to the launcher reach the workers
    ours = False  # whether an attempt claimed run.dir: its summary.json is then this job's
    for attempt in range(args.max_restarts + 1):
        overrides = list(args.overrides) + (["train.resume=auto"] if attempt else [])
        cmd, env = command(cfg, args, np_, overrides)
        say(f"attempt {attempt + 1} of {args.max_restarts + 1}: {_short(cmd)}")
        held = rundir.read_lock(cfg.run.dir)  # the supervisor never takes the lock: rank 0 does
        env[logs.ATTEMPT] = str(attempt + 1)
        # The workers' start-up record counts from the user's command (the first attempt) or
        # from this restart.
        env[startup.LAUNCHED_AT] = str(startup.process_created() if not attempt else time.time())
        code, output = supervisor.run(cmd, env=env, tidy=Tidy)
        if code == 0 and supervisor.stop_signal:
            code = _stopped_code(summary_path, supervisor.stop_signal)
        if code == 0 and before and read_summary(summary_path) == before:
            say("nothing was trained: run.dir is as it was")
            return 0
        if code == 0:
            _record(summary_path, history, attempt)
            say(f"job completed after {attempt} restart(s)" if attempt else "job completed")
            return 0
        ours = ours or not _held_by_another_job(cfg.run.dir, held)
        failure = first_failure(output)
        failure.update(attempt=attempt + 1, exit_code=code, time=time.time())
        history.append(failure)
        if ours:
            mark_ended(summary_path, failure, supervisor.stop_signal, cfg, np_)
            _follow_in_mlflow(cfg)
        reason = _no_restart_reason(failure, summary_path, supervisor.stop_signal)
        last = attempt == args.max_restarts or bool(reason)
        hosts = None if cfg.elastic.enabled else args.hosts or f"localhost:{np_}"
        advice = _advice(cfg.train.resume) if last and not reason else ""
        _say_ending(failure, supervisor.stop_signal, cfg.run.dir, hosts, advice)
        if reason:
            say(f"not restarting: {reason}")
            break
        if attempt < args.max_restarts:
            say(f"restarting ({attempt + 1} of {args.max_restarts}) from the newest checkpoint")
    if ours:
        _record(summary_path, history, len(history) - 1)
    return _exit_code(history[-1], supervisor.stop_signal) if history else 1


def _exit_code(failure: LaunchFailure, stop_signal: int) -> int:
    """The launcher's exit code: 128 + the signal when it passed a stop on (130 for Ctrl-C, 143
    for SIGTERM, as a shell reports a program a signal ended: a script can tell a stop from a
    failure); 2 when the rank that failed first says the user's input is at fault (as a worker
    alone does); else 1 (horovodrun and mpirun pass on a killed rank's 137, which would read
    as a stop by SIGKILL)."""
    if stop_signal:
        return 128 + stop_signal
    user = UserError.exit_code
    return user if failure["rank_exit_code"] == user else 1


def command(
    cfg: Config, args: argparse.Namespace, np_: int, overrides: list[str]
) -> tuple[list[str], dict[str, str]]:
    """One attempt's horovodrun command and environment (horovodrun.command, as every launcher).

    Under `--slurm`, horovodrun's `ssh` is srun (launcher/srun_ssh.py): Slurm starts the other
    nodes' workers, inside the job, with no ssh between the nodes.
    """
    ssh = ["--ssh-port", str(args.ssh_port)] if args.ssh_port else []
    ssh += ["--ssh-identity-file", args.ssh_identity_file] if args.ssh_identity_file else []
    placement = horovodrun.Placement(np_, args.hosts, args.controller, args.nics or "", tuple(ssh))
    cmd, env = horovodrun.command(cfg, args.config, overrides, placement)
    if getattr(args, "slurm", False):
        env["PATH"] = f"{_srun_ssh_folder()}{os.pathsep}{env['PATH']}"
    return cmd, env


@functools.cache
def _srun_ssh_folder() -> str:
    """The folder of this launcher's `ssh` that runs srun, removed when the launcher exits."""
    folder = srun_ssh.install()
    atexit.register(shutil.rmtree, folder, True)
    return folder


def _held_by_another_job(run_dir: str, before: rundir.Holder | None) -> bool:
    """After a failed attempt (its workers are gone): whether run.dir's lock is another job's,
    so the attempt was refused or never claimed run.dir and summary.json is not its own.

    Another job's: a live process on this host, or a lock unchanged since before the attempt.
    """
    after = rundir.read_lock(run_dir)
    return after is not None and (after == before or rundir.alive_here(after))


def first_failure(output: str) -> LaunchFailure:
    """{'rank': R, 'rank_exit_code': C, 'error': ...} of the worker that failed first.

    horovodrun and mpirun name the first process to *exit*. A rank killed by a signal exits at
    once, so that report is right for it. But after an error in one rank, the others often exit
    first, with Horovod shut down under them; so the first error a rank reported that is not
    such a consequence wins over the exit order.
    """
    codes = {int(r): int(c) for r, c in GLOO_EXIT.findall(output)}
    m = MPI_NAMED.search(output) or GLOO_NAMED.search(output) or GLOO_ENDING.search(output)
    signaled = MPI_SIGNALED.search(output)
    if m and signaled and int(m.group(2)) in STOP_CODES:
        m = None  # mpirun named first a rank it ended itself, and what killed another after
    if m:
        rank, code = int(m.group(1)), int(m.group(2))
    elif signaled:
        rank, code = int(signaled.group(1)), 128 + int(signaled.group(2))
    elif GLOO_FIRST.search(output):
        rank = int(GLOO_FIRST.search(output).group(1))
        code = codes.get(rank)
    else:
        rank, code = None, None
    killed = code is not None and (code > 128 or code < 0)
    for r, error in RANK_FAILED.findall(output):
        if not killed and not any(c in error for c in (*KNOCK_ON, ANOTHER_FIRST)):
            own = codes.get(int(r), code)
            # Ended by the launcher after its report (SIGTERM): the first exit's code says more
            # (every rank raised the same user error, exit code 2, and another exited first).
            own = code if own is not None and (own > 128 or own < 0) else own
            return {"rank": int(r), "rank_exit_code": own, "error": error}
    return {"rank": rank, "rank_exit_code": code, "error": None}


def describe(failure: LaunchFailure, host: str | None = None) -> str:
    """`rank R [on HOST] failed first: ERROR` or `... (exit code C, killed by SIG)`."""
    rank, code = failure["rank"], failure["rank_exit_code"]
    if rank is None:
        return f"horovodrun exited with code {failure['exit_code']} (no rank reported)"
    if host:
        rank = f"{rank} on {host}"
    if failure.get("error"):  # its own report; its exit code may be the launcher's SIGTERM
        return f"rank {rank} failed first: {failure['error']}"
    return f"rank {rank} failed first ({exit_description(code)})"


_SIGNALS = {s.value: s.name for s in signal.Signals}
# What a stop left in the record, wrong once the ending is a failure.
STOP_FIELDS = ("stopped_by", "stop_detail", "stopped_at", "stop_signal")
# The exit codes of a process a stop signal ended (128 + it, or Python's -it).
STOP_CODES = frozenset(c for sig in STOP_SIGNALS for c in (128 + sig, -sig))


def _say_ending(
    failure: LaunchFailure, stop_signal: int, run_dir: str, hosts: str | None, advice: str
) -> None:
    """The attempt's verdict in one line: who failed first, where, its log, what to do."""
    attempt = failure["attempt"]
    if stop_signal:  # the workers' exit codes only echo the stop
        say(f"attempt {attempt} stopped by {_SIGNALS[stop_signal]}")
        return
    rank = failure["rank"]
    host = rank_host(hosts, rank) if hosts and rank is not None else None
    path = RunDir(run_dir).rank_log(rank) if rank is not None else ""
    if path and (not host or on_loopback(host)) and not os.path.exists(path):
        path = ""  # it failed before run.dir was its job's: no log (or another job's)
    where = f"; full log: {path}" if path else ""
    advice = f"; {advice}" if advice else ""
    say(f"attempt {attempt} failed: {describe(failure, host)}{where}{advice}")


def rank_host(hosts: str, rank: int) -> str | None:
    """The host of `rank` under `-H host:slots,...`: ranks fill each host's slots in order
    (horovodrun's assignment, and mpirun's default mapping by slot)."""
    first = 0
    for item in hosts.split(","):
        name, _, slots = item.strip().rpartition(":")
        if not name or not slots.isdigit():
            return None
        if rank < first + int(slots):
            return name
        first += int(slots)
    return None


def _advice(resume: str) -> str:
    """What to do after the last attempt failed, for a failure a restart may get past."""
    again = "run the same command" + ("" if resume == "auto" else " with --set train.resume=auto")
    return f"to continue from the last checkpoint, {again} (or add --max-restarts N to restart by itself)"


class Tidy:
    """The console's view of one of horovodrun's output streams: rank 0's lines as its
    workers wrote them, other ranks' marked `[rank N]`, without horovodrun's own traceback and
    exit notes (the launcher's one-line verdict says what they say). Call with each line:
    returns the line to show, or None."""

    def __init__(self) -> None:
        self.traceback = False

    def __call__(self, line: str) -> str | None:
        m = WORKER_PREFIX.match(line)
        if m:
            rank, text = int(m.group(1)), line[m.end() :]
            mark = f"[rank {rank}]"
            return text if rank == 0 or text.startswith(mark) else f"{mark} {text}"
        # horovodrun's traceback (its RuntimeError, with the process that exited first), or the
        # one line it is patched to, ends its output: nothing of it is shown.
        self.traceback = self.traceback or line.startswith("Traceback (most recent call last)")
        if self.traceback or any(p.match(line) for p in (GLOO_EXIT, GLOO_FIRST, HOROVODRUN_ENDING)):
            return None
        return line


def _short(cmd: list[str]) -> str:
    """The command, its programs without their folders: one readable line."""
    return shlex.join(os.path.basename(w) if os.path.isfile(w) and os.access(w, os.X_OK) else w
                      for w in cmd)  # fmt: skip


def _no_restart_reason(failure: LaunchFailure, summary_path: str, stop_signal: int) -> str:
    """Why a restart would fail the same way ("" when it may not): the stop was asked for, the
    first failure was the user's, or rank 0's error (summary.json's `error_type`) would recur."""
    if stop_signal:
        return f"the launcher received {_SIGNALS[stop_signal]}"
    if failure["rank_exit_code"] == UserError.exit_code:
        return UserError.recurs
    cls = error_class(_read(summary_path).get("error_type") or "")
    return cls.recurs if cls else ""


def mark_ended(path: str, failure: LaunchFailure, stop_signal: int, cfg: Config, np_: int) -> None:
    """summary.json tells how the attempt ended, with the first failure as its cause.

    Rank 0 (or the keeper it left behind) has usually written the ending; the launcher knows
    what they cannot: which rank failed first, and whether the stop was asked for. A worker
    that died first makes the ending `failed`, also when rank 0 took the launcher's SIGTERM
    that followed for a stop. A job that ended before rank 0 started the record gets one here,
    unless it was refused for the user's input (run.dir another job's or not a run's, a bad
    config: nothing of the job's is there).
    """
    summary = _read(path, wait_s=10)
    if summary.get("status") == "completed":
        return
    if not summary:
        if failure["rank_exit_code"] == UserError.exit_code or not _may_record_in(cfg.run.dir):
            return
        summary = early_summary(np_, cfg.train.epochs, "launcher")
    if stop_signal and summary.get("status") in ("running", "failed"):
        summary.update(status="interrupted", stopped_by=_SIGNALS[stop_signal])
    elif not stop_signal and (summary.get("status") != "interrupted" or _died(failure)):
        for key in STOP_FIELDS:  # rank 0's stop was the launcher's, after the failure
            summary.pop(key, None)
        summary.update(status="failed", failure=_cause(failure))
        summary.pop("failed_rank", None)
        if _died(failure) or failure.get("error"):
            summary["failed_rank"] = failure["rank"]
        error = summary.get("error") or ""
        if failure.get("error") and (not error or _is_knock_on(error)):
            summary["error"] = f"rank {failure['rank']}: {failure['error']}"
            summary.pop("error_type", None)  # rank 0's knock-on error's, not the cause's
    if summary["status"] == "failed" and not summary.get("error"):
        launcher = summary.get("recorded_by") == "launcher"
        summary["error"] = (
            "the job ended in its start-up, before rank 0 started the record" if launcher
            else summary["failure"]
        )  # fmt: skip
    try:
        os.makedirs(cfg.run.dir, exist_ok=True)
        write_summary(path, summary)
    except OSError as e:
        say(f"cannot write {path}: {e.strerror or e}")


def _cause(failure: LaunchFailure) -> str:
    """The record's `failure`: `describe`, but never a rank blamed for a stop it was sent.

    mpirun may report first the rank it ended itself (SIGTERM) after another one died, or no
    rank at all; with no stop passed on, such a first exit is no cause.
    """
    if failure["rank"] is None or _died(failure) or failure.get("error"):
        return describe(failure)
    code = exit_description(failure["rank_exit_code"])
    return f"no rank reported as failed: rank {failure['rank']} exited first ({code})"


def _follow_in_mlflow(cfg: Config) -> None:
    """With logging.mlflow, the run's MLflow run ends as the record the launcher just wrote says
    (a worker killed first makes it FAILED also when rank 0 recorded a stop)."""
    if not cfg.logging.mlflow:
        return
    try:
        mlflow_run.follow_record(cfg.run.dir, mlflow_run.where(cfg.logging).uri)
    except Exception as e:
        say(f"cannot set the status of the run's MLflow run: {mlflow_run.cause(e)}")


def _died(failure: LaunchFailure) -> bool:
    """Whether the rank that ended first died or failed, rather than stopped (SIGTERM, SIGINT or
    SIGUSR1, which a scheduler may send the workers themselves)."""
    code = failure["rank_exit_code"]
    return failure["rank"] is not None and code is not None and code not in STOP_CODES


def _may_record_in(run_dir: str) -> bool:
    """Whether run.dir is absent or an earlier run's: the launcher may start a record there."""
    if not os.path.exists(run_dir):
        return True
    try:
        return not rundir.foreign_files(run_dir)
    except RunDirError:
        return False


def _is_knock_on(error: str) -> bool:
    """An error that says only that another rank went first (or rank 0's keeper's guess)."""
    return error.startswith(ANOTHER_FIRST) or NO_STATUS in error


def _record(path: str, history: list[LaunchFailure], restarts: int) -> None:
    summary = _read(path)
    if summary:
        summary["launch"] = {"restarts": max(restarts, 0), "failures": history}
        write_summary(path, summary)


def _stopped_code(summary_path: str, stop_signal: int) -> int:
    """The exit code of a job that exited 0 after the launcher passed a stop on: 0 if the run
    completed anyway, else 128 + the signal (a Horovod without patches/horovod-0.28.1 may
    report a stopped job as exit 0)."""
    completed = _read(summary_path, wait_s=10).get("status") == "completed"
    return 0 if completed else 128 + stop_signal


def _read(path: str, wait_s: float = 0.0) -> Summary:
    """summary.json; with `wait_s`, waits that long for a `running` one to end (rank 0's
    keeper writes it once rank 0 has exited, a moment after the job)."""
    deadline = time.monotonic() + wait_s
    summary = read_summary(path)
    while summary.get("status") == "running" and time.monotonic() < deadline:
        time.sleep(0.1)
        summary = read_summary(path)
    return summary


def say(message: str) -> None:
    print(f"[hvd_train launch] {message}", file=sys.stderr, flush=True)
