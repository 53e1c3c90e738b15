"""Using a trained model: `hvd-train evaluate` (exact metrics) and `hvd-train predict` (a CSV).

Both run alone or under horovodrun with any worker count. The examples are cut into batches of
a fixed size in index order and worker r takes batches r, r + N, ... (`data.batch_shard`; the
last batch padded with weight 0), so each example is counted or predicted exactly once, always
in the same place of the same batch; with one compute thread per worker the outputs are then
the same to the last bit at any worker count. Listing and checking image files happen once, on
rank 0 (`distributed.chief_computes`); files are written by rank 0 only.

Class order is training's: image folders in sorted sub-folder order, TFRecords in the order of
`classes.txt`, digits and synthetic by label ("0", "1", ...). A folder evaluated on is matched
to it by class name.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import numpy as np
import tensorflow as tf

from hvd_train.base.errors import DataError
from hvd_train.config import Config
from hvd_train.data import images, tfrecords
from hvd_train.data.sources import Source, load_source
from hvd_train.data.tfrecords import SUFFIX
from hvd_train.runtime import distributed
from hvd_train.train.evaluation import evaluate_in_order
from hvd_train.train.inference.files import EVALUATION_KIND, write_atomic
from hvd_train.train.inference.trained_model import (
    check_inputs,
    image_size,
    start_inference,
    takes,
)

# --------------------------------------------------------------------------- evaluate


def evaluate(cfg: Config, model_path: str, data_path: str, out: str, batch: int) -> dict:
    """Evaluates the model on every worker; rank 0 prints and writes `out`; returns the record."""
    model, model_path, classes = start_inference(cfg, model_path, batch)
    if data_path:
        source = _folder_source(cfg.data.on_corrupt, data_path, classes, takes(model, cfg))
    else:
        source = validation_source(cfg)
    check_inputs(model, source.input_shape, model_path, data_path or "the validation split")
    metrics = evaluate_in_order(model, source, batch, cfg.model.from_logits)
    record = {
        "kind": EVALUATION_KIND,
        "model": model_path,
        "data": data_path or "validation split",
        "examples": len(source.x_val),
        "workers": distributed.size(),
        "batch_size": batch,
        "loss": metrics.get("val_loss"),
        "accuracy": metrics.get("val_accuracy"),
        "skipped_files": list(source.skipped_files),
    }
    if distributed.is_chief():
        write_atomic(out, lambda f: json.dump(record, f, indent=2))
    skipped = f", {len(source.skipped_files)} corrupt files skipped" if source.skipped_files else ""
    distributed.log(
        f"evaluated {model_path} on {record['data']}: {record['examples']} examples, loss "
        f"{record['loss']:.6f}, accuracy {record['accuracy']:.6f} ({record['workers']} "
        f"worker(s){skipped}); wrote {out}"
    )
    return record


def validation_source(cfg: Config):
    """The config's validation split, as training holds it out (not decoded ahead)."""
    source = load_source(replace(cfg, data=replace(cfg.data, cache="none")))
    if not len(source.x_val):
        raise DataError(
            "evaluate: the config's validation split is empty; pass --data FOLDER, or set "
            "data.val_dir or data.validation_fraction"
        )
    return source


def _folder_source(on_corrupt: str, path: str, classes: tuple[str, ...], shape: tuple):
    """Every example of an image folder or a TFRecord folder, labelled by training's classes."""
    size, channels = image_size(shape)
    read = _record_examples if _is_record_folder(path) else _folder_examples
    x, labels, skipped, decode, fetch = read(path, classes, on_corrupt, size, channels)
    return Source(x[:0], np.zeros(0, np.int32), x, np.asarray(labels, np.int32), len(classes),
                  decode, fetch, (*size, channels), tuple(skipped))  # fmt: skip


def _folder_examples(path: str, classes: tuple[str, ...], on_corrupt: str, size, channels):
    """(paths, labels, skipped paths, decode, fetch: None) of an image folder; listed and
    checked on rank 0."""

    def listing():
        folders = images.list_class_folders(path, "--data")
        per_class = _by_name(folders.files, folders.class_names, classes, path)
        return _checked(per_class, classes, (images.file_problem, str), on_corrupt)

    files, labels, skipped = distributed.chief_computes(listing, "eval_folder")

    def decode(file):
        return images.decode_image(tf.io.read_file(file), size, channels)

    return np.array(files, dtype=str), labels, skipped, decode, None


def _record_examples(path: str, classes: tuple[str, ...], on_corrupt: str, size, channels):
    """(record numbers, labels, skipped records, decode, fetch) of a TFRecord folder, indexed by
    every worker (as training does) and checked on rank 0."""
    records = tfrecords.read_folder(path, "--data")
    found = range(len(records.class_names))
    per_class = _by_name(
        [np.flatnonzero(records.labels == c).tolist() for c in found],
        records.class_names, classes, path,
    )  # fmt: skip
    check = (records.problem, records.name)
    kept, labels, bad = distributed.chief_computes(
        lambda: _checked(per_class, classes, check, on_corrupt), "eval_records"
    )
    x = np.asarray(kept, np.int64)  # record numbers: each worker reads its own records

    def decode(encoded):
        return images.decode_image(encoded, size, channels)

    return x, labels, [records.name(i) for i in bad], decode, records.fetch_fn()


def _is_record_folder(path: str) -> bool:
    return os.path.isdir(path) and any(f.endswith(SUFFIX) for f in os.listdir(path))


def _by_name(per_class: list, names: tuple[str, ...], classes: tuple[str, ...], path: str) -> list:
    """The folder's examples per training class (index = training label), matched by name."""
    if sorted(names) != sorted(classes):
        differ = sorted(set(names) ^ set(classes))
        raise DataError(
            f"--data: {path} has classes {list(names)[:10]}, but the model was trained on "
            f"{list(classes)[:10]}; they differ in {differ[:5]}"
        )
    where = {name: i for i, name in enumerate(names)}
    return [list(per_class[where[name]]) for name in classes]


def _checked(per_class: list, classes: tuple[str, ...], check, on_corrupt: str) -> tuple:
    """(items, labels, skipped items) of every readable example, class by class (rank 0)."""
    chosen = images.choose_checked(per_class, None, check[0])
    if chosen.bad and on_corrupt == "error":  # all of them, in one error
        bad = [("--data", check[1](x), why) for x, why in chosen.bad]
        raise images.corrupt_error(bad, "set data.on_corrupt=skip")
    items = [x for c in chosen.per_class for x in sorted(c)]
    labels = [i for i, c in enumerate(chosen.per_class) for _ in c]
    return items, labels, [x for x, _ in chosen.bad]
