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

Writing a log never stops training: a full disk or a missing folder leaves the output where it
was. Standard library only.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
import traceback
from typing import Any

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
    if _s.early is not None:
        flush_std()
        _copy_early(_s.log_fd)
        _redirect(_s.log_fd, _fds(rank))
        _s.early.close()
        _s.early = None


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


def _to_console(line: str) -> None:
    fd = _s.console if _s.console is not None else 2
    try:
        os.write(fd, (line + "\n").encode(errors="replace"))
    except OSError:  # nobody reads the console any more (the launcher died)
        pass


def flush_std() -> None:
    """stdout and stderr flushed, whatever became of them (closed, or a reader gone)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
