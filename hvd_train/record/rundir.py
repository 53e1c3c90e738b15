"""run.dir belongs to one job: rank 0 claims it, with a lock file, before writing anything in it.

A claim is refused, in one line that names run.dir and the fix, when another job holds run.dir,
when run.dir is a file or cannot be created or written, and when it holds files that are not a
run's (unless `run.overwrite: true`). An empty folder or an earlier run's folder is fine: that
is how a run resumes.

The lock, `run.dir/.hvd_train.lock`, names its holder: pid, host, the process's start time
(so that a reused pid is not taken for the holder) and when it was taken. A lock whose process
is gone from this host is stale and taken over; a lock from another host is never guessed
about (its process cannot be seen from here): the message says how to clear it.

Standard library only: a watcher that outlives rank 0 calls `release_stale` without Horovod.
"""

from __future__ import annotations

import errno
import fcntl
import fnmatch
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict

from hvd_train.base import logs
from hvd_train.base.errors import RunDirError
from hvd_train.base.files import TEMPORARY_PATTERNS, atomic_write
from hvd_train.record import layout
from hvd_train.record.layout import RunDir

LOCK_NAME = layout.LOCK
# Atomic writes that a crash left half done: summary.json.tmp, model.tmp-123.keras, model.old-123.
TEMPORARY = TEMPORARY_PATTERNS
# A lock read while its creator has not written it yet (a job starting at the same moment).
_UNWRITTEN_WAIT_S = 2.0


class Holder(TypedDict, total=False):
    """run.dir's lock: the process that holds it (`_this_process`)."""

    pid: int
    host: str
    start_time: int | None  # clock ticks after boot: a reused pid is not the holder
    pid_namespace: str | None  # a container's own pid space (see `_this_process`)
    time: str  # when it was taken


class InUse(RunDirError):
    """Another job holds run.dir: alive on this host, or on another host."""


class NotWritable(RunDirError):
    """run.dir is a file, or cannot be created, read or written."""


class NotARunDir(RunDirError):
    """run.dir holds files that are not a run's, and `run.overwrite` is false."""


def _print(message: str) -> None:
    logs.print_line(f"[hvd_train] {message}")


def claim(
    run_dir: str,
    *,
    overwrite: bool,
    config_path: str | None,
    log: Callable[[str], None] = _print,
) -> Claim:
    """Makes run.dir this process's: creates it if needed and takes its lock.

    Call on rank 0 only, before anything is written into run.dir; release the claim at every
    ending (`Claim.release`).

    Args:
        run_dir: `run.dir`.
        overwrite: `run.overwrite`: write the run's files beside other files in run_dir.
        config_path: the `--config` file, which `Claim.write_config` never writes over; None
            when the config is the defaults alone.
        log: prints one line (a stale lock taken over). Defaults to printing `[hvd_train] ...`.

    Raises:
        InUse, NotWritable, NotARunDir: one line naming run_dir and the fix (exit code 2).
    """
    _make_folder(run_dir)
    if not overwrite:
        _refuse_foreign_files(run_dir)
    me = _this_process()
    _take_lock(run_dir, me, log)
    return Claim(run_dir, me, config_path, log)


@dataclass
class Claim:
    """This process's hold on run.dir, from `claim`."""

    run_dir: str
    holder: Holder
    config_path: str | None
    log: Callable[[str], None]
    released: bool = False

    def write_config(self, text: str) -> None:
        """Writes run.dir/config.yaml (the resolved config) atomically, unless it is the
        `--config` file itself: that is an earlier run's resolved config, left as it is."""
        path = RunDir(self.run_dir).config
        if self.config_path is not None and _same_file(self.config_path, path):
            differs = _read_text(path) != text
            note = (
                " (this run's resolved config differs: --set overrides or edits)" if differs else ""
            )
            self.log(f"{path} is the --config file: left as it is{note}")
            return
        try:
            with atomic_write(path) as f:
                f.write(text)
        except OSError as e:
            raise NotWritable(
                f"run.dir {self.run_dir}: cannot write {layout.CONFIG} ({_reason(e)}); free space "
                "or choose another run.dir"
            ) from None

    def release(self) -> None:
        """Removes the lock if it is still this claim's. Calling it again does nothing."""
        if not self.released:
            self.released = True
            _remove_lock_if(self.run_dir, lambda held: _same_holder(held, self.holder))


def release_stale(run_dir: str, pid: int, host: str) -> bool:
    """Removes run.dir's lock if it names `pid` on `host`; True if it did.

    For a process that outlives rank 0 (a watcher or supervisor) and knows rank 0 has died;
    a lock since taken by another job is left alone.
    """
    return _remove_lock_if(run_dir, lambda held: (held["pid"], held["host"]) == (pid, host))


def read_lock(run_dir: str) -> Holder | None:
    """The lock's record (pid, host, start_time, time, ...), or None without a readable lock."""
    try:
        with open(RunDir(run_dir).lock) as f:
            held = json.load(f)
    except (OSError, ValueError):
        return None
    return held if _valid(held) else None


def held_by_this_process(run_dir: str) -> bool:
    """True if run.dir's lock is this process's own (it claimed run.dir, and holds it)."""
    held = read_lock(run_dir)
    return held is not None and _same_holder(held, _this_process())


def alive_here(held: Holder) -> bool:
    """True if a lock's record names a process that is running on this host."""
    return _same_host(held) and _alive(held["pid"], held.get("start_time"))


# --------------------------------------------------------------------------- the folder


def _make_folder(run_dir: str) -> None:
    if os.path.lexists(run_dir) and not os.path.isdir(run_dir):
        raise NotWritable(
            f"run.dir {run_dir} exists and is not a folder; choose another run.dir, or move "
            "the file away"
        )
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as e:
        raise NotWritable(
            f"run.dir {run_dir}: cannot create the folder ({_reason(e)}); choose a run.dir in "
            "a writable place"
        ) from None


def foreign_files(run_dir: str) -> list[str]:
    """Names in run_dir that no run writes (folders end in /), sorted."""
    try:
        names = sorted(os.listdir(run_dir))
    except OSError as e:
        raise NotWritable(
            f"run.dir {run_dir}: cannot list the folder ({_reason(e)}); choose a run.dir this "
            "user may read and write"
        ) from None
    return [
        name + ("/" if os.path.isdir(os.path.join(run_dir, name)) else "")
        for name in names
        if name not in layout.RUN_FILES and not any(fnmatch.fnmatch(name, p) for p in TEMPORARY)
    ]


def _refuse_foreign_files(run_dir: str) -> None:
    found = foreign_files(run_dir)
    if found:
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise NotARunDir(
            f"run.dir {run_dir} holds files that are not a run's ({shown}); choose an empty or "
            "new folder, or set run.overwrite=true to write the run's files beside them"
        )


# --------------------------------------------------------------------------- the lock


def _take_lock(run_dir: str, me: Holder, log: Callable[[str], None]) -> None:
    """Takes the lock, or takes over a stale one, one claimant of this host at a time.

    Claimants on this host queue on an flock of run.dir itself, so two that find the same
    stale lock cannot both take it over (a lock from another host is never taken over).
    """
    try:
        guard = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise _not_writable(run_dir, e) from None
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)
        _take_lock_guarded(run_dir, me, log)
    finally:
        os.close(guard)  # releases the flock


def _take_lock_guarded(run_dir: str, me: Holder, log: Callable[[str], None]) -> None:
    path = RunDir(run_dir).lock
    for _ in range(10):  # each pass creates the lock, refuses, or found it gone or stale
        if _create_lock(path, me, run_dir):
            return
        held, ident = _read_holder(path, run_dir)
        if held is None:  # released since: try again
            continue
        _refuse_if_held(run_dir, path, held)
        if _remove_lock(path, ident, run_dir):
            log(
                f"run.dir {run_dir}: took over a stale lock (pid {held['pid']} on this host, "
                f"since {held.get('time', '?')}, is no longer running)"
            )
    raise InUse(
        f"run.dir {run_dir}: its lock {path} keeps changing (other jobs are starting on it); "
        "give each job its own run.dir"
    )


def _create_lock(path: str, me: Holder, run_dir: str) -> bool:
    """True if this process created the lock; False if one exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    except OSError as e:
        raise _not_writable(run_dir, e) from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(me) + "\n")
    except OSError as e:
        _remove_quietly(path)
        raise _not_writable(run_dir, e) from None
    return True


def _not_writable(run_dir: str, e: OSError) -> NotWritable:
    return NotWritable(
        f"run.dir {run_dir}: cannot write in it ({_reason(e)}); choose a run.dir this user may "
        "write in"
    )


def _read_holder(path: str, run_dir: str) -> tuple[Holder | None, tuple[int, int]]:
    """The lock's record and file identity; (None, ...) if the lock is gone.

    An empty lock may be one another job has just created and not yet written: it is read
    again for a moment before it is called unreadable.
    """
    deadline = time.monotonic() + _UNWRITTEN_WAIT_S
    while True:
        try:
            with open(path) as f:
                st = os.fstat(f.fileno())
                text = f.read()
        except FileNotFoundError:
            return None, (0, 0)
        except OSError as e:
            raise NotWritable(
                f"run.dir {run_dir}: cannot read its lock {path} ({_reason(e)}); choose a "
                "run.dir this user may read and write"
            ) from None
        try:
            held = json.loads(text)
        except ValueError:
            held = None
        if _valid(held):
            return held, (st.st_dev, st.st_ino)
        if time.monotonic() > deadline:
            raise InUse(
                f"run.dir {run_dir}: its lock {path} is unreadable; if no job is using "
                f"{run_dir}, delete the lock and run again"
            )
        time.sleep(0.05)


def _valid(held: Any) -> bool:
    return (
        isinstance(held, dict)
        and isinstance(held.get("pid"), int)
        and isinstance(held.get("host"), str)
    )


def _refuse_if_held(run_dir: str, path: str, held: Holder) -> None:
    """Raises InUse unless the lock is stale (its process is gone from this host)."""
    pid, host, since = held["pid"], held["host"], held.get("time", "?")
    if not _same_host(held):
        where = host if host != socket.gethostname() else f"{host} (another container)"
        raise InUse(
            f"run.dir {run_dir} is held by pid {pid} on {where} since {since}; if that job is "
            f"gone, delete {path} and run again, else choose another run.dir"
        )
    if alive_here(held):
        raise InUse(
            f"run.dir {run_dir} is in use by another job (pid {pid} on this host, since "
            f"{since}); wait for it to end, or choose another run.dir"
        )


def _remove_lock(path: str, ident: tuple[int, int], run_dir: str) -> bool:
    """Removes the lock file `ident` (as read); False if the lock at `path` is another by now.

    The lock is first renamed aside, which only one process can do; if what was moved is not
    the file that was read (another job took the lock over in between), it is put back.
    """
    aside = f"{path}.tmp-{os.getpid()}"
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise _not_writable(run_dir, e) from None
    st = os.stat(aside)
    if (st.st_dev, st.st_ino) != ident:
        try:
            os.link(aside, path)  # fails if yet another job created a lock meanwhile
        except OSError:
            pass
        _remove_quietly(aside)
        return False
    _remove_quietly(aside)
    return True


def _remove_lock_if(run_dir: str, match: Callable[[Holder], bool]) -> bool:
    path = RunDir(run_dir).lock
    try:
        held, ident = _read_holder(path, run_dir)
    except RunDirError:  # unreadable: not ours to remove
        return False
    if held is None or not match(held):
        return False
    try:
        return _remove_lock(path, ident, run_dir)
    except RunDirError:
        return False


# --------------------------------------------------------------------------- processes


def _this_process() -> Holder:
    pid = os.getpid()
    return {
        "pid": pid,
        "host": socket.gethostname(),
        "start_time": _start_time(pid),
        # Containers that share the host's name (docker --network host) have pid spaces of
        # their own: a pid is only comparable within one.
        "pid_namespace": _pid_namespace(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _same_host(held: Holder) -> bool:
    ns = held.get("pid_namespace")
    return held["host"] == socket.gethostname() and (ns is None or ns == _pid_namespace())


def _same_holder(held: Holder, me: Holder) -> bool:
    keys = ("pid", "host", "start_time", "pid_namespace")
    return all(held.get(k) == me.get(k) for k in keys)


def _alive(pid: int, start_time: int | None) -> bool:
    """True if `pid` runs on this host and is the process that started at `start_time`."""
    if not os.path.exists("/proc/self/stat"):  # no procfs: the pid alone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    stat = _proc_stat(pid)
    if stat is None or stat[0] in "ZX":  # gone, or exited and not yet reaped
        return False
    return start_time is None or stat[1] == start_time


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks after boot) from /proc/<pid>/stat; None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses; start time is field 22.
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def _start_time(pid: int) -> int | None:
    stat = _proc_stat(pid)
    return stat[1] if stat else None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


# --------------------------------------------------------------------------- small helpers


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _reason(e: OSError) -> str:
    if e.errno == errno.ENOTDIR:
        return "a part of the path is a file"
    return e.strerror or str(e)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
