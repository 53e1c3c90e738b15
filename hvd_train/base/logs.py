"""Each rank's full output in `<run.dir>/logs/rank-<N>.log`; the console keeps one line a failure.

Written by the workers themselves, so the logs exist under raw horovodrun or mpirun too. Until
run.dir is claimed (it may be another job's), a worker that a launcher started keeps its
stderr (and, on ranks other than 0, its stdout) in an unnamed temporary file; `attach` then
appends a header and that early output to the rank's log and points the file descriptors at
it: TensorFlow's and Horovod's C++ lines, Python warnings and tracebacks land there. Rank 0
keeps stdout on the console and copies the project log's lines into its file.

A rank's one-line failure goes to the stderr it was started with, where launchers read it:
`[rank N] failed: <what>; full log: <run.dir>/logs/rank-N.log`.

`HVD_TRAIN_CONSOLE_ALL_RANKS=1` keeps every rank's output on the console (the logs are still
written, with the header and the lines of the project log and failures only).

TensorFlow prints its C++ start-up lines (oneDNN, CPU features) as it is imported, whatever
TF_CPP_MIN_LOG_LEVEL says: every command that imports it calls `quiet_tensorflow` first, which
sends them to the rank's log under a launcher (or drops them where no log is started) and keeps
them off the console of a process started alone.

Writing a log never stops training: a full disk or a missing folder leaves the output where it
was. Standard library only.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any, TextIO

from hvd_train.base import deferred

CONSOLE_ALL_RANKS = "HVD_TRAIN_CONSOLE_ALL_RANKS"
ATTEMPT = "HVD_TRAIN_ATTEMPT"  # set by `hvd-train launch` for the header
_RANK_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


class _State:
    rank: int | None = None  # a launcher's worker, once `hold` ran
    console: int | None = None  # a dup of the stderr this process was started with
    early: Any = None  # the temporary file holding output from before `attach`
    saved: dict[int, int] = {}  # fd -> its dup from before `hold`
    log_fd: int | None = None
    path: str | None = None
    reported = False  # this rank's one failure line was printed
    start_up = ""  # TensorFlow's start-up lines, caught alone (quiet_tensorflow), for the log


_s = _State()


def launcher_size() -> int:
    """The job's worker count as its launcher set it (1 without a launcher)."""
    for key in ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 1


def launcher_rank() -> int | None:
    """This worker's rank as its launcher set it; None outside a launcher."""
    for key in _RANK_VARIABLES:
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return None


def hold() -> None:
    """Under a launcher, keeps stderr (and stdout off rank 0) aside until `attach` knows the
    log. Call before TensorFlow loads; does nothing alone, or with CONSOLE_ALL_RANKS set."""
    rank = launcher_rank()
    if rank is None or _s.rank is not None:
        return
    _s.rank = rank
    _s.console = os.dup(2)
    if os.environ.get(CONSOLE_ALL_RANKS):
        return
    try:
        _s.early = tempfile.TemporaryFile()
    except OSError:
        return
    _redirect(_s.early.fileno(), _fds(rank))


def attach(path: str, rank: int, attempt: str) -> None:
    """Starts this rank's log at `path` (`logs/rank-N.log` in run.dir, claimed by now:
    record/layout.py names it): a header, the held output, then everything the redirected
    descriptors receive."""
    if _s.console is None:
        _s.console = os.dup(2)
    if _s.log_fd is not None:  # an earlier train() in this process
        os.close(_s.log_fd)
        _s.log_fd = None
    _s.rank, _s.path, _s.reported = rank, path, False
    try:
        os.makedirs(os.path.dirname(_s.path), exist_ok=True)
        _s.log_fd = os.open(_s.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:
        release()  # no log: the console keeps everything
        _s.path = None
        return
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    _write(f"--- {stamp} rank {rank} on {socket.gethostname()}, pid {os.getpid()}, {attempt}\n")
    _write(_s.start_up)
    _s.start_up = ""
    if _s.early is not None:
        flush_std()
        _copy_early(_s.log_fd)
        _redirect(_s.log_fd, _fds(rank))
        _s.early.close()
        _s.early = None


def quiet_tensorflow(log: Callable[[int], str] | None = None, command: str = "") -> None:
    """Keeps TensorFlow's C++ start-up lines off the console. Call before TensorFlow loads.

    Under a launcher, `hold`s this rank's output, then, given the `command` and `log` (a rank's
    log path in the run.dir of a run a training job started: record/layout.py's
    `started_run_logs`), `attach`es it there (header: the command); without one, what was held
    is dropped when the process ends (a one-line error or a traceback still reaches the
    console).
    Alone, imports TensorFlow as base/deferred.py does, with its stderr caught, keeps the
    start-up lines for a log that `attach` may start (or drops them), and passes the rest on;
    if the import fails, all of it, and the error is raised. TF_CPP_MIN_LOG_LEVEL=0 leaves a
    lone process's lines alone.
    """
    if launcher_rank() is not None:
        hold()
        if command and log is not None:
            attach(log(_s.rank), _s.rank, command)
        return
    if "tensorflow" in sys.modules or os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0":
        return
    try:
        caught = tempfile.TemporaryFile()
    except OSError:  # nowhere to catch them: TensorFlow prints them as it would
        return
    with caught:
        flush_std()
        saved = os.dup(2)
        os.dup2(caught.fileno(), 2)
        try:
            deferred.import_tensorflow()
        except BaseException:
            _to_console(_restore_stderr(saved, caught), end="")  # all of it, then the error
            raise
        _s.start_up, rest = split_start_up(_restore_stderr(saved, caught))
    _to_console(rest, end="")


# What TensorFlow's import prints on its own: the line absl prints before its first record, and
# INFO records (`I0000 00:00:1795618060.609153    7021 port.cc:153] oneDNN custom ...`) with
# their continuation lines (cpu_feature_guard's `To enable the following instructions: ...`).
_ABSL_BANNER = "WARNING: All log messages before absl::InitializeLog() is called"
_ABSL_RECORD = re.compile(r"[IWEF]\d{4} [\d:.]+ +\d+ [^ \]]+:\d+\] ")
_PYTHON_WARNING = re.compile(r".+:\d+: \w+: ")


def split_start_up(text: str) -> tuple[str, str]:
    """(TensorFlow's start-up lines, everything else) of what its import printed: warnings
    and errors (W, E records) and Python's warnings are not start-up lines."""
    start_up, rest, in_info = [], [], False
    for line in text.splitlines(keepends=True):
        record = _ABSL_RECORD.match(line)
        if record or line.startswith(_ABSL_BANNER) or _PYTHON_WARNING.match(line):
            in_info = bool(record) and line.startswith("I")
            ours = in_info or line.startswith(_ABSL_BANNER)
        else:
            ours = in_info  # a continuation line of the record before it
        (start_up if ours else rest).append(line)
    return "".join(start_up), "".join(rest)


def _restore_stderr(saved: int, caught: Any) -> str:
    """Points stderr back at `saved` (closed); returns what `caught` received meanwhile."""
    flush_std()
    os.dup2(saved, 2)
    os.close(saved)
    caught.seek(0)
    return caught.read().decode(errors="replace")


def release(replay: bool = True) -> None:
    """Gives the held descriptors back before `attach`; with `replay`, with what they held
    (a failure that is not one line: its traceback belongs on the console)."""
    if _s.early is None:
        return
    flush_std()
    for fd, saved in _s.saved.items():
        os.dup2(saved, fd)
    if replay:
        _copy_early(2)
    _s.early.close()
    _s.early = None


def on_console() -> bool:
    """Whether this rank's lines belong on the console: rank 0's, any before its log, or all
    with CONSOLE_ALL_RANKS."""
    return _s.log_fd is None or not _s.rank or bool(os.environ.get(CONSOLE_ALL_RANKS))


def attempt_description(resume: str) -> str:
    """The header's words for this start: the launcher's attempt and the resume setting."""
    n = os.environ.get(ATTEMPT)
    return f"{f'attempt {n}, ' if n else ''}train.resume={resume}"


def log_path() -> str | None:
    return _s.path


def copy(line: str) -> None:
    """Rank 0: a line of the project log, printed on the console, into the log file too."""
    if _s.log_fd is not None and _s.rank == 0:
        _write(line + "\n")


def say(line: str, console: bool = True) -> None:
    """A line for the log and, with `console`, for the console this rank was started with."""
    if _s.log_fd is not None:
        _write(line + "\n")
    if console:
        _to_console(line)


def failed(what: str, error: BaseException | None = None) -> None:
    """This rank's one failure line (once): the console gets it with the log's path; the log
    gets it after the traceback of `error`, when given (a bug, not a one-line error)."""
    if _s.reported:
        return
    _s.reported = True
    if error is not None and _s.log_fd is not None:
        flush_std()
        _write("".join(traceback.format_exception(type(error), error, error.__traceback__)))
    rank = _s.rank if _s.rank is not None else 0
    where = f"; full log: {_s.path}" if _s.path else ""
    if _s.log_fd is not None:
        _write(f"[rank {rank}] failed: {what}\n")
    _to_console(f"[rank {rank}] failed: {what}{where}")


def reported() -> bool:
    return _s.reported


def attached() -> bool:
    return _s.log_fd is not None


def _fds(rank: int) -> list[int]:
    return [2] if rank == 0 else [1, 2]


def _redirect(target: int, fds: list[int]) -> None:
    flush_std()
    for fd in fds:
        if fd not in _s.saved:
            _s.saved[fd] = os.dup(fd)
        os.dup2(target, fd)
    _forgive_std()


def _forgive_std() -> None:
    """sys.stdout/sys.stderr that drop a write the log's disk refuses (ENOSPC)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _Forgiving):
            setattr(sys, name, _Forgiving(stream))


class _Forgiving:
    """A text stream whose failed writes are dropped: a full disk must not end training.
    Everything else is the wrapped stream's (encoding, buffer, ...)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            pass

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _copy_early(fd: int) -> None:
    try:
        _s.early.seek(0)
        data = _s.early.read()
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        pass


def _write(text: str) -> None:
    data = text.encode(errors="replace")
    try:
        while data:
            data = data[os.write(_s.log_fd, data) :]
    except OSError:  # a full disk: the log misses the line, training goes on
        pass


def _to_console(line: str, end: str = "\n") -> None:
    fd = _s.console if _s.console is not None else 2
    data = (line + end).encode(errors="replace")
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:  # nobody reads the console any more (the launcher died)
        pass


def print_line(line: str, stream: TextIO | None = None) -> None:
    """`line` and its newline in one write to `stream` (stdout by default). Under horovodrun
    (PYTHONUNBUFFERED=1) print() writes a line and its newline apart, and Open MPI's tagged
    output can then put another rank's line between the two."""
    stream = stream or sys.stdout
    stream.write(line + "\n")
    stream.flush()


def flush_std() -> None:
    """stdout and stderr flushed, whatever became of them (closed, or a reader gone)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
