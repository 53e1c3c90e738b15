"""Image files: listing a folder of class sub-folders, the seeded split and class-balanced caps,
the up-front check of every chosen file, and decoding to a fixed size and channel count.

Listing and checking happen once, before training (on rank 0, shared by broadcast: see
`sources.load_source`), so every worker trains on the same list of files known to be readable. A
corrupt file is found there, never mid-epoch on one rank, where it would kill that rank while
the others wait for it in an all-reduce; every chosen file is checked before the run stops, so
one error names all the unreadable ones.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import tensorflow as tf

from hvd_train.base.errors import DataError
from hvd_train.base.files import atomic_write, cache_file

T = TypeVar("T")

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
CHECK_THREADS = 8  # file reads and PIL's checks release the GIL


# --------------------------------------------------------------------------- listing


@dataclass(frozen=True)
class ClassFolders:
    """The image files of a folder with one sub-folder per class, sorted."""

    root: str
    class_names: tuple[str, ...]
    files: tuple[tuple[str, ...], ...]  # per class, full paths, sorted
    ignored: int  # files without an image extension (as Keras' image_dataset_from_directory)


def list_class_folders(root: str, key: str) -> ClassFolders:
    """Lists `root/<class>/**/*.{jpg,jpeg,png}` (case-insensitive), classes in sorted order.

    No file is opened. A local folder's listing is kept (`listing_cache_path`) and used again
    while no folder under `root` has changed (same modification times), so millions of files
    are not listed again at every start. Folders given as URLs (`gs://`, `s3://`) are listed
    through `tf.io.gfile` every time.

    Raises:
        DataError: the folder is missing, has no class sub-folders, or a class has no images.
    """
    cached = _cached_listing(root)
    if cached is not None:
        return cached
    if not _gfile().exists(root):
        raise DataError(f"{key}: folder {root} does not exist")
    if not _gfile().isdir(root):
        raise DataError(f"{key}: {root} is a file; expected a folder with one sub-folder per class")
    classes = sorted(
        name.rstrip("/")
        for name in _gfile().listdir(root)
        if not name.startswith(".") and _gfile().isdir(_join(root, name))
    )
    if not classes:
        raise DataError(
            f"{key}: folder {root} has no class sub-folders; expected one sub-folder of "
            ".jpg/.jpeg/.png images per class"
        )
    files, ignored = [], 0
    for name in classes:
        found, skipped = images_under(_join(root, name))
        if not found:
            raise DataError(
                f"{key}: class folder {_join(root, name)} has no .jpg, .jpeg or .png "
                "images; add some or remove the folder"
            )
        files.append(tuple(found))
        ignored += skipped
    listing = ClassFolders(root, tuple(classes), tuple(files), ignored)
    _save_listing(listing)
    return listing


def images_under(folder: str) -> tuple[list[str], int]:
    """Every .jpg/.jpeg/.png under `folder`, recursively (hidden folders left out), sorted,
    and how many other files it holds."""
    found, ignored = [], 0
    # os.walk reads a local folder without a stat per file, as tf.io.gfile.walk does not.
    walk = os.walk if not is_url(folder) else _gfile().walk
    for dirpath, dirnames, filenames in walk(folder):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for f in filenames:
            if f.lower().endswith(IMAGE_EXTENSIONS):
                found.append(_join(dirpath, f))
            elif not f.startswith("."):
                ignored += 1
    return sorted(found), ignored


def is_url(path: str) -> bool:
    """A path for one of TensorFlow's file systems (gs://, s3://, ...) rather than a local one."""
    return "://" in path


def _join(folder: str, name: str) -> str:
    return folder.rstrip("/") + "/" + name if is_url(folder) else os.path.join(folder, name)


def _gfile():
    return tf.io.gfile


_LISTING_VERSION = 1


def listing_cache_path(root: str) -> str:
    """Where the listing of the local folder `root` is kept: `$XDG_CACHE_HOME/hvd_train`
    (default `~/.cache/hvd_train`), one file per folder (named by a hash of its path), so the
    data folder itself is never written to."""
    return cache_file("listings", os.path.abspath(root))


def _folder_times(root: str) -> dict[str, int]:
    """Modification time (ns) of `root` and of every folder under it: adding, removing or
    renaming a file or folder changes its parent folder's time."""
    times = {}
    for dirpath, dirnames, _ in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        times[os.path.relpath(dirpath, root)] = os.stat(dirpath).st_mtime_ns
    return times


def _cached_listing(root: str) -> ClassFolders | None:
    """The listing saved by `_save_listing`, if every folder's time still matches."""
    if is_url(root):
        return None
    try:
        with open(listing_cache_path(root), encoding="utf-8") as f:
            saved = json.load(f)
        if saved.get("version") != _LISTING_VERSION or saved["root"] != os.path.abspath(root):
            return None
        for rel, mtime in saved["times"].items():
            if os.stat(os.path.join(root, rel)).st_mtime_ns != mtime:
                return None
    except (OSError, ValueError, KeyError):
        return None
    files = tuple(
        tuple(os.path.join(root, name, rel) for rel in names)
        for name, names in zip(saved["classes"], saved["files"], strict=True)
    )
    return ClassFolders(root, tuple(saved["classes"]), files, saved["ignored"])


def _save_listing(listing: ClassFolders) -> None:
    """Saves the listing (atomically); where the cache cannot be written, it goes without."""
    root = listing.root
    if is_url(root):
        return
    path = listing_cache_path(root)
    try:
        saved = {
            "version": _LISTING_VERSION,
            "root": os.path.abspath(root),
            "times": _folder_times(root),
            "classes": list(listing.class_names),
            "files": [
                [os.path.relpath(p, os.path.join(root, name)) for p in files]
                for name, files in zip(listing.class_names, listing.files, strict=True)
            ],
            "ignored": listing.ignored,
        }
        with atomic_write(path, encoding="utf-8") as f:
            json.dump(saved, f)
    except OSError:
        pass


# --------------------------------------------------------------------------- split and caps


def seeded_order(n: int, seed: int, class_index: int) -> np.ndarray:
    """A permutation of one class's examples that depends only on the seed and the class."""
    return np.random.default_rng([seed, class_index]).permutation(n)


def split_by_fraction(
    per_class: Sequence[Sequence[T]], fraction: float, seed: int, key: str, names: Sequence[str]
) -> tuple[list[list[T]], list[list[T]]]:
    """Holds out `round(fraction x n)` of each class, chosen by seed: (train, val) per class.

    Both come back in their seeded order, so a cap taken from the front is a seeded sample.
    """
    train, val = [], []
    for c, items in enumerate(per_class):
        order = [items[i] for i in seeded_order(len(items), seed, c)]
        n_val = int(round(len(items) * fraction))
        if n_val >= len(items):
            raise DataError(
                f"{key}: class {names[c]} has {len(items)} images, none left for training after "
                f"holding out data.validation_fraction={fraction}; add images or lower it"
            )
        val.append(order[:n_val])
        train.append(order[n_val:])
    return train, val


def shuffled(per_class: Sequence[Sequence[T]], seed: int) -> list[list[T]]:
    """Each class in its seeded order (so that a cap takes a seeded sample)."""
    return [
        [items[i] for i in seeded_order(len(items), seed, c)] for c, items in enumerate(per_class)
    ]


@dataclass(frozen=True)
class Chosen:
    """The examples of one split that passed the check, per class, and those that did not."""

    per_class: list[list]
    bad: list[tuple[object, str]]  # (item, problem)
    short: list[tuple[int, int]]  # (class index, count) of classes below the cap


def choose_checked(
    per_class: Sequence[Sequence[T | None]],
    cap: int | None,
    problem: Callable[[T], str | None],
) -> Chosen:
    """Takes up to `cap` good examples from the front of each class, checking each in parallel.

    A bad example is counted in `bad` and the class's next example takes its place, so the
    caps stay balanced where the class has enough good images; the caller decides whether bad
    examples end the run (`data.on_corrupt`). A None item stands for an example left out
    before (a file `convert-tfrecord --on-corrupt skip` did not write): it is passed over.
    """
    per_class = [[x for x in items if x is not None] for items in per_class]
    limit = [len(items) if cap is None else min(cap, len(items)) for items in per_class]
    chosen: list[list[T]] = [[] for _ in per_class]
    bad: list[tuple[T, str]] = []
    pos = [0] * len(per_class)
    with ThreadPoolExecutor(CHECK_THREADS) as pool:
        while True:
            batch = []
            for c, items in enumerate(per_class):
                take = items[pos[c] : pos[c] + limit[c] - len(chosen[c])]
                batch += [(c, x) for x in take]
                pos[c] += len(take)
            if not batch:
                break
            for (c, x), why in zip(batch, _checked(pool, problem, batch), strict=True):
                if why is None:
                    chosen[c].append(x)
                else:  # the class's next example takes its place in the next round
                    bad.append((x, why))
    short = [(c, len(ch)) for c, ch in enumerate(chosen) if cap is not None and len(ch) < cap]
    return Chosen(chosen, bad, short)


def _checked(pool: ThreadPoolExecutor, problem: Callable, batch: list) -> Iterator:
    """`problem` of each (class, item) in order, a chunk of futures at a time: `pool.map` over
    a million items would hold a million futures (a kilobyte each) at once."""
    for start in range(0, len(batch), _CHECK_CHUNK):
        yield from pool.map(lambda cx: problem(cx[1]), batch[start : start + _CHECK_CHUNK])


_CHECK_CHUNK = 4096


def require_each_class(chosen: Chosen, had: Sequence[int], names: Sequence[str], key: str) -> None:
    """Raises DataError when a class that had examples (`had`, per class) kept none."""
    for c, ch in enumerate(chosen.per_class):
        if had[c] and not ch:
            raise DataError(
                f"{key}: class {names[c]} has no readable images left after skipping corrupt files"
            )


SHOWN_BAD = 20  # unreadable files named in the error; the rest are counted


def corrupt_error(bad: Sequence[tuple[str, str, str]], skip_hint: str) -> DataError:
    """The error naming every unreadable file, (key, name, problem), up to SHOWN_BAD of them.

    One file: one line. More: a first line with the count and the fix, then a file a line.
    """
    if len(bad) == 1:
        key, name, why = bad[0]
        return DataError(f"{key}: {name}: {why}; remove it, or {skip_hint}")
    keys = ", ".join(dict.fromkeys(key for key, _, _ in bad))
    lines = [f"  {name}: {why}" for _, name, why in bad[:SHOWN_BAD]]
    if len(bad) > SHOWN_BAD:
        lines.append(f"  ... and {len(bad) - SHOWN_BAD} more")
    return DataError(
        f"{keys}: {len(bad)} files are not readable images; remove them, or {skip_hint}:\n"
        + "\n".join(lines)
    )


# --------------------------------------------------------------------------- checking files


def image_problem(data: bytes) -> str | None:
    """Why `data` is not an image we can decode, or None. Cheap: PIL reads the header and the
    file's structure (`Image.verify`, which checks PNG chunk CRCs), without decoding pixels;
    a JPEG must also end with its end-of-image marker (a truncated JPEG fails TF's decoder)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            kind = im.format
            im.verify()
    except UnidentifiedImageError:
        return "not a JPEG or PNG image"
    except Exception as e:  # PIL raises many kinds (SyntaxError, OSError, struct.error) here
        return f"corrupt image ({type(e).__name__}: {e})"
    if kind not in ("JPEG", "PNG"):
        return f"a {kind} image; expected JPEG or PNG"
    if kind == "JPEG" and b"\xff\xd9" not in data[-64:]:
        return "truncated JPEG (no end-of-image marker)"
    return None


def file_problem(path: str) -> str | None:
    """`image_problem` of the file at `path`, or why it cannot be read."""
    try:
        if is_url(path):
            with _gfile().GFile(path, "rb") as f:
                data = f.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    except Exception as e:  # tf.errors.OpError from a remote file system
        return f"cannot be read ({type(e).__name__})"
    if not data:
        return "empty file"
    return image_problem(data)


def file_problems(paths: Sequence[str]) -> list[str | None]:
    """`file_problem` of each path, checked in parallel, in the order of `paths`."""
    with ThreadPoolExecutor(CHECK_THREADS) as pool:
        return list(pool.map(file_problem, paths))


# --------------------------------------------------------------------------- decoding


_read_failures: list[BaseException] = []


def read_failure() -> BaseException | None:
    """The first error a `per_batch` read raised in this process (a file changed or gone
    under the job), which reached the training loop as a TensorFlow UnknownError."""
    return _read_failures[0] if _read_failures else None


def per_batch(get: Callable[[int], bytes]):
    """A TensorFlow function: indices (int64 `[k]`) -> `get` of each (string `[k]`), in one
    `numpy_function` call: reading is Python, and a call per example costs more than the read."""

    def get_many(idx: np.ndarray) -> np.ndarray:
        try:
            return np.array([get(i) for i in idx], dtype=object).reshape(len(idx))
        except Exception as e:
            _read_failures.append(e)  # TensorFlow reports it as an UnknownError
            raise

    def fetch(idx):
        return tf.ensure_shape(tf.numpy_function(get_many, [idx], tf.string, False), idx.shape)

    return fetch


def decode_image(contents, size: Sequence[int], channels: int):
    """Encoded JPEG/PNG bytes -> uint8 `[height, width, channels]` (a TensorFlow function).

    Grey, grey+alpha, palette and RGBA images are converted to `channels` (alpha dropped);
    16-bit PNGs are scaled to 8 bits. Images of another size are resized with antialiasing and
    rounded back to uint8, so decoded images cost a quarter of float32 in a cache or a queue.
    """
    img = tf.io.decode_image(contents, channels=channels, expand_animations=False)
    same = tf.reduce_all(tf.equal(tf.shape(img)[:2], tf.constant(list(size), tf.int32)))

    def resize():
        out = tf.image.resize(img, list(size), antialias=True)
        return tf.cast(tf.clip_by_value(tf.round(out), 0.0, 255.0), tf.uint8)

    img = tf.cond(same, lambda: img, resize)
    return tf.ensure_shape(img, [*size, channels])
