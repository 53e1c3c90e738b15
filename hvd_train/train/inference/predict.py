"""`hvd-train predict`: a trained model's class for every image of a folder, as a CSV.

Runs alone or under horovodrun with any worker count: worker r predicts batches r, r + N, ...
(`data.batch_shard`), so each image is predicted exactly once; files are listed and checked on
rank 0, and the CSV is written by rank 0 only, sorted by path."""

from __future__ import annotations

import csv
import os

import numpy as np
import tensorflow as tf

from hvd_train.base.errors import DataError
from hvd_train.config import Config
from hvd_train.data import images
from hvd_train.data.images import decode_image
from hvd_train.data.pipeline import batch_shard
from hvd_train.data.sources import Source
from hvd_train.runtime import distributed
from hvd_train.train.inference.files import PREDICTION_COLUMNS, write_atomic
from hvd_train.train.inference.trained_model import image_size, start_inference, takes

# --------------------------------------------------------------------------- predict


def predict(cfg: Config, model_path: str, folder: str, out: str, batch: int) -> int:
    """Writes `out` (rank 0): one row per readable image under `folder`; returns the row count."""
    model, model_path, classes = start_inference(cfg, model_path, batch)
    files, skipped = distributed.chief_computes(
        lambda: _list_images(folder, cfg.data.on_corrupt), "predict_images"
    )
    size, channels = image_size(takes(model, cfg))

    def decode(file):
        return decode_image(tf.io.read_file(file), size, channels)

    # The labels carry each example's index in `files`, so rows can be put back in order.
    index = np.arange(len(files), dtype=np.int32)
    paths = np.array([os.path.join(folder, f) for f in files], dtype=str)
    source = Source(
        index[:0], index[:0], paths, index, len(classes), decode, image_shape=(*size, channels)
    )
    data, _ = batch_shard(source, batch, distributed.rank(), distributed.size())
    rows = _predict_rows(model, data, cfg.model.from_logits)
    rows = [r for part in distributed.allgather_object(rows, "predict_rows") for r in part]
    if distributed.is_chief():
        _write_predictions(out, sorted(rows), files, classes)
    note = f"; {len(skipped)} unreadable images skipped (first: {skipped[0]})" if skipped else ""
    distributed.log(
        f"predicted {len(rows)} images under {folder} with {model_path} "
        f"({distributed.size()} worker(s)){note}; wrote {out}"
    )
    return len(rows)


def _predict_rows(model, data, from_logits: bool) -> list[tuple[int, int, float]]:
    """(example index, class index, its probability) of this worker's examples."""

    @tf.function(autograph=False)  # graph code (from_logits is a Python bool)
    def probabilities(x):
        out = tf.cast(model(x, training=False), tf.float32)
        return tf.nn.softmax(out) if from_logits else out

    rows = []
    for x, idx, w in data:
        p = probabilities(x).numpy()
        for i, pi, wi in zip(idx.numpy(), p, w.numpy(), strict=True):
            if wi:  # 0: padding of a full batch
                c = int(np.argmax(pi))
                rows.append((int(i), c, float(pi[c])))
    return rows


def _list_images(folder: str, on_corrupt: str) -> tuple[list[str], list[str]]:
    """(readable images, unreadable ones) under `folder`, paths relative to it, sorted (rank 0).

    Raises:
        DataError: no such folder, no images, or (on_corrupt: error) an unreadable image.
    """
    if not os.path.isdir(folder):
        raise DataError(f"--images: {folder} is not a folder")
    found, _ = images.images_under(folder)
    if not found:
        raise DataError(f"--images: {folder} holds no .jpg, .jpeg or .png images")
    problems = images.file_problems(found)
    bad = [os.path.relpath(p, folder) for p, why in zip(found, problems, strict=True) if why]
    if bad and on_corrupt == "error":
        raise DataError(
            f"--images: {len(bad)} unreadable images: {', '.join(bad[:5])}"
            f"{' ...' if len(bad) > 5 else ''}; remove them, or set data.on_corrupt=skip"
        )
    good = [os.path.relpath(p, folder) for p, why in zip(found, problems, strict=True) if not why]
    return sorted(good), bad


def _write_predictions(out: str, rows: list, files: list[str], classes: tuple[str, ...]) -> None:
    def write(f) -> None:
        w = csv.writer(f)
        w.writerow(PREDICTION_COLUMNS)
        # 9 significant digits give back the float32 probability exactly.
        w.writerows([files[i], classes[c], c, f"{p:.9g}"] for i, c, p in rows)

    write_atomic(out, write, newline="")
