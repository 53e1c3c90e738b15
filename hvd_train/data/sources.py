"""Data sources: what an epoch is drawn from, addressed by example index.

`synthetic` and `digits` are made in memory. The image sources, `image_folder` and `tfrecord`,
hold a compact reference per example, never the images: a path for an image file, a record
number for a TFRecord (its file, byte offset and size are in `tfrecords.Records`); `fetch` turns
a batch of references into strings (paths, or a record's image bytes) in one call, and `decode`
turns one string into an image. `data.cache: memory` decodes them all once.

Both image sources go the same way: list the examples per class; hold out validation (a folder
of its own, or `data.validation_fraction` of each class, by seed); take the class-balanced caps;
check every chosen image; then hand the data pipeline (`pipeline.py`) the references. The listing
and the check run on rank 0 and are broadcast, so all workers train on the same list and no
corrupt file is met mid-epoch. The pipeline imports this module, never the reverse.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import tensorflow as tf

from hvd_train.base.errors import DataError
from hvd_train.config import Config, DataConfig
from hvd_train.data import digits, images


@dataclass(frozen=True)
class Source:
    """A dataset addressed by example index (labels int32).

    In-memory sources hold the inputs in `x_train`/`x_val` (float32, or uint8 images) and no
    `decode`. Image sources hold one reference per example there and `decode`, which turns one
    string into a uint8 image of `image_shape`. The strings are the references themselves (file
    paths) or, with `fetch`, what it returns for a batch of references (int64 `[k]` -> string
    `[k]`, one call per batch: reading is Python, and a call per example costs more than the
    read). `decoded_batches` puts the two together.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    num_classes: int
    decode: Callable | None = None
    fetch: Callable | None = None
    image_shape: tuple[int, ...] = ()
    skipped_files: tuple[str, ...] = ()  # corrupt files left out (data.on_corrupt: skip)
    description: str = ""  # one line for the log: where the data came from
    # data.read: stream: the file of each training example (None: each example is a file)
    groups: np.ndarray | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.image_shape if self.decode else tuple(self.x_train.shape[1:])

    @property
    def num_train(self) -> int:
        return len(self.x_train)

    def decoded_batches(self, ds: tf.data.Dataset, batch: int) -> tf.data.Dataset:
        """`ds` of `(reference, *rest)` -> batches of `(uint8 image, *rest)`, in order: the
        references fetched a batch at a time, the images decoded one by one in parallel."""
        if self.fetch is not None:
            ds = ds.batch(batch).map(lambda r, *rest: (self.fetch(r), *rest), tf.data.AUTOTUNE)
            ds = ds.unbatch()
        ds = ds.map(lambda s, *rest: (self.decode(s), *rest), tf.data.AUTOTUNE)
        return ds.batch(batch)


def load_source(cfg: Config) -> Source:
    """Builds the configured source; identical on every rank (it depends only on the config)."""
    if cfg.data.source == "synthetic":
        return _synthetic(cfg)
    if cfg.data.source == "digits":
        return _digits(cfg)
    if cfg.data.source in ("image_folder", "tfrecord"):
        source = load_image_source(cfg)
        return cache_in_memory(source) if cfg.data.cache == "memory" else source
    raise DataError(f"data.source: unknown source {cfg.data.source!r}")  # config rejects first


def _synthetic(cfg: Config) -> Source:
    """Random inputs with labels a fixed random linear map can learn, made once in memory."""
    d = cfg.data
    rng = np.random.default_rng(cfg.runtime.seed)
    shape = tuple(d.image_size) + ((d.channels,) if len(d.image_size) == 2 else ())
    n = d.train_examples + d.val_examples
    x = rng.random((n, *shape), dtype=np.float32)
    # Labels from a random projection of the centred inputs: learnable, so loss can fall.
    proj = rng.standard_normal((int(np.prod(shape)), d.num_classes)).astype(np.float32)
    y = np.argmax((x.reshape(n, -1) - 0.5) @ proj, axis=1).astype(np.int32)
    t = d.train_examples
    return Source(x[:t], y[:t], x[t:], y[t:], d.num_classes)


def _digits(cfg: Config) -> Source:
    """The 1,797 8x8 handwritten digits shipped with hvd_train (data/digits.py), split by seed."""
    pixels, target = digits.load()
    x = (pixels.astype(np.float32) / 16.0)[..., None]
    y = target.astype(np.int32)
    order = np.random.default_rng(cfg.runtime.seed).permutation(len(x))
    n_val = int(round(len(x) * cfg.data.validation_fraction))
    val, train = order[:n_val], order[n_val:]
    return Source(x[train], y[train], x[val], y[val], 10)


def cache_in_memory(source: Source) -> Source:
    """`data.cache: memory`: every image decoded once, now, and kept as uint8 arrays.

    The whole training set is kept on every worker, because each epoch's permutation gives a
    worker different examples (5,000 images at 64x64x3 take 61 MB).
    """
    x_train, x_val = _decode_all(source.x_train, source), _decode_all(source.x_val, source)
    size = (x_train.nbytes + x_val.nbytes) / 2**20
    note = f"; data.cache: memory, {size:.0f} MB of decoded images on every worker"
    return replace(
        source, x_train=x_train, x_val=x_val, decode=None, description=source.description + note
    )


def _decode_all(strings: np.ndarray, source: Source) -> np.ndarray:
    out = np.zeros((len(strings), *source.image_shape), np.uint8)
    if len(strings):
        ds = source.decoded_batches(tf.data.Dataset.from_tensor_slices((strings,)), 512)
        start = 0
        for (batch,) in ds.as_numpy_iterator():
            out[start : start + len(batch)] = batch
            start += len(batch)
    return out


# --------------------------------------------------------------------------- image sources


@dataclass(frozen=True)
class Selection:
    """The examples chosen for each split (as items of the source's listing) and what was left."""

    train: list  # (item, label) in a fixed order
    val: list
    class_names: tuple[str, ...]
    skipped: list[tuple[str, str]]  # (name, problem)
    notes: list[str]


def load_image_source(cfg: Config) -> Source:
    """The configured image source; identical on every rank (rank 0 lists and checks)."""
    from hvd_train.runtime import distributed  # Horovod only for image sources, not for digits

    d = cfg.data
    size, channels = tuple(d.image_size), d.channels
    if d.source == "image_folder":
        chosen = distributed.chief_computes(lambda: _chosen_files(cfg), name="image_selection")
        fetch = chosen.refs.fetch_fn()

        def decode(path):
            return images.decode_image(tf.io.read_file(path), size, channels)

    else:
        chosen = distributed.chief_computes(lambda: _chosen_records(cfg), name="record_selection")
        fetch = chosen.refs.fetch_fn()

        def decode(encoded):
            return images.decode_image(encoded, size, channels)

    return Source(
        x_train=chosen.x_train,
        y_train=chosen.y_train,
        x_val=chosen.x_val,
        y_val=chosen.y_val,
        num_classes=chosen.num_classes,
        decode=decode,
        fetch=fetch,
        image_shape=(*size, channels),
        skipped_files=chosen.skipped,
        description=chosen.description,
        groups=chosen.refs.file_of[chosen.x_train] if d.source == "tfrecord" else None,
    )


@dataclass(frozen=True)
class Strings:
    """Many strings as one UTF-8 blob and their end offsets: a byte per character and 8 per
    string (a numpy `str` array takes 4 bytes per character of the longest)."""

    blob: np.ndarray  # uint8
    ends: np.ndarray  # int64

    @classmethod
    def of(cls, items: Sequence[str]) -> Strings:
        encoded = [x.encode() for x in items]
        ends = np.cumsum([len(b) for b in encoded], dtype=np.int64)
        return cls(np.frombuffer(b"".join(encoded), np.uint8), ends)

    def get(self, i) -> bytes:
        i = int(i)
        start = int(self.ends[i - 1]) if i else 0
        return self.blob[start : int(self.ends[i])].tobytes()

    def fetch_fn(self):
        """A TensorFlow function: indices (int64 `[k]`) -> the strings (`[k]`), one call."""
        return images.per_batch(self.get)

    def __len__(self) -> int:
        return len(self.ends)


@dataclass(frozen=True)
class Chosen:
    """What rank 0 shares: each split's references into `refs` and labels (compact arrays)."""

    refs: object  # Strings of paths, or tfrecords.Records
    x_train: np.ndarray  # int64 indices into refs
    y_train: np.ndarray  # int32
    x_val: np.ndarray
    y_val: np.ndarray
    num_classes: int
    skipped: tuple[str, ...]
    description: str


def _chosen(data: DataConfig, sel: Selection, refs, train_items, val_items) -> Chosen:
    def labels(part: list) -> np.ndarray:
        return np.array([c for _, c in part], np.int32)

    return Chosen(
        refs, np.asarray(train_items, np.int64), labels(sel.train),
        np.asarray(val_items, np.int64), labels(sel.val), len(sel.class_names),
        tuple(name for name, _ in sel.skipped), _describe(data, sel),
    )  # fmt: skip


def _chosen_files(cfg: Config) -> Chosen:
    sel = select_folder(cfg)
    paths = Strings.of([p for p, _ in sel.train] + [p for p, _ in sel.val])
    n = len(sel.train)
    return _chosen(cfg.data, sel, paths, np.arange(n), np.arange(n, len(paths)))


def _chosen_records(cfg: Config) -> Chosen:
    from hvd_train.data import tfrecords

    d = cfg.data
    train = tfrecords.read_folder(d.train_dir, "data.train_dir")
    val = tfrecords.read_folder(d.val_dir, "data.val_dir") if d.val_dir else None
    sel = select_records(cfg, train, val)
    val_start = len(train.labels) if val is not None else 0  # val records follow train's
    records = tfrecords.join(train, val) if val is not None else train
    val_items = np.asarray([i for i, _ in sel.val], np.int64) + val_start
    return _chosen(cfg.data, sel, records, [i for i, _ in sel.train], val_items)


def _describe(d: DataConfig, sel: Selection) -> str:
    held = f"from {d.val_dir}" if d.val_dir else f"{d.validation_fraction:g} of each class held out"
    h, w = d.image_size
    line = (
        f"{d.source} {d.train_dir}: {len(sel.class_names)} classes, {len(sel.train)} training "
        f"and {len(sel.val)} validation images ({held}), decoded to {h}x{w}x{d.channels}"
    )
    if sel.skipped:
        line += f"; {len(sel.skipped)} corrupt files skipped (first: {sel.skipped[0][0]})"
    return "; ".join([line, *sel.notes])


# --------------------------------------------------------------------------- image_folder


def select_folder(cfg: Config) -> Selection:
    d = cfg.data
    train = images.list_class_folders(d.train_dir, "data.train_dir")
    names = train.class_names
    val_files = None
    if d.val_dir:
        val = images.list_class_folders(d.val_dir, "data.val_dir")
        _same_classes(names, val.class_names, d.val_dir)
        val_files = val.files
    notes = (
        [f"{train.ignored} files without a .jpg/.jpeg/.png name ignored"] if train.ignored else []
    )
    check = (images.file_problem, str)
    listed_val = _Listed(val_files, check) if val_files is not None else None
    return _select(cfg, _Listed(train.files, check), listed_val, names, notes)


def _same_classes(train: Sequence[str], val: Sequence[str], val_dir: str) -> None:
    if tuple(train) != tuple(val):
        missing = sorted(set(train) ^ set(val))
        raise DataError(
            f"data.val_dir: {val_dir} has classes {list(val)[:10]}, but data.train_dir has "
            f"{list(train)[:10]}; they differ in {missing[:5]}"
        )


Check = tuple[Callable[[object], "str | None"], Callable[[object], str]]  # (problem, describe)


@dataclass(frozen=True)
class _Listed:
    """One split's listing: its items by class, and how to check one (`Check`)."""

    per_class: Sequence[Sequence]
    check: Check


def _select(
    cfg: Config, train: _Listed, val: _Listed | None, names: Sequence[str], notes: list[str]
) -> Selection:
    """Split (or take the validation folder), caps, check: the common path of both sources.

    Without a validation folder (`val` None), validation items come from the training listing,
    so they are checked with `train.check`.
    """
    d, seed = cfg.data, cfg.runtime.seed
    train_check = train.check
    if val is None:
        train_pc, val_pc = images.split_by_fraction(
            train.per_class, d.validation_fraction, seed, "data.train_dir", names
        )
        val_key, val_check = "data.train_dir", train_check
    else:
        train_pc, val_pc = (
            images.shuffled(train.per_class, seed),
            images.shuffled(val.per_class, seed),
        )
        val_key, val_check = "data.val_dir", val.check
    tr = images.choose_checked(train_pc, d.max_train_per_class, train_check[0])
    va = images.choose_checked(val_pc, d.max_val_per_class, val_check[0])
    bad = [("data.train_dir", train_check[1](x), why) for x, why in tr.bad]
    bad += [(val_key, val_check[1](x), why) for x, why in va.bad]
    if bad and d.on_corrupt == "error":  # all of them, in one error
        raise images.corrupt_error(bad, "set data.on_corrupt: skip")
    images.require_each_class(tr, [len(x) for x in train_pc], names, "data.train_dir")
    images.require_each_class(va, [len(x) for x in val_pc], names, val_key)
    for label, chosen, cap in (
        ("training", tr, d.max_train_per_class),
        ("validation", va, d.max_val_per_class),
    ):
        if chosen.short:
            few = ", ".join(f"{names[c]} ({n})" for c, n in chosen.short[:5])
            notes.append(f"{len(chosen.short)} classes have fewer {label} images than {cap}: {few}")
    skipped = [(name, why) for _, name, why in bad]
    return Selection(_flatten(tr.per_class), _flatten(va.per_class), tuple(names), skipped, notes)


def _flatten(per_class: Sequence[Sequence]) -> list:
    """(item, label) pairs, class by class, each class in its listing order."""
    return [(x, c) for c, items in enumerate(per_class) for x in sorted(items)]


# --------------------------------------------------------------------------- tfrecord


def select_records(cfg: Config, train, val) -> Selection:
    names = train.class_names
    if val is not None:
        _same_classes(names, val.class_names, cfg.data.val_dir)
    train_pc = _records_per_class(train, names, cfg.data.train_dir, "data.train_dir")
    listed_val = None
    if val is not None:
        val_pc = _records_per_class(val, names, cfg.data.val_dir, "data.val_dir")
        listed_val = _Listed(val_pc, _record_check(val))
    notes = [
        f"{len(r.left_out)} unreadable images were left out by convert-tfrecord ({folder})"
        for r, folder in ((train, cfg.data.train_dir), (val, cfg.data.val_dir))
        if r is not None and r.left_out
    ]
    return _select(cfg, _Listed(train_pc, _record_check(train)), listed_val, names, notes)


def _record_check(records) -> Check:
    return (records.problem, records.name)


def _records_per_class(records, names: Sequence[str], folder: str, key: str) -> list[list]:
    """Record indices per class in the source folder's listing order, with None where
    convert-tfrecord left an unreadable file out: the seeded split and caps then see the list
    the image folder itself gives, and choose the same images."""
    entries: list[list[tuple[int, int | None]]] = [[] for _ in names]
    for i, (c, example_id) in enumerate(zip(records.labels, records.ids, strict=True)):
        entries[c].append((int(example_id), i))
    for example_id, c in records.left_out:
        if 0 <= c < len(names):
            entries[c].append((example_id, None))
    per_class = [[i for _, i in sorted(e, key=lambda t: t[0])] for e in entries]
    for c, items in enumerate(per_class):
        if all(i is None for i in items):
            raise DataError(f"{key}: {folder} has no records of class {names[c]} (label {c})")
    return per_class
