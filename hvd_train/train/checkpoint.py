"""Saving: resumable checkpoints and plain Keras models, both written atomically.

A write that fails raises `CheckpointError` (see `write_error`): the run ends with exit code 1
and the checkpoints written before stay as they were.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import weakref
from typing import Any, TypedDict

import numpy as np
import tensorflow as tf

from hvd_train.base.errors import CheckpointError
from hvd_train.base.files import atomic_path, is_leftover
from hvd_train.config import CheckpointConfig
from hvd_train.record import layout
from hvd_train.record.layout import RunDir
from hvd_train.runtime.keras import binding
from hvd_train.runtime.keras.contract import Model
from hvd_train.train.models import plain_clone


def export_plain_model(model: Model, path: str) -> str:
    """Writes architecture and weights, without the (distributed) optimizer, atomically.

    The file loads with the Keras that trained the model (`keras.models.load_model(path)`: Keras
    3, or the stack's Keras 2: `tf.keras` on TensorFlow 2.15, `tf_keras` on 2.16+) where neither
    Horovod nor hvd_train is installed. A functional or sequential model is cloned and saved as
    `.keras` (one of a class of its own, a KerasHub task, keeps its class: `plain_clone`); a
    subclassed model, which cannot be cloned, is saved by Keras 3 as `.keras` too,
    by Keras 2 as a SavedModel folder (`path` without `.keras`). A model whose `.keras` file
    would not load again (`plain_file_problem`: no `get_config`, a class Keras cannot find, a
    Lambda layer) gets its weights written instead, `<stem>.weights.h5`, which `evaluate`,
    `predict` and a resume load into the model `model.factory` builds. A crash during the write
    leaves any previous file at `path` as it was. Returns the path written.

    Raises:
        OSError or tf.errors.OpError: the write failed (its temporary file is removed).
    """
    # base/files.py: written as `<stem>.tmp-<pid>.keras` (a folder: `<path>.tmp-<pid>`), then
    # renamed over `path`; what a killed process leaves, `remove_strays` deletes.
    active = binding.active()
    if plain_file_problem(model) is not None:
        target = layout.weights_file(path)
        with atomic_path(target) as tmp:
            model.save_weights(tmp)
        return target
    try:
        plain = plain_clone(model)  # SyncBatchNormalization back to plain Keras
    except ValueError:  # subclassed model
        target = path if active.SUBCLASSED_AS_KERAS else path.removesuffix(".keras")
        with atomic_path(target) as tmp:
            active.save_subclassed(model, tmp)
        return target
    with atomic_path(path) as tmp:
        active.save_plain(plain, tmp)
    return path


_PROBLEMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model: its problem


def plain_file_problem(model: Model, built_in: bool = False) -> str | None:
    """Why `model` cannot be written as a `.keras` file that Keras loads again, in one line
    naming its class and what to add; None when it can (or, on Keras 2, a subclassed model:
    its SavedModel folder needs no config). Found once a model: its config is written and read
    back in this process, in Keras' safe mode, as `load_model` reads a `.keras` file (where
    `model.factory`'s module is imported, so the classes it registers are found).

    keras.io's guides write models that fail it: a subclassed model without `get_config`, a
    functional model of an unregistered class (one that overrides `train_step`), a `Lambda`.
    `built_in`: one of hvd_train's models, whose files load (tested): not read back.
    """
    if model in _PROBLEMS:
        return _PROBLEMS[model]
    if built_in:
        _PROBLEMS[model] = None
        return None
    active = binding.active()
    try:
        plain = plain_clone(model)
    except ValueError:  # subclassed
        plain = model if active.SUBCLASSED_AS_KERAS else None
    problem = None
    if plain is not None:
        saving = active.keras.saving
        try:
            with tf.device("/CPU:0"):  # the copy read back never takes a GPU's memory
                config = saving.serialize_keras_object(plain)
                saving.deserialize_keras_object(config, safe_mode=True)
        except Exception as e:  # noqa: BLE001 - whatever Keras raises, the file would not load
            # Keras' first sentence: what it could not do.
            why = " ".join(str(e).split()).split(". ")[0][:200] or type(e).__name__
            name = type(model).__name__
            fix = (
                "replace the Lambda layer with a layer class of your own"
                if "Lambda" in why
                else f"give {name} get_config()"
            )
            problem = (
                f"the model ({name}) cannot be saved as a .keras file that loads again ({why}); "
                "model.weights.h5 and best.weights.h5 are written instead, which evaluate, "
                "predict and resume load into the model model.factory builds. For .keras files: "
                f"{fix}, registered with @keras.saving.register_keras_serializable()"
            )
    _PROBLEMS[model] = problem
    return problem


# --------------------------------------------------------------------------- resumable checkpoints

CHECKPOINT_PATTERN = layout.CHECKPOINT_FOLDER
STATE_FILE = layout.CHECKPOINT_STATE
PREFIX = layout.CHECKPOINT_PREFIX  # tf.train.Checkpoint's files: ckpt.index, ckpt.data-*
WINDOW_FILE = "window.npz"  # each rank's sums of a part-way accumulation window


class CheckpointStore:
    """`run.dir/checkpoints/`: resumable checkpoints, written atomically, pruned, best kept.

    A checkpoint is a folder `ckpt-<global step, 8 digits>/` holding the model's and the
    optimizer's variables (`tf.train.Checkpoint`: weights, slots, the step counter that drives
    the learning-rate schedule) and `state.json` (epoch, step in epoch, examples of the epoch
    already seen, seed, worker count, batch sizes, the epoch's metrics, every rank's random
    states), and, taken between two updates of an accumulation window, `window.npz` (every
    rank's running sums: runtime/replicas.py). It is written under a
    temporary name and renamed into place, so a crash mid-write never leaves a partial
    checkpoint under a valid name. Only rank 0 calls `save`.
    """

    def __init__(self, run_dir: str, cfg: CheckpointConfig):
        self.run_dir = RunDir(run_dir)
        self.dir = self.run_dir.checkpoints
        self.cfg = cfg

    def save(
        self, model: Model, state: CheckpointState, window: list[list[Any]] | None = None
    ) -> str:
        """Writes one checkpoint for `state["global_step"]`, then prunes; returns its folder.

        `window`: every rank's running gradient sums of a part-way accumulation window (one
        list of arrays per rank), kept as `window.npz`. Defaults to None (none).

        Raises:
            CheckpointError: the write failed (disk full, no permission); the partial folder is
                removed and the earlier checkpoints are left as they were.
        """
        final = self.run_dir.checkpoint(state["global_step"])
        try:
            self._write(model, state, final, window)
        except (OSError, tf.errors.OpError) as e:
            raise write_error(final, e, self.newest(), "checkpoint ") from e
        self.prune()
        return final

    def _write(
        self, model: Model, state: CheckpointState, final: str, window: list[list[Any]] | None
    ) -> None:
        # Atomic (base/files.py): written as `.tmp-ckpt-<step>-<pid>`, hidden from a listing of
        # ckpt-*, every file fsynced, then renamed into place (over the same step written
        # again, by a rerun with resume: never).
        with atomic_path(final, hidden=True) as tmp:
            os.makedirs(tmp)
            binding.active().checkpoint(model).write(os.path.join(tmp, PREFIX))
            if window is not None:
                arrays = {
                    f"{r}/{i}": a for r, sums in enumerate(window) for i, a in enumerate(sums)
                }
                with open(os.path.join(tmp, WINDOW_FILE), "wb") as f:
                    np.savez(f, **arrays)
            with open(os.path.join(tmp, STATE_FILE), "w") as f:
                json.dump(state, f, indent=2)

    def named(self) -> list[str]:
        """Every folder named as a checkpoint (`ckpt-<step>`), complete or not, oldest first."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return [os.path.join(self.dir, n) for n in sorted(names) if CHECKPOINT_PATTERN.match(n)]

    def valid(self) -> list[str]:
        """Complete checkpoint folders, oldest first."""
        return [path for path in self.named() if is_checkpoint(path)]

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

    @staticmethod
    def set_aside(path: str) -> str:
        """Renames a checkpoint that cannot be loaded to `<path>.unloadable`, out of the way of
        resume, pruning and the best-checkpoint search (kept for a look; delete it by hand)."""
        target = layout.unloadable(path)
        shutil.rmtree(target, ignore_errors=True)
        os.rename(path, target)
        return target


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


def read_window(path: str) -> list[list[np.ndarray]] | None:
    """Every rank's running gradient sums kept in checkpoint `path` (see `save`); None when
    it was taken at a window's start (or before hvd_train kept them)."""
    try:
        with np.load(os.path.join(path, WINDOW_FILE)) as z:
            keys = [tuple(map(int, k.split("/"))) for k in z.files]
            ranks = 1 + max(r for r, _ in keys)
            return [
                [z[f"{r}/{i}"] for i in sorted(i for k, i in keys if k == r)] for r in range(ranks)
            ]
    except FileNotFoundError:
        return None


def read_state(path: str) -> CheckpointState:
    with open(os.path.join(path, STATE_FILE)) as f:
        return json.load(f)


# What resuming reads from state.json.
STATE_KEYS = ("epoch", "step", "examples_in_epoch", "world_size", "global_batch")


class CheckpointState(TypedDict, total=False):
    """A checkpoint's state.json (train/callbacks/checkpointer.py writes it): where training
    stands and what a resume needs besides the variables. Older checkpoints may lack the
    later fields (`keras`, `lr_multiplier`, `random_states`): readers default them."""

    global_step: int  # the optimizer's step counter, which names the folder (ckpt-<step>)
    epoch: int  # the epoch to continue (0-based); `step` of its steps are done
    step: int
    examples_in_epoch: int  # step x global_batch: where a resume at another batch continues
    epochs: int  # train.epochs
    steps_per_epoch: int
    world_size: int
    per_worker_batch: int
    global_batch: int
    seed: int
    reason: str  # "epoch_end", "stopped", ...
    metrics: dict[str, float]  # the epoch-end metrics (best.keras is chosen on one of them)
    lr_multiplier: float  # ReduceLROnPlateau's factor so far
    keras: str  # the Keras that wrote it ("keras 3.15.1"): the other cannot read it
    random_states: Any  # every rank's dropout generators (train/callbacks/random_states.py)
    time: float


class Unloadable(Exception):
    """A checkpoint that cannot be restored into this model; the message says why.

    `mismatch`: it was read, but its variables do not fit this model and optimizer (a changed
    config, not a damaged file).
    """

    def __init__(self, why: str, mismatch: bool = False):
        super().__init__(why)
        self.mismatch = mismatch


class OtherKeras(Exception):
    """A checkpoint written by the other Keras: Keras 3 cannot read Keras 2's variables, nor
    the reverse (their names differ). Not a damaged file: it is never set aside."""


def written_by(state: CheckpointState) -> str:
    """The Keras that wrote a checkpoint: state.json's `keras` ("keras 3.15.1"); hvd_train's
    checkpoints from before Keras 3 do not say, and are Keras 2's."""
    version = str(state.get("keras", "tf_keras 2")).rpartition(" ")[2]
    return binding.KERAS3 if binding.version_tuple(version) >= (3,) else binding.KERAS2


def check_keras(state: CheckpointState) -> None:
    """Raises OtherKeras when the checkpoint of `state` is not the active Keras'."""
    active = binding.active()
    if written_by(state) != active.NAME:
        raise OtherKeras(
            f"it was written by {state.get('keras', 'Keras 2 (tf_keras)')}, and this run trains "
            f"with {active.describe()}: set runtime.keras: {written_by(state)} to resume it"
        )


def load(model: Model, path: str) -> CheckpointState:
    """Restores checkpoint `path` into `model` and its (already built) optimizer; returns its
    state.

    state.json is read first, so an unreadable one leaves the model untouched. A restore that
    fails part-way may have overwritten some variables; restoring another checkpoint of the
    same model afterwards overwrites them all (tf.train.Checkpoint restores every variable it
    matches, and `load` insists that all of them match).

    Raises:
        Unloadable: state.json is unreadable, ckpt.index is missing, a file is truncated or
            corrupt, or the variables do not match.
        OtherKeras: the other Keras wrote it.
    """
    try:
        state = read_state(path)
        missing = [k for k in STATE_KEYS if k not in state]
    except (OSError, ValueError, TypeError) as e:
        raise Unloadable(f"{STATE_FILE} is unreadable ({_brief(e)})") from e
    if missing:
        raise Unloadable(f"{STATE_FILE} lacks {', '.join(missing)}")
    check_keras(state)
    if not os.path.exists(os.path.join(path, f"{PREFIX}.index")):
        raise Unloadable(f"{PREFIX}.index is missing")
    try:
        restore(model, path)
    except (AssertionError, ValueError) as e:
        raise Unloadable(
            f"it does not match this model and optimizer ({_brief(e)})", mismatch=True
        ) from e
    except Exception as e:  # noqa: BLE001 - a damaged file raises many kinds (IndexError, ...)
        raise Unloadable(
            f"its variables cannot be read: {PREFIX}.index or {PREFIX}.data-* is truncated or "
            f"corrupt ({_brief(e)})"
        ) from e
    return state


def restore(model: Model, path: str) -> None:
    """Reads a checkpoint's variables into `model` and its (already built) optimizer."""
    status = binding.active().checkpoint(model).read(os.path.join(path, PREFIX))
    status.assert_existing_objects_matched()


# --------------------------------------------------------------------------- failed writes

# How to go on after a write failed with this errno ({dir}: the folder written to).
_FIXES = {
    errno.ENOSPC: "free space in {dir}",
    errno.EDQUOT: "free space in {dir} or raise the quota",
    errno.EFBIG: "raise the file-size limit (ulimit -f)",
    errno.EACCES: "make {dir} writable",
    errno.EPERM: "make {dir} writable",
    errno.EROFS: "write run.dir to a writable file system",
}


def write_error(path: str, e: BaseException, newest: str | None, what: str = "") -> CheckpointError:
    """The one-line error for a failed write of `path`: what failed, why, and how to go on.

    `newest`: the newest checkpoint left intact, from which a rerun resumes. `what` goes
    before the path ("checkpoint "). Defaults to "".
    """
    code, cause = _cause(e)
    fix = _FIXES.get(code, "check {dir}").format(dir=os.path.dirname(path) or ".")
    kept = (
        f"the newest checkpoint, {newest}, is intact and train.resume=auto resumes from it"
        if newest
        else "no checkpoint was written before: a rerun starts afresh"
    )
    return CheckpointError(f"cannot write {what}{path}: {cause}; {fix}; {kept}")


def _cause(e: BaseException) -> tuple[int | None, str]:
    """(errno, its text) of the OS error behind `e`; TensorFlow's ops give only the text."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno:
            return seen.errno, seen.strerror or os.strerror(seen.errno)
        seen = seen.__cause__ or seen.__context__
    for code in _FIXES:
        if os.strerror(code) in str(e):  # TensorFlow: "...{tmp file}; No space left on device"
            return code, os.strerror(code)
    return None, _brief(e)


def _brief(e: BaseException) -> str:
    """`Type: message` on one line, at most 200 characters; for a TensorFlow op error its
    last line (the rest is a traceback of where the op was defined)."""
    text = str(e)
    if isinstance(e, tf.errors.OpError):
        lines = [ln.strip() for ln in e.message.splitlines() if ln.strip()]
        text = lines[-1] if lines else text
    text = " ".join(text.split())
    return f"{type(e).__name__}: {text[:200]}" if text else type(e).__name__


# --------------------------------------------------------------------------- the run folder


def remove_strays(run_dir: str) -> list[str]:
    """Deletes the temporary files and folders of writes a killed job left unfinished in
    run.dir and run.dir/checkpoints (rank 0, when a job starts: it owns run.dir then); returns
    their paths."""
    # What a job killed mid-write leaves: the temporaries of atomic writes (files.is_leftover).
    found = [os.path.join(run_dir, n) for n in _listdir(run_dir) if is_leftover(n)]
    ckpts = RunDir(run_dir).checkpoints
    found += [os.path.join(ckpts, n) for n in _listdir(ckpts) if is_leftover(n)]
    for path in found:
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            _remove(path)
    return found


def set_aside_earlier_run(run_dir: str) -> str | None:
    """`train.resume: never` (rank 0, as the job starts): moves the checkpoints (loadable or
    set aside as unloadable) and the best model an earlier run left into checkpoints/earlier-N,
    the first free N, and returns that folder; None when there were none. Nothing is deleted.

    Left in place, they would mix two runs: this run's checkpoints would be pruned as older than
    the earlier run's (pruning keeps the newest steps), its best model would have to beat the
    earlier run's, and a later `train.resume: auto` would continue the earlier run.
    """
    run = RunDir(run_dir)
    names = [n for n in _listdir(run.checkpoints)
             if CHECKPOINT_PATTERN.match(n.removesuffix(layout.UNLOADABLE))]  # fmt: skip
    found = [os.path.join(run.checkpoints, n) for n in names]
    found += [p for p in run.best_forms() if os.path.exists(p)]
    if not found:
        return None
    n = 1
    while os.path.exists(run.earlier_run(n)):
        n += 1
    target = run.earlier_run(n)
    os.makedirs(target)
    for path in found:
        os.rename(path, os.path.join(target, os.path.basename(path)))
    return target


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
