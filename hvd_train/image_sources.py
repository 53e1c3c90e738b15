"""The image sources, `image_folder` and `tfrecord`: from files to a `data.Source` of strings.

Both go the same way: list the examples per class; hold out validation (a folder of its own,
or `data.validation_fraction` of each class, by seed); take the class-balanced caps; check every
chosen image; then hand the data pipeline one string per example (a path, or encoded bytes) and
the function that decodes it. The listing and the check run on rank 0 and are broadcast, so all
workers train on the same list and no corrupt file is met mid-epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hvd_train import images
from hvd_train.config import Config
from hvd_train.data import Source
from hvd_train.errors import DataError


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
    from hvd_train import distributed  # Horovod only for image sources, not for digits

    d = cfg.data
    decode_size, channels = tuple(d.image_size), d.channels
    if d.source == "image_folder":
        sel = distributed.chief_computes(lambda: _select_folder(cfg), name="image_selection")
        x_train = np.array([p for p, _ in sel.train], dtype=str)
        x_val = np.array([p for p, _ in sel.val], dtype=str)

        def decode(path):
            import tensorflow as tf

            return images.decode_image(tf.io.read_file(path), decode_size, channels)

    else:
        train = _read_records(d.train_dir, "data.train_dir")
        val = _read_records(d.val_dir, "data.val_dir") if d.val_dir else None
        sel = distributed.chief_computes(
            lambda: _select_records(cfg, train, val), name="record_selection"
        )
        x_train = _take(train.encoded, [i for i, _ in sel.train])
        x_val = _take((val or train).encoded, [i for i, _ in sel.val])

        def decode(data):
            return images.decode_image(data, decode_size, channels)

    return Source(
        x_train=x_train,
        y_train=np.array([c for _, c in sel.train], np.int32),
        x_val=x_val,
        y_val=np.array([c for _, c in sel.val], np.int32),
        num_classes=len(sel.class_names),
        decode=decode,
        image_shape=(*decode_size, channels),
        skipped_files=tuple(name for name, _ in sel.skipped),
        description=_describe(cfg, sel),
    )


def _take(encoded: np.ndarray, idx: list[int]) -> np.ndarray:
    return encoded[np.asarray(idx, dtype=np.int64)] if idx else np.zeros(0, dtype=object)


def _describe(cfg: Config, sel: Selection) -> str:
    d = cfg.data
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


def _select_folder(cfg: Config) -> Selection:
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
    return _select(cfg, train.files, val_files, names, check, check, notes)


def _same_classes(train: Sequence[str], val: Sequence[str], val_dir: str) -> None:
    if tuple(train) != tuple(val):
        missing = sorted(set(train) ^ set(val))
        raise DataError(
            f"data.val_dir: {val_dir} has classes {list(val)[:10]}, but data.train_dir has "
            f"{list(train)[:10]}; they differ in {missing[:5]}"
        )


Check = tuple[Callable[[object], "str | None"], Callable[[object], str]]  # (problem, describe)


def _select(
    cfg: Config,
    train_per_class: Sequence[Sequence],
    val_per_class: Sequence[Sequence] | None,
    names: Sequence[str],
    train_check: Check,
    val_check: Check | None,
    notes: list[str],
) -> Selection:
    """Split (or take the validation folder), caps, check: the common path of both sources.

    Without a validation folder, validation items come from the training listing, so they are
    checked with `train_check`.
    """
    d, seed = cfg.data, cfg.runtime.seed
    if val_per_class is None:
        train_pc, val_pc = images.split_by_fraction(
            train_per_class, d.validation_fraction, seed, "data.train_dir", names
        )
        val_key, val_check = "data.train_dir", train_check
    else:
        train_pc, val_pc = (
            images.shuffled(train_per_class, seed),
            images.shuffled(val_per_class, seed),
        )
        val_key = "data.val_dir"
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


def _read_records(folder: str, key: str):
    from hvd_train import tfrecords

    return tfrecords.read_folder(folder, key)


def _select_records(cfg: Config, train, val) -> Selection:
    names = train.class_names
    if val is not None:
        _same_classes(names, val.class_names, cfg.data.val_dir)
    train_pc = _records_per_class(train, names, cfg.data.train_dir, "data.train_dir")
    val_pc = None
    if val is not None:
        val_pc = _records_per_class(val, names, cfg.data.val_dir, "data.val_dir")
    val_check = _record_check(val) if val is not None else None
    notes = [
        f"{len(r.left_out)} unreadable images were left out by convert-tfrecord ({folder})"
        for r, folder in ((train, cfg.data.train_dir), (val, cfg.data.val_dir))
        if r is not None and r.left_out
    ]
    return _select(cfg, train_pc, val_pc, names, _record_check(train), val_check, notes)


def _record_check(records) -> Check:
    return (lambda i: images.image_problem(records.encoded[i]), lambda i: records.names[i])


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
