"""Atomic files: a reader sees the old file or the new one, whole, never a part of either.

Every writer that replaces a file others may read (summary.json, config.yaml, the models, the
checkpoints, evaluation.json, predictions, the listing cache, the TFRecord shards and their
indexes) writes it here: to a temporary name in the same folder, fsynced, renamed over the
target, and the folder fsynced, so that the rename itself survives a crash of the machine.

`atomic_write` gives a file object; `atomic_path` gives the temporary path, for writers that
need a path (Keras' `model.save` wants one ending in `.keras`, `tf.train.Checkpoint` writes a
folder, `TFRecordWriter` opens its own file). A writer that raises leaves the target as it
was and no temporary behind; a process killed mid-write leaves a temporary that
`is_leftover` recognises, for the cleanup of the next job (train/checkpoint.py
remove_strays, record/rundir.py).

Local paths only: a URL (gs://, s3://) goes through `tf.io.gfile`, which cannot fsync; its
writers say so where they branch. Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
from collections.abc import Iterator
from typing import IO, Any

# Names in a folder that are an atomic write's leftovers, as shell patterns: what a job killed
# mid-write (this version or an older one) may have left. Broad on purpose: run.dir's claim
# accepts them as a run's (record/rundir.py), and older versions wrote `summary.json.tmp`.
TEMPORARY_PATTERNS = ("*.tmp*", "*.old-*")
# Suffixes a temporary keeps at its end, for the writers that insist on one (Keras' model.save
# wants `.keras`): `model.tmp-<pid>.keras`.
KEPT_SUFFIXES = (".keras", ".weights.h5")  # Keras writes these by their suffix
# The leftovers the next job deletes, exactly: `<name>.tmp-<pid>[<kept suffix>]` and
# `<name>.old-<pid>` (a folder set aside for the moment of its replacement), or hidden,
# `.tmp-<name>-<pid>` and `.old-<name>-<pid>`.
_KEPT = "|".join(re.escape(s) for s in KEPT_SUFFIXES)
_LEFTOVER = re.compile(rf"^(.+\.(tmp|old)-\d+({_KEPT})?|\.(tmp|old)-.+-\d+)$")
# What fsync of a folder may answer on file systems that do not sync folders.
_NO_FOLDER_SYNC = (errno.EINVAL, errno.ENOTSUP, errno.EBADF)


@contextlib.contextmanager
def atomic_write(
    path: str, mode: str = "w", *, encoding: str | None = None, newline: str | None = None
) -> Iterator[IO[Any]]:
    """Opens a temporary file beside `path` for writing; when the block ends, it replaces
    `path` (see `atomic_path`). If the block raises, `path` is left as it was.

    Args:
        path: the file to write (local).
        mode: "w" (text) or "wb". Defaults to "w".
        encoding: the text's encoding. Defaults to None (the locale's).
        newline: as for `open` (the csv module wants ""). Defaults to None.

    Raises:
        OSError: the write, the fsync or the rename failed (the temporary is removed).
    """
    with atomic_path(path) as tmp, open(tmp, mode, encoding=encoding, newline=newline) as f:
        yield f


@contextlib.contextmanager
def atomic_path(path: str, *, hidden: bool = False) -> Iterator[str]:
    """Yields a temporary path beside `path` for a writer that needs a path; when the block
    ends, fsyncs what was written there (a file, or every file and folder of a folder), renames
    it over `path` and fsyncs the folder. If the block raises, the temporary is removed and
    `path` is left as it was.

    A folder replaces a folder: the old one is renamed aside (`<path>.old-<pid>`) for the moment
    between the two renames, then deleted.

    Args:
        path: the file or folder to write (local); its folder is created if needed. The
            temporary is `<path>.tmp-<pid>`, or `<stem>.tmp-<pid>.keras` for a `.keras` path
            (`KEPT_SUFFIXES`).
        hidden: name the temporary `.tmp-<name>-<pid>` (and the old folder set aside
            `.old-<name>-<pid>`), so that a listing by prefix (`checkpoints/ckpt-*`) never
            shows a partial one. Defaults to False.

    Raises:
        OSError: the fsync or the rename failed (the temporary is removed).
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = temporary_path(path, hidden)
    _remove(tmp)  # a leftover of an earlier process with this pid
    try:
        yield tmp
        _sync_tree(tmp)
        _replace(tmp, path, hidden)
        sync_folder(folder)
    finally:
        _remove(tmp)


def temporary_path(path: str, hidden: bool = False) -> str:
    """The temporary name `atomic_path` writes `path` under: `<path>.tmp-<pid>`, or
    `<stem>.tmp-<pid><suffix>` for a path ending in one of `KEPT_SUFFIXES`; `hidden`:
    `.tmp-<name>-<pid>` beside it. One writer of a path per process at a time."""
    return _beside(path, "tmp", hidden)


def _beside(path: str, kind: str, hidden: bool) -> str:
    """`path`'s temporary ("tmp") or set-aside ("old") name in its folder."""
    if hidden:
        folder, name = os.path.split(path)
        return os.path.join(folder, f".{kind}-{name}-{os.getpid()}")
    suffix = next((s for s in KEPT_SUFFIXES if path.endswith(s)), "")
    return f"{path.removesuffix(suffix)}.{kind}-{os.getpid()}{suffix}"


def cache_file(kind: str, name: str) -> str:
    """Where hvd_train keeps what it can compute again, one JSON file per `name` (a folder's
    path, an interpreter's): `$XDG_CACHE_HOME/hvd_train/<kind>/` (default `~/.cache`), the
    file named by a hash of `name`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    key = hashlib.sha1(name.encode()).hexdigest()[:20]
    return os.path.join(base, "hvd_train", kind, f"{key}.json")


def is_leftover(name: str) -> bool:
    """Whether the file or folder name `name` is an atomic write's leftover: a temporary of
    `atomic_path`, or a folder it set aside."""
    return bool(_LEFTOVER.match(name))


def sync_folder(path: str) -> None:
    """fsyncs the folder `path`: its entries (a rename, a new file) survive a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in _NO_FOLDER_SYNC:
            raise
    finally:
        os.close(fd)


def _sync_tree(path: str) -> None:
    """fsyncs the file `path`, or every file and folder under the folder `path`."""
    if not os.path.isdir(path):
        _sync_file(path)
        return
    for folder, _, names in os.walk(path, topdown=False):
        for name in names:
            _sync_file(os.path.join(folder, name))
        sync_folder(folder)


def _sync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace(tmp: str, path: str, hidden: bool) -> None:
    """Renames `tmp` over `path`; a folder over a folder by way of a name set aside."""
    if not (os.path.isdir(tmp) and os.path.isdir(path)):
        os.replace(tmp, path)
        return
    aside = _beside(path, "old", hidden)
    _remove(aside)
    os.replace(path, aside)
    os.replace(tmp, path)
    shutil.rmtree(aside, ignore_errors=True)


def _remove(path: str) -> None:
    """Removes the file or folder `path`, if there is one."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    with contextlib.suppress(OSError):  # cleaning up must not hide the error being raised
        os.remove(path)
