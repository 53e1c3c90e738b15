"""TFRecord files of encoded images: the feature layout, the converter, and the reader.

Each record is a `tf.train.Example` with these features (the layout of TF-slim's and the
TensorFlow models' ImageNet records, plus an id):

| feature | type | meaning |
|---|---|---|
| `image/encoded` | bytes | the image file's bytes, JPEG or PNG, as they were (never re-encoded) |
| `image/class/label` | int64 | class index, 0-based, in the order of `classes.txt` |
| `image/id` | int64 | example id: its position in the source folder's sorted listing (optional) |
| `image/filename` | bytes | path relative to the source folder, for messages (optional) |
| `image/format` | bytes | `jpeg` or `png` (optional; not used to decode) |

A folder of records holds `*.tfrecord` files and `classes.txt` (one class name a line); when
`convert-tfrecord --on-corrupt skip` left unreadable files out, also `skipped.txt`, a line per
file: `id<TAB>label<TAB>path<TAB>problem`. Reading uses the ids and labels there to split and
cap exactly as the source folder would (see `sources`).

Reading keeps global example indices without holding the images: each file has an index beside
it, `FILE.tfrecord.idx` (DALI's tfrecord2idx format, `offset size` a record) and
`FILE.tfrecord.labels` (`label id checked` a record), written by convert-tfrecord, or built on
first use by one pass over the file and written beside it when the folder is writable. The
index gives each record a number (ordered by `image/id`); the epoch's seeded permutation of
those numbers is cut into global batches exactly as for every other source, and a worker reads
only the records its slice names (one positioned read each) and decodes them. So in every epoch
each example goes to exactly one worker, every worker runs the same number of full steps, and N
workers at batch B see the global batches one worker sees at N x B, whatever the number of
files, while a worker's memory holds about 30 bytes per record, not the records.
"""

from __future__ import annotations

import os
import struct
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from hvd_train.base.errors import DataError
from hvd_train.base.files import atomic_path, atomic_write
from hvd_train.data import images

CLASSES_FILE = "classes.txt"
SKIPPED_FILE = "skipped.txt"
SUFFIX = ".tfrecord"


def _features():
    return {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
        "image/id": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
        "image/filename": tf.io.FixedLenFeature([], tf.string, default_value=""),
    }


# --------------------------------------------------------------------------- writing


@dataclass(frozen=True)
class Examples:
    """The images of one split to write, in order: each one's file, class index and example id
    (its place in the source folder's sorted listing), and the folder `image/filename` is
    relative to."""

    paths: Sequence[str]
    labels: Sequence[int]
    ids: Sequence[int]
    root: str

    def shard(self, i: int, n: int) -> Examples:
        """Every n-th example from the i-th on: shard i of n."""
        return Examples(self.paths[i::n], self.labels[i::n], self.ids[i::n], self.root)


def write_split(
    examples: Examples, class_names: Sequence[str], dst: str, prefix: str, shards: int
) -> list[str]:
    """Writes `shards` files `dst/{prefix}-0000i-of-0000N.tfrecord` in parallel, plus classes.txt.

    Example k goes to shard k mod N, so the shards differ by at most one record. Shows a
    progress bar on stderr. Returns the files written.
    """
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(dst, CLASSES_FILE), "w") as f:
        f.write("".join(f"{name}\n" for name in class_names))
    total = len(examples.paths)
    shards = max(1, min(shards, total))
    names = [os.path.join(dst, f"{prefix}-{i:05d}-of-{shards:05d}{SUFFIX}") for i in range(shards)]
    done = _Counter()

    def write(i: int) -> None:
        _write_shard(names[i], examples.shard(i, shards), done)

    with ThreadPoolExecutor(min(shards, os.cpu_count() or 1)) as pool:
        futures = [pool.submit(write, i) for i in range(shards)]
        _progress(futures, done, total, f"{prefix} -> {dst}")
        for fut in futures:
            fut.result()
    return names


def _write_shard(name: str, examples: Examples, done: _Counter) -> None:
    def feature(value) -> tf.train.Feature:
        if isinstance(value, bytes):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))

    sizes = []
    # A shard is either complete or absent (convert writes a local folder: `dst` is made by
    # os.makedirs).
    with atomic_path(name) as tmp, tf.io.TFRecordWriter(tmp) as writer:
        for path, label, example_id in zip(
            examples.paths, examples.labels, examples.ids, strict=True
        ):
            with open(path, "rb") as f:
                data = f.read()
            kind = b"png" if data[:4] == b"\x89PNG" else b"jpeg"
            rel = os.path.relpath(path, examples.root).encode()
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "image/encoded": feature(data),
                        "image/class/label": feature(label),
                        "image/id": feature(example_id),
                        "image/filename": feature(rel),
                        "image/format": feature(kind),
                    }
                )
            )
            data = example.SerializeToString()
            writer.write(data)
            sizes.append(_HEADER + len(data) + 4)
            done.add(1)
    # Its index: every image was checked before writing (convert), so all are marked checked.
    sizes_arr = np.asarray(sizes, np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes_arr)[:-1]]).astype(np.int64)
    n = len(sizes)
    index = _FileIndex(
        offsets[:n], sizes_arr, np.asarray(examples.labels), np.asarray(examples.ids),
        np.ones(n, bool),
    )  # fmt: skip
    _write_index(name, index)


class _Counter:
    def __init__(self) -> None:
        self.value, self._lock = 0, threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.value += n


def _progress(futures, done: _Counter, total: int, label: str) -> None:
    """A one-line progress bar on stderr, redrawn until every future has finished."""
    width, shown = 30, -1
    while True:
        finished = all(f.done() for f in futures)
        n = done.value
        if n == shown and not finished:
            time.sleep(0.2)
            continue
        shown = n
        bar = "#" * (width * n // max(total, 1))
        sys.stderr.write(f"\r{label}: [{bar:<{width}}] {n}/{total}")
        sys.stderr.flush()
        if finished:
            sys.stderr.write("\n")
            return
        time.sleep(0.2)


# --------------------------------------------------------------------------- reading


INDEX_SUFFIX = ".idx"  # NAME.tfrecord.idx: "offset size" a record, as DALI's tfrecord2idx
LABELS_SUFFIX = ".labels"  # NAME.tfrecord.labels: "label id checked" a record (ours)
_HEADER = 12  # uint64 length, uint32 masked CRC of the length; then data, uint32 CRC of data


class _FileIndex(NamedTuple):
    """One file's index, a row per record in file order: what `FILE.idx` and `FILE.labels`
    hold."""

    offsets: np.ndarray  # int64: where the record's framing starts
    sizes: np.ndarray  # int64: framing + data
    labels: np.ndarray  # int64
    ids: np.ndarray  # int64: `image/id`, -1 where the record has none
    checked: np.ndarray  # bool: the image passed `images.image_problem` when indexed


@dataclass(frozen=True)
class Records:
    """One split's records, addressed by index (ordered by `image/id`): where each record is
    and its small fields, never the images. About 30 bytes per record."""

    files: tuple[str, ...]
    file_of: np.ndarray  # int32: which of `files`
    offsets: np.ndarray  # int64: where the record's framing starts
    sizes: np.ndarray  # int32: framing + data
    labels: np.ndarray  # int32
    checked: np.ndarray  # bool: the image passed `images.image_problem` when indexed
    class_names: tuple[str, ...]
    ids: np.ndarray  # int64, increasing: places in the source folder's listing
    left_out: tuple[tuple[int, int], ...] = ()  # (id, label) of files convert-tfrecord skipped

    def read(self, i: int) -> bytes:
        """Record i's serialized `tf.train.Example` (one positioned read of its file)."""
        path = self.files[self.file_of[i]]
        raw = _pread(path, int(self.offsets[i]), int(self.sizes[i]))
        if len(raw) != int(self.sizes[i]):
            raise DataError(
                f"{path}: record at byte {self.offsets[i]} is cut short ({len(raw)} of "
                f"{self.sizes[i]} bytes): the file is shorter than when it was indexed "
                "(truncated or rewritten while the job ran?)"
            )
        (length,) = struct.unpack("<Q", raw[:8])
        if length + _HEADER + 4 != len(raw):
            raise DataError(
                f"{path}: record at byte {self.offsets[i]} does not match its index "
                f"{path}{INDEX_SUFFIX} (the file was rewritten?); delete the index to rebuild it"
            )
        return raw[_HEADER : _HEADER + length]

    def encoded(self, i: int) -> bytes:
        """Record i's image bytes."""
        return _example(self.read(i)).features.feature["image/encoded"].bytes_list.value[0]

    def name(self, i: int) -> str:
        """`FILE record #k (image/filename)`, for messages."""
        path = self.files[self.file_of[i]]
        k = int(np.searchsorted(self._file_offsets(path, i), self.offsets[i]))
        filename = _example(self.read(i)).features.feature["image/filename"].bytes_list.value
        return f"{path} record #{k}" + (f" ({filename[0].decode()})" if filename else "")

    def _file_offsets(self, path: str, i: int) -> np.ndarray:
        return np.sort(self.offsets[self.file_of == self.file_of[i]])

    def problem(self, i: int) -> str | None:
        """Why record i's image cannot be decoded, or None (indexed images were checked)."""
        return None if self.checked[i] else images.image_problem(self.encoded(i))

    def fetch_fn(self):
        """A TensorFlow function: record indices (int64 `[k]`) -> their image bytes (`[k]`).

        One `numpy_function` call reads a whole batch of records (positioned reads, which
        release the GIL); parsing is one batched TensorFlow op. Per-record calls into Python
        cost more than the read itself on a busy CPU (docs/benchmarks.md).
        """
        feature = {"image/encoded": tf.io.FixedLenFeature([], tf.string)}
        read = images.per_batch(self.read)

        def fetch(idx):
            return tf.io.parse_example(read(idx), feature)["image/encoded"]

        return fetch


def join(a: Records, b: Records) -> Records:
    """One table of `a`'s records then `b`'s (record `len(a) + i` is `b`'s record i)."""
    return Records(
        a.files + b.files,
        np.concatenate([a.file_of, b.file_of + len(a.files)]).astype(np.int32),
        np.concatenate([a.offsets, b.offsets]),
        np.concatenate([a.sizes, b.sizes]),
        np.concatenate([a.labels, b.labels]),
        np.concatenate([a.checked, b.checked]),
        a.class_names,
        np.concatenate([a.ids, b.ids]),
    )


def _example(data: bytes):
    return tf.train.Example.FromString(data)


# path -> (descriptor, (mtime, size) when opened). A file replaced by rename is read on as it
# was (the descriptor holds the old file); one written in place is a DataError at its next read.
_handles: dict[str, tuple[int, tuple[int, int]]] = {}
_handles_lock = threading.Lock()
_remote = threading.local()


def close_files() -> None:
    """Closes the descriptors this process holds on local shards: the next read of each opens
    it anew (tests that rewrite shards)."""
    with _handles_lock:
        for fd, _ in _handles.values():
            os.close(fd)
        _handles.clear()


def _pread(path: str, offset: int, size: int) -> bytes:
    """`size` bytes at `offset`: os.pread on one shared descriptor for local files (thread
    safe, no seek), else a `tf.io.gfile.GFile` per thread and file (gs://, s3://).

    Raises:
        DataError: a local file was written since this process opened it (its records may no
            longer be where the index says, even where their sizes agree).
    """
    if "://" not in path:
        handle = _handles.get(path)
        if handle is None:
            with _handles_lock:
                handle = _handles.get(path)
                if handle is None:
                    fd = os.open(path, os.O_RDONLY)
                    handle = _handles[path] = (fd, _stamp(fd))
        fd, opened = handle
        data = os.pread(fd, size, offset)
        if _stamp(fd) != opened:
            raise DataError(
                f"{path} was written while the job read it (modified time or size changed): "
                "its records may no longer be where the index says; rewrite shards under a new "
                "name and rename them into place, or stop the job first"
            )
        return data
    files = _remote.__dict__.setdefault("files", {})
    if path not in files:
        files[path] = tf.io.gfile.GFile(path, "rb")
    f = files[path]
    f.seek(offset)
    return f.read(size)


def _stamp(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_mtime_ns, st.st_size


def record_files(folder: str, key: str) -> list[str]:
    """The folder's `*.tfrecord` files, sorted (through tf.io.gfile: local or gs://, s3://).

    Raises:
        DataError: the folder is missing or has no records.
    """
    if not tf.io.gfile.isdir(folder):
        raise DataError(f"{key}: folder {folder} does not exist")
    files = sorted(
        _join(folder, f) for f in tf.io.gfile.listdir(folder) if f.rstrip("/").endswith(SUFFIX)
    )
    if not files:
        raise DataError(
            f"{key}: folder {folder} has no {SUFFIX} files; write them with "
            "hvd-train convert-tfrecord SRC_IMAGE_FOLDER DST"
        )
    return files


def _join(folder: str, name: str) -> str:
    return folder.rstrip("/") + "/" + name if "://" in folder else os.path.join(folder, name)


def read_folder(folder: str, key: str) -> Records:
    """The index of every `*.tfrecord` in `folder`: offsets, labels and ids, no images.

    Each file's index is read from `FILE.idx` and `FILE.labels` beside it (written by
    convert-tfrecord); a file without them, or whose index does not end at its size, is read
    once to build them (and its images checked), and they are written beside it when the
    folder is writable. Call it on one rank and share the result (`distributed.chief_computes`).

    Raises:
        DataError: the folder is missing or has no records, a file is corrupt, or a record
            lacks `image/encoded` or `image/class/label`.
    """
    files = record_files(folder, key)
    parts = [_file_index(path, key) for path in files]
    offsets, sizes, labels, ids, checked = (
        np.concatenate(column) for column in zip(*parts, strict=True)
    )
    if not len(offsets):
        raise DataError(f"{key}: the {SUFFIX} files in {folder} hold no records")
    file_of = np.concatenate([np.full(len(p.offsets), k, np.int32) for k, p in enumerate(parts)])
    ids = np.where(ids >= 0, ids, np.arange(len(ids)))  # records without image/id: file order
    order = np.argsort(ids, kind="stable")
    labels = labels[order].astype(np.int32)
    classes = _class_names(folder, int(labels.max()) + 1)
    if labels.min() < 0 or labels.max() >= len(classes):
        raise DataError(
            f"{key}: {folder}: labels range {labels.min()}..{labels.max()}, but "
            f"{CLASSES_FILE} names {len(classes)} classes"
        )
    return Records(
        tuple(files), file_of[order], offsets[order], sizes[order].astype(np.int32), labels,
        checked[order], classes, ids[order].astype(np.int64), _left_out(folder, key),
    )  # fmt: skip


def _file_index(path: str, key: str) -> _FileIndex:
    """One file's index, from `FILE.idx` and `FILE.labels` or by reading the file."""
    found = _load_index(path, tf.io.gfile.stat(path).length)
    if found is not None:
        return found
    built = _build_index(path, key)
    try:
        _write_index(path, built)
    except (OSError, tf.errors.OpError):  # a read-only folder: rebuilt at every start
        pass
    return built


def _load_index(path: str, file_size: int) -> _FileIndex | None:
    """The index beside `path`, or None when missing or not ending at `file_size` (stale)."""
    try:
        with tf.io.gfile.GFile(path + INDEX_SUFFIX, "rb") as f:
            idx = np.array(f.read().split(), np.int64).reshape(-1, 2)
        with tf.io.gfile.GFile(path + LABELS_SUFFIX, "rb") as f:
            meta = np.array(f.read().split(), np.int64).reshape(-1, 3)
    except (tf.errors.NotFoundError, ValueError):
        return None
    end = int(idx[-1, 0] + idx[-1, 1]) if len(idx) else 0
    if end != file_size or len(idx) != len(meta):
        return None
    return _FileIndex(idx[:, 0], idx[:, 1], meta[:, 0], meta[:, 1], meta[:, 2].astype(bool))


def _write_index(path: str, index: _FileIndex) -> None:
    """Writes `path.idx` and `path.labels`, each atomically (a temporary file, then a rename;
    the temporary's name holds the pid: workers may index at once)."""
    for suffix, rows in (
        (INDEX_SUFFIX, zip(index.offsets, index.sizes, strict=True)),
        (LABELS_SUFFIX, zip(index.labels, index.ids, index.checked.astype(int), strict=True)),
    ):
        text = "".join(" ".join(str(int(v)) for v in row) + "\n" for row in rows)
        if images.is_url(path):
            _write_url(path + suffix, text)
        else:
            with atomic_write(path + suffix) as f:
                f.write(text)


def _write_url(url: str, text: str) -> None:
    """Writes `text` to a URL (gs://, s3://) through tf.io.gfile: a temporary object, then a
    rename. Not atomic_write: an object store has no fsync, and its rename may be a copy."""
    tmp = f"{url}.tmp-{os.getpid()}"
    with tf.io.gfile.GFile(tmp, "w") as f:
        f.write(text)
    tf.io.gfile.rename(tmp, url, overwrite=True)


def _build_index(path: str, key: str) -> _FileIndex:
    """Reads `path` once, a record at a time, keeping offsets, labels and ids; checks images."""
    offsets, sizes, labels, ids, checked, pending = [], [], [], [], [], []
    with ThreadPoolExecutor(images.CHECK_THREADS) as pool, tf.io.gfile.GFile(path, "rb") as f:
        offset = 0
        while True:
            header = f.read(_HEADER)
            if not header:
                break
            (length,) = struct.unpack("<Q", header[:8]) if len(header) == _HEADER else (-1,)
            data = f.read(length + 4) if length >= 0 else b""
            if len(data) != length + 4:
                raise DataError(
                    f"{key}: {path}: not a readable TFRecord file of images (truncated record "
                    f"at byte {offset})"
                )
            label, example_id, encoded = _small_fields(data[:length], path, offset, key)
            offsets.append(offset)
            sizes.append(_HEADER + length + 4)
            labels.append(label)
            ids.append(example_id)
            pending.append(pool.submit(images.image_problem, encoded))
            offset += _HEADER + length + 4
            if len(pending) >= 256:  # bounded: a window of images in memory at a time
                checked += [p.result() is None for p in pending]
                pending = []
        checked += [p.result() is None for p in pending]
    return _FileIndex(
        np.asarray(offsets, np.int64), np.asarray(sizes, np.int64), np.asarray(labels, np.int64),
        np.asarray(ids, np.int64), np.asarray(checked, bool),
    )  # fmt: skip


def _small_fields(data: bytes, path: str, offset: int, key: str) -> tuple[int, int, bytes]:
    try:
        feature = _example(data).features.feature
    except Exception:  # protobuf's DecodeError
        raise DataError(
            f"{key}: {path}: not a readable TFRecord file of images (record at byte {offset} "
            "is not a tf.train.Example)"
        ) from None
    if (
        not feature["image/encoded"].bytes_list.value
        or not feature["image/class/label"].int64_list.value
    ):
        raise DataError(
            f"{key}: {path}: record at byte {offset} lacks image/encoded or image/class/label "
            "(layout: docs/data.md)"
        )
    example_id = feature["image/id"].int64_list.value
    return (
        int(feature["image/class/label"].int64_list.value[0]),
        int(example_id[0]) if example_id else -1,
        feature["image/encoded"].bytes_list.value[0],
    )


def _left_out(folder: str, key: str) -> tuple[tuple[int, int], ...]:
    """(id, label) of each line of `skipped.txt`, if convert-tfrecord wrote one."""
    path = _join(folder, SKIPPED_FILE)
    if not tf.io.gfile.exists(path):
        return ()
    with tf.io.gfile.GFile(path, "r") as f:
        rows = [line.split("\t") for line in f.read().splitlines() if line.strip()]
    try:
        return tuple((int(r[0]), int(r[1])) for r in rows)
    except (ValueError, IndexError):
        raise DataError(
            f"{key}: {path}: expected lines of id<TAB>label<TAB>path<TAB>problem, as "
            "convert-tfrecord writes them"
        ) from None


def _class_names(folder: str, at_least: int) -> tuple[str, ...]:
    path = _join(folder, CLASSES_FILE)
    if not tf.io.gfile.exists(path):
        return tuple(str(i) for i in range(at_least))
    with tf.io.gfile.GFile(path, "r") as f:
        return tuple(line.strip() for line in f.read().splitlines() if line.strip())


# --------------------------------------------------------------------------- converting


def convert(src: str, dst: str, shards: int, val_dir: str = "", on_corrupt: str = "error") -> None:
    """`hvd-train convert-tfrecord`: checks every image, then writes DST/train (and DST/val).

    Example ids are positions in the folder's sorted listing, and the files left out with
    `on_corrupt: skip` are listed (with their ids) in `skipped.txt`, so `data.validation_fraction`
    holds out the same images from DST/train as from SRC itself.
    """
    splits = [("train", src, "SRC_IMAGE_FOLDER")]
    if val_dir:
        splits.append(("val", val_dir, "--val-dir"))
    listed = [(name, images.list_class_folders(folder, key), key) for name, folder, key in splits]
    if val_dir and listed[0][1].class_names != listed[1][1].class_names:
        raise DataError(f"--val-dir: {val_dir} has other class sub-folders than {src}")
    checked = [
        (name, folders, key, images.choose_checked([_paths(folders)], None, images.file_problem))
        for name, folders, key in listed
    ]
    bad = [(key, p, why) for _, _, key, chosen in checked for p, why in chosen.bad]
    if bad and on_corrupt == "error":  # every unreadable file of both splits, in one error
        raise images.corrupt_error(bad, "use --on-corrupt skip")
    for name, folders, _, chosen in checked:
        _convert_split(folders, chosen, os.path.join(dst, name), name, shards)
    val_line = f", val_dir: {os.path.join(dst, 'val')}" if val_dir else ""
    print(f"use: data: {{source: tfrecord, train_dir: {os.path.join(dst, 'train')}{val_line}}}")


def _paths(folders: images.ClassFolders) -> list[str]:
    return [p for files in folders.files for p in files]


def _convert_split(folders: images.ClassFolders, chosen, out: str, name: str, shards: int):
    """Writes one split's good images to `out`, the skipped ones to `out/skipped.txt`."""
    paths = _paths(folders)
    labels = [c for c, files in enumerate(folders.files) for _ in files]
    good = set(chosen.per_class[0])
    keep = [i for i, p in enumerate(paths) if p in good]  # ids: places in the full listing
    examples = Examples([paths[i] for i in keep], [labels[i] for i in keep], keep, folders.root)
    written = write_split(examples, folders.class_names, out, name, shards)
    skipped = _write_skipped(out, folders.root, paths, labels, chosen.bad)
    print(
        f"{name}: {len(keep)} images of {len(folders.class_names)} classes in "
        f"{len(written)} files{skipped}",
        flush=True,
    )


def _write_skipped(out: str, root: str, paths, labels, bad) -> str:
    """Writes `skipped.txt` (or removes a stale one); returns the note that names the files."""
    path = os.path.join(out, SKIPPED_FILE)
    if not bad:
        if os.path.exists(path):
            os.remove(path)
        return ""
    where = {p: i for i, p in enumerate(paths)}
    with open(path, "w", encoding="utf-8") as f:
        for p, why in bad:
            f.write(f"{where[p]}\t{labels[where[p]]}\t{os.path.relpath(p, root)}\t{why}\n")
    lines = [f"\n  {p}: {why}" for p, why in bad[: images.SHOWN_BAD]]
    if len(bad) > images.SHOWN_BAD:
        lines.append(f"\n  ... and {len(bad) - images.SHOWN_BAD} more")
    return f", {len(bad)} corrupt files skipped (listed in {path}):" + "".join(lines)
