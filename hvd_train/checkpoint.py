"""Saving: resumable checkpoints and plain Keras models, both written atomically."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from typing import Any

import tensorflow as tf

from hvd_train.config import CheckpointConfig
from hvd_train.models import plain_clone


def export_plain_model(model: tf.keras.Model, path: str) -> str:
    """Writes architecture and weights, without the (Horovod-wrapped) optimizer, atomically.

    The file loads with `tf.keras.models.load_model(path)` where Horovod is not installed.
    A functional or sequential model is cloned and saved as `.keras`; a subclassed model, which
    cannot be cloned, is saved as a SavedModel folder (`path` without `.keras`). A crash during
    the write leaves any previous file at `path` as it was. Returns the path written.
    """
    try:
        plain = plain_clone(model)  # Horovod's SyncBatchNormalization back to plain Keras
    except ValueError:  # subclassed model
        target = path.removesuffix(".keras")
        _atomic(target, lambda tmp: model.save(tmp, save_format="tf", include_optimizer=False))
        return target
    _atomic(path, lambda tmp: plain.save(tmp))
    return path


def _atomic(path: str, write) -> None:
    """`write(tmp)` next to `path`, then rename over it: readers see the old or the new, whole."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    suffix = ".keras" if path.endswith(".keras") else ""
    tmp = f"{path.removesuffix(suffix)}.tmp-{os.getpid()}{suffix}"
    try:
        write(tmp)
        if os.path.isdir(path) and os.path.isdir(tmp):
            old = f"{path}.old-{os.getpid()}"
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        elif os.path.exists(tmp):
            os.remove(tmp)


# --------------------------------------------------------------------------- resumable checkpoints

CHECKPOINT_PATTERN = re.compile(r"^ckpt-(\d{8})$")
STATE_FILE = "state.json"
PREFIX = "ckpt"  # tf.train.Checkpoint files inside a checkpoint folder: ckpt.index, ckpt.data-*


class CheckpointStore:
    """`run.dir/checkpoints/`: resumable checkpoints, written atomically, pruned, best kept.

    A checkpoint is a folder `ckpt-<global step, 8 digits>/` holding the model's and the
    optimizer's variables (`tf.train.Checkpoint`: weights, slots, the step counter that drives
    the learning-rate schedule) and `state.json` (epoch, step in epoch, examples of the epoch
    already seen, seed, worker count, batch sizes, the epoch's metrics). It is written under a
    temporary name and renamed into place, so a crash mid-write never leaves a partial
    checkpoint under a valid name. Only rank 0 calls `save`.
    """

    def __init__(self, run_dir: str, cfg: CheckpointConfig):
        self.dir = os.path.join(run_dir, "checkpoints")
        self.cfg = cfg

    def save(self, model: tf.keras.Model, state: dict[str, Any]) -> str:
        """Writes one checkpoint for `state["global_step"]`, then prunes; returns its folder."""
        os.makedirs(self.dir, exist_ok=True)
        final = os.path.join(self.dir, f"ckpt-{state['global_step']:08d}")
        tmp = os.path.join(self.dir, f".tmp-ckpt-{state['global_step']:08d}-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            os.makedirs(tmp)
            tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(
                os.path.join(tmp, PREFIX)
            )
            _write_json(os.path.join(tmp, STATE_FILE), state)
            _fsync_dir(tmp)
            if os.path.isdir(final):  # the same step written again (a rerun with resume: never)
                shutil.rmtree(final)
            os.rename(tmp, final)
            _fsync_dir(self.dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self.prune()
        return final

    def valid(self) -> list[str]:
        """Complete checkpoint folders, oldest first."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        found = sorted(n for n in names if CHECKPOINT_PATTERN.match(n))
        return [
            os.path.join(self.dir, n) for n in found if is_checkpoint(os.path.join(self.dir, n))
        ]

    def newest(self) -> str | None:
        found = self.valid()
        return found[-1] if found else None

    def best(self) -> str | None:
        """The valid checkpoint with the best `monitor` value among those that recorded it."""
        scored = []
        for path in self.valid():
            value = read_state(path).get("metrics", {}).get(self.cfg.monitor)
            if value is not None and math.isfinite(value):
                scored.append((value, path))
        if not scored:
            return None
        pick = max if monitor_mode(self.cfg) == "max" else min
        return pick(scored, key=lambda vp: vp[0])[1]

    def prune(self) -> None:
        """Keeps the newest `keep_last` checkpoints and the best one."""
        found = self.valid()
        keep = set(found[-self.cfg.keep_last :]) | {self.best()}
        for path in found:
            if path not in keep:
                shutil.rmtree(path, ignore_errors=True)


def monitor_mode(cfg: CheckpointConfig) -> str:
    """'min' or 'max': auto means max for accuracy, min for a loss."""
    if cfg.mode != "auto":
        return cfg.mode
    return "max" if cfg.monitor.endswith("accuracy") else "min"


def is_checkpoint(path: str) -> bool:
    """A complete checkpoint folder: state.json readable and the variables' index present."""
    try:
        read_state(path)
    except (OSError, ValueError):
        return False
    return os.path.exists(os.path.join(path, f"{PREFIX}.index"))


def read_state(path: str) -> dict[str, Any]:
    with open(os.path.join(path, STATE_FILE)) as f:
        return json.load(f)


def restore(model: tf.keras.Model, path: str) -> None:
    """Reads a checkpoint's variables into `model` and its (already built) optimizer."""
    status = tf.train.Checkpoint(model=model, optimizer=model.optimizer).read(
        os.path.join(path, PREFIX)
    )
    status.assert_existing_objects_matched()


def _write_json(path: str, data: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
