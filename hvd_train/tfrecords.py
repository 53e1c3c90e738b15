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
cap exactly as the source folder would (see `image_sources`).

Reading keeps global example indices: every worker reads all the records of a split into memory
once (the encoded bytes: a few KB per image, some 30 MB for 5,000 small JPEGs) and orders them
by `image/id`; the epoch's seeded permutation of those indices is then cut into global batches
exactly as for every other source, and only the indices a worker takes are decoded, by that
worker. So in every epoch each example goes to exactly one worker, every worker runs the same
number of full steps, and N workers at batch B see the global batches one worker sees at N x B,
whatever the number of files, and whether or not they divide by the workers. Streaming shards
by file (each worker reading only its own files) cannot keep those guarantees with a fresh
global shuffle every epoch and unequal files; its only gain, reading less, does not matter for
datasets whose encoded bytes fit in memory, which is the scale this trainer targets.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from hvd_train import images
from hvd_train.errors import DataError

CLASSES_FILE = "classes.txt"
SKIPPED_FILE = "skipped.txt"
SUFFIX = ".tfrecord"


def _features():
    import tensorflow as tf

    return {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
        "image/id": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
        "image/filename": tf.io.FixedLenFeature([], tf.string, default_value=""),
    }


# --------------------------------------------------------------------------- writing


def write_split(
    paths: Sequence[str],
    labels: Sequence[int],
    ids: Sequence[int],
    root: str,
    class_names: Sequence[str],
    dst: str,
    prefix: str,
    shards: int,
) -> list[str]:
    """Writes `shards` files `dst/{prefix}-0000i-of-0000N.tfrecord` in parallel, plus classes.txt.

    Example k goes to shard k mod N, so the shards differ by at most one record. Shows a
    progress bar on stderr. Returns the files written.
    """
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(dst, CLASSES_FILE), "w") as f:
        f.write("".join(f"{name}\n" for name in class_names))
    shards = max(1, min(shards, len(paths)))
    names = [os.path.join(dst, f"{prefix}-{i:05d}-of-{shards:05d}{SUFFIX}") for i in range(shards)]
    done = _Counter()

    def write(i: int) -> None:
        _write_shard(names[i], paths[i::shards], labels[i::shards], ids[i::shards], root, done)

    with ThreadPoolExecutor(min(shards, os.cpu_count() or 1)) as pool:
        futures = [pool.submit(write, i) for i in range(shards)]
        _progress(futures, done, len(paths), f"{prefix} -> {dst}")
        for fut in futures:
            fut.result()
    return names


def _write_shard(name, paths, labels, ids, root, done: _Counter) -> None:
    import tensorflow as tf

    def feature(value) -> tf.train.Feature:
        if isinstance(value, bytes):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))

    tmp = name + ".tmp"
    with tf.io.TFRecordWriter(tmp) as writer:
        for path, label, example_id in zip(paths, labels, ids, strict=True):
            with open(path, "rb") as f:
                data = f.read()
            kind = b"png" if data[:4] == b"\x89PNG" else b"jpeg"
            rel = os.path.relpath(path, root).encode()
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
            writer.write(example.SerializeToString())
            done.add(1)
    os.replace(tmp, name)  # a shard is either complete or absent


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


@dataclass(frozen=True)
class Records:
    """One split's records, in memory, ordered by `image/id`."""

    encoded: np.ndarray  # object array of bytes
    labels: np.ndarray  # int32
    names: tuple[str, ...]  # "FILE record #k (image/filename)", for messages
    class_names: tuple[str, ...]
    ids: np.ndarray  # int64, increasing: places in the source folder's listing
    left_out: tuple[tuple[int, int], ...] = ()  # (id, label) of files convert-tfrecord skipped


def read_folder(folder: str, key: str) -> Records:
    """Reads every `*.tfrecord` in `folder` into memory (see the module docstring for why).

    Raises:
        DataError: the folder is missing or has no records, a file is corrupt, or a record
            lacks `image/encoded` or `image/class/label`.
    """
    if not os.path.isdir(folder):
        raise DataError(f"{key}: folder {folder} does not exist")
    files = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(SUFFIX))
    if not files:
        raise DataError(
            f"{key}: folder {folder} has no {SUFFIX} files; write them with "
            "hvd-train convert-tfrecord SRC_IMAGE_FOLDER DST"
        )
    encoded, labels, ids, names = [], [], [], []
    for path in files:
        for k, (data, label, example_id, filename) in enumerate(_parse_file(path, key)):
            encoded.append(data)
            labels.append(label)
            ids.append(example_id if example_id >= 0 else len(ids))
            names.append(f"{path} record #{k}" + (f" ({filename.decode()})" if filename else ""))
    if not encoded:
        raise DataError(f"{key}: the {SUFFIX} files in {folder} hold no records")
    order = np.argsort(np.asarray(ids), kind="stable")
    classes = _class_names(folder, max(labels) + 1)
    labels_arr = np.asarray(labels, np.int32)[order]
    if labels_arr.min() < 0 or labels_arr.max() >= len(classes):
        raise DataError(
            f"{key}: {folder}: labels range {labels_arr.min()}..{labels_arr.max()}, but "
            f"{CLASSES_FILE} names {len(classes)} classes"
        )
    return Records(
        np.asarray(encoded, dtype=object)[order],
        labels_arr,
        tuple(names[i] for i in order),
        classes,
        np.asarray(ids, np.int64)[order],
        _left_out(folder, key),
    )


def _left_out(folder: str, key: str) -> tuple[tuple[int, int], ...]:
    """(id, label) of each line of `skipped.txt`, if convert-tfrecord wrote one."""
    path = os.path.join(folder, SKIPPED_FILE)
    if not os.path.exists(path):
        return ()
    with open(path, encoding="utf-8") as f:
        rows = [line.split("\t") for line in f if line.strip()]
    try:
        return tuple((int(r[0]), int(r[1])) for r in rows)
    except (ValueError, IndexError):
        raise DataError(
            f"{key}: {path}: expected lines of id<TAB>label<TAB>path<TAB>problem, as "
            "convert-tfrecord writes them"
        ) from None


def _parse_file(path: str, key: str):
    import tensorflow as tf

    ds = tf.data.TFRecordDataset(path).map(
        lambda r: tf.io.parse_single_example(r, _features()),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    try:
        for batch in ds.batch(1024).as_numpy_iterator():
            yield from zip(
                batch["image/encoded"],
                batch["image/class/label"],
                batch["image/id"],
                batch["image/filename"],
                strict=True,
            )
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
        reason = e.message.splitlines()[0] if e.message else type(e).__name__
        raise DataError(
            f"{key}: {path}: not a readable TFRecord file of images ({reason})"
        ) from None


def _class_names(folder: str, at_least: int) -> tuple[str, ...]:
    path = os.path.join(folder, CLASSES_FILE)
    if not os.path.exists(path):
        return tuple(str(i) for i in range(at_least))
    with open(path) as f:
        return tuple(line.strip() for line in f if line.strip())


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
    written = write_split(
        [paths[i] for i in keep], [labels[i] for i in keep], keep,
        folders.root, folders.class_names, out, name, shards,
    )  # fmt: skip
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
