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

import csv
import json
import os
from dataclasses import replace
from typing import Any

import numpy as np

from hvd_train.base.errors import DataError, UserError
from hvd_train.base.files import atomic_write
from hvd_train.config import Config, DataConfig
from hvd_train.record.layout import RunDir

EVALUATION_KIND = "hvd-train evaluate"  # marks a file evaluate may write over
PREDICTION_COLUMNS = ["path", "class", "class_index", "probability"]
_RUN = RunDir("")
MODEL_HINT = (
    f"{_RUN.model}, {_RUN.best}, {_RUN.model_weights}, {_RUN.best_weights} or a "
    f"{_RUN.checkpoint_form} folder of the run"
)


# --------------------------------------------------------------------------- evaluate


def evaluate(cfg: Config, model_path: str, data_path: str, out: str, batch: int) -> dict:
    """Evaluates the model on every worker; rank 0 prints and writes `out`; returns the record."""
    from hvd_train.runtime import distributed
    from hvd_train.train.evaluation import evaluate_in_order

    model, model_path, classes = _start(cfg, model_path, batch)
    if data_path:
        source = _folder_source(cfg.data.on_corrupt, data_path, classes, _takes(model, cfg))
    else:
        source = _validation_source(cfg)
    _check_inputs(model, source.input_shape, model_path, data_path or "the validation split")
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
        _write_atomic(out, lambda f: json.dump(record, f, indent=2))
    skipped = f", {len(source.skipped_files)} corrupt files skipped" if source.skipped_files else ""
    distributed.log(
        f"evaluated {model_path} on {record['data']}: {record['examples']} examples, loss "
        f"{record['loss']:.6f}, accuracy {record['accuracy']:.6f} ({record['workers']} "
        f"worker(s){skipped}); wrote {out}"
    )
    return record


def _validation_source(cfg: Config):
    """The config's validation split, as training holds it out (not decoded ahead)."""
    from hvd_train.data.sources import load_source

    source = load_source(replace(cfg, data=replace(cfg.data, cache="none")))
    if not len(source.x_val):
        raise DataError(
            "evaluate: the config's validation split is empty; pass --data FOLDER, or set "
            "data.val_dir or data.validation_fraction"
        )
    return source


def _folder_source(on_corrupt: str, path: str, classes: tuple[str, ...], shape: tuple):
    """Every example of an image folder or a TFRecord folder, labelled by training's classes."""
    from hvd_train.data.sources import Source

    size, channels = _image_size(shape)
    read = _record_examples if _is_record_folder(path) else _folder_examples
    x, labels, skipped, decode, fetch = read(path, classes, on_corrupt, size, channels)
    return Source(x[:0], np.zeros(0, np.int32), x, np.asarray(labels, np.int32), len(classes),
                  decode, fetch, (*size, channels), tuple(skipped))  # fmt: skip


def _folder_examples(path: str, classes: tuple[str, ...], on_corrupt: str, size, channels):
    """(paths, labels, skipped paths, decode, fetch: None) of an image folder; listed and
    checked on rank 0."""
    from hvd_train.data import images
    from hvd_train.runtime import distributed

    def listing():
        folders = images.list_class_folders(path, "--data")
        per_class = _by_name(folders.files, folders.class_names, classes, path)
        return _checked(per_class, classes, (images.file_problem, str), on_corrupt)

    files, labels, skipped = distributed.chief_computes(listing, "eval_folder")

    def decode(file):
        import tensorflow as tf

        return images.decode_image(tf.io.read_file(file), size, channels)

    return np.array(files, dtype=str), labels, skipped, decode, None


def _record_examples(path: str, classes: tuple[str, ...], on_corrupt: str, size, channels):
    """(record numbers, labels, skipped records, decode, fetch) of a TFRecord folder, indexed by
    every worker (as training does) and checked on rank 0."""
    from hvd_train.data import images, tfrecords
    from hvd_train.runtime import distributed

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
    from hvd_train.data.tfrecords import SUFFIX

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
    from hvd_train.data import images

    chosen = images.choose_checked(per_class, None, check[0])
    if chosen.bad and on_corrupt == "error":  # all of them, in one error
        bad = [("--data", check[1](x), why) for x, why in chosen.bad]
        raise images.corrupt_error(bad, "set data.on_corrupt=skip")
    items = [x for c in chosen.per_class for x in sorted(c)]
    labels = [i for i, c in enumerate(chosen.per_class) for _ in c]
    return items, labels, [x for x, _ in chosen.bad]


# --------------------------------------------------------------------------- predict


def predict(cfg: Config, model_path: str, folder: str, out: str, batch: int) -> int:
    """Writes `out` (rank 0): one row per readable image under `folder`; returns the row count."""
    from hvd_train.data.pipeline import batch_shard
    from hvd_train.data.sources import Source
    from hvd_train.runtime import distributed

    model, model_path, classes = _start(cfg, model_path, batch)
    files, skipped = distributed.chief_computes(
        lambda: _list_images(folder, cfg.data.on_corrupt), "predict_images"
    )
    size, channels = _image_size(_takes(model, cfg))

    def decode(file):
        import tensorflow as tf

        from hvd_train.data.images import decode_image

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
    import tensorflow as tf

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
    from hvd_train.data import images

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

    _write_atomic(out, write, newline="")


# --------------------------------------------------------------------------- the model


def _start(cfg: Config, model_path: str, batch: int):
    """Horovod, devices and the model: (model, its path, training's class names)."""
    from hvd_train.runtime import distributed

    if batch < 1:
        raise UserError(f"--batch-size: expected a count >= 1, got {batch}")
    # No timeline: it would write over the run's own timeline.json.
    distributed.init(replace(cfg.horovod, timeline=False), RunDir(cfg.run.dir).timeline)
    # One compute thread per worker unless set: a float32 result can depend on how many threads
    # share a product, and the outputs must not depend on the worker count.
    threads = cfg.runtime.intra_op_threads or 1
    distributed.configure_devices(threads, cfg.runtime.inter_op_threads)
    classes = distributed.chief_computes(lambda: training_classes(cfg.data), "training_classes")
    path = model_path or exported_model(RunDir(cfg.run.dir))
    model = load_model(cfg, path, len(classes))
    outputs = _outputs(model, config_input_shape(cfg.data))
    if outputs != len(classes):
        raise DataError(
            f"--model: {path} has {outputs} outputs, but the config's data has {len(classes)} "
            f"classes ({', '.join(classes[:5])}...); use the config the model was trained with"
        )
    return model, path, classes


def load_model(cfg: Config, path: str, num_classes: int):
    """A saved Keras model (.keras, .h5, SavedModel folder) or a checkpoint folder's model.

    Raises:
        UserError: no such file, or it cannot be loaded as a model of this config.
    """
    from hvd_train.runtime.keras import binding  # here: the CLI imports this module light
    from hvd_train.train.checkpoint import PREFIX

    if not os.path.exists(path):
        raise UserError(f"--model: {path} does not exist; expected {MODEL_HINT}")
    if os.path.isdir(path) and os.path.exists(os.path.join(path, f"{PREFIX}.index")):
        return _from_checkpoint(cfg, path, num_classes)
    if path.endswith(".weights.h5"):
        return _from_weights(cfg, path, num_classes)
    # Read by the Keras that wrote it (Keras 3 cannot read Keras 2's .keras, nor the reverse).
    active = binding.activate(binding.of_saved(path) or binding.resolve(cfg.runtime.keras))
    if cfg.model.factory:  # the classes its module registers with Keras, as training had them
        from hvd_train.train.models import import_user_module

        import_user_module(cfg.model.factory.rpartition(":")[0])
    try:
        return active.load_model(path)
    except Exception as e:  # noqa: BLE001 - Keras raises many kinds for a file it cannot read
        first = _first_line(e)
        raise UserError(f"--model: cannot load {path} ({first}); expected {MODEL_HINT}") from None


def _takes(model, cfg: Config) -> tuple[int, ...]:
    """One example's shape as the model takes it; a subclassed model (Keras 3) has no
    input_shape, and was built from the config's (`_from_weights`, `_from_checkpoint`)."""
    shape = getattr(model, "input_shape", None)
    return tuple(shape[1:]) if shape is not None else config_input_shape(cfg.data)


def _outputs(model, input_shape: tuple[int, ...]) -> int:
    """The model's outputs a row (Keras 3's subclassed models have no output_shape)."""
    try:
        return int(model.output_shape[-1])
    except AttributeError:
        import numpy as np

        return int(model(np.zeros((1, *input_shape), np.float32)).shape[-1])


def exported_model(run: RunDir) -> str:
    """The run's final model as training exported it: model.keras, a Keras 2 subclassed
    model's SavedModel folder, or model.weights.h5 (a model whose .keras file would not load:
    train/checkpoint.py plain_file_problem); model.keras when there is none."""
    return next((p for p in (run.model, run.model_folder, run.model_weights) if os.path.exists(p)),
                run.model)  # fmt: skip


def _from_weights(cfg: Config, path: str, num_classes: int):
    """The model the config builds (its `model.factory`: no code is read from a file, Keras'
    safe mode stays on) with the weights training exported (`*.weights.h5`)."""
    import numpy as np

    from hvd_train.train.models import build_model

    shape = config_input_shape(cfg.data)
    model = build_model(cfg, shape, num_classes)
    model(np.zeros((1, *shape), np.float32))  # a subclassed model has its weights once called
    try:
        model.load_weights(path)
    except (ValueError, OSError) as e:
        first = _first_line(e)
        raise UserError(
            f"--model: {path} does not fit the config's model ({first}); use the config it was "
            "trained with"
        ) from None
    return model


def _from_checkpoint(cfg: Config, path: str, num_classes: int):
    """The config's model with a training checkpoint's weights (its optimizer state unread)."""
    import tensorflow as tf

    from hvd_train.runtime.keras import binding
    from hvd_train.train.checkpoint import PREFIX, STATE_FILE, read_state, written_by
    from hvd_train.train.models import build_model

    try:
        binding.activate(written_by(read_state(path)))  # built by the Keras that trained it
    except (OSError, ValueError) as e:
        raise UserError(f"--model: {path}: its {STATE_FILE} is unreadable ({e})") from None
    model = build_model(cfg, config_input_shape(cfg.data), num_classes)
    try:
        status = tf.train.Checkpoint(model=model).read(os.path.join(path, PREFIX))  # no optimizer
        status.expect_partial().assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as e:
        first = _first_line(e)
        raise UserError(
            f"--model: checkpoint {path} does not fit the config's model ({first}); use the "
            "config it was trained with"
        ) from None
    return model


def _first_line(e: BaseException) -> str:
    """What a one-line error quotes of an exception Keras or TensorFlow raised."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def _check_inputs(model, data_shape: tuple, model_path: str, data: str) -> None:
    if not hasattr(model, "input_shape"):  # subclassed (Keras 3): built from the config's shape
        return
    if tuple(model.input_shape[1:]) != tuple(data_shape):
        raise DataError(
            f"--model: {model_path} takes inputs of shape {list(model.input_shape[1:])}, but "
            f"{data} gives {list(data_shape)}; use the config the model was trained with"
        )


def _image_size(shape: tuple) -> tuple[tuple[int, int], int]:
    """(height, width) and channels of a model input shape, for decoding images to it."""
    if len(shape) == 3 and shape[-1] in (1, 3):
        return (int(shape[0]), int(shape[1])), int(shape[2])
    raise DataError(
        f"the model takes inputs of shape {list(shape)}, not images of height x width x 1 or 3 "
        "channels, so it cannot read image files"
    )


# --------------------------------------------------------------------------- training's view


def training_classes(d: DataConfig) -> tuple[str, ...]:
    """The class names in training's label order (see the module docstring)."""
    if d.source == "image_folder":
        from hvd_train.data.images import list_class_folders

        return list_class_folders(d.train_dir, "data.train_dir").class_names
    if d.source == "tfrecord":
        from hvd_train.data.tfrecords import CLASSES_FILE, read_folder

        listed = os.path.join(d.train_dir, CLASSES_FILE)
        if not os.path.exists(listed):  # labels then name the classes: read them all
            return read_folder(d.train_dir, "data.train_dir").class_names
        with open(listed) as f:
            return tuple(line.strip() for line in f if line.strip())
    count = 10 if d.source == "digits" else d.num_classes
    return tuple(str(i) for i in range(count))


def config_input_shape(d: DataConfig) -> tuple[int, ...]:
    """The input shape training gives the model for this config's data."""
    if d.source == "digits":
        return (8, 8, 1)
    return tuple(d.image_size) + ((d.channels,) if len(d.image_size) == 2 else ())


# --------------------------------------------------------------------------- files


def refuse_foreign_json(path: str) -> None:
    """Refuses an existing `path` that evaluate did not write (it would be written over)."""
    if not os.path.exists(path):
        return
    try:
        with open(path) as f:
            ours = json.load(f).get("kind") == EVALUATION_KIND
    except (OSError, ValueError, AttributeError):
        ours = False
    if not ours:
        raise UserError(
            f"--out: {path} exists and was not written by hvd-train evaluate; choose another "
            "--out or move the file away"
        )


def refuse_foreign_csv(path: str) -> None:
    """Refuses an existing `path` that predict did not write (it would be written over)."""
    if not os.path.exists(path):
        return
    try:
        with open(path, newline="") as f:
            ours = next(csv.reader(f), None) == PREDICTION_COLUMNS
    except (OSError, UnicodeDecodeError, csv.Error):
        ours = False
    if not ours:
        raise UserError(
            f"--out: {path} exists and is not a predictions CSV of hvd-train predict; choose "
            "another --out or move the file away"
        )


def _write_atomic(path: str, write: Any, newline: str | None = None) -> None:
    """`write(file)` into `path` atomically (base/files.py: a reader sees the old or the new)."""
    try:
        with atomic_write(path, newline=newline) as f:
            write(f)
    except OSError as e:
        raise UserError(f"--out: cannot write {path} ({e.strerror})") from None
