"""What a run writes in run.dir, by name: the one place these names are spelled.

The names are contracts (scripts, `hvd-train compare` on copied runs, older runs resumed):
docs/faults.md ("What a run writes") describes each file. `RunDir(run.dir)` names every path;
a checkpoint folder's own files are named by `checkpoint_state` and `checkpoint_prefix`,
since `train.resume` may name a checkpoint folder outside any run.dir.
tests/test_layout.py fails when another module of hvd_train spells one of these names.

Standard library only: the launchers and the keeper read run.dir without TensorFlow.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass

SUMMARY = "summary.json"
METRICS = "metrics.csv"
CONFIG = "config.yaml"
MODEL = "model.keras"
BEST = "best.keras"
CHECKPOINTS = "checkpoints"
TENSORBOARD = "tensorboard"
LOGS = "logs"
TIMELINE = "timeline.json"
LOCK = ".hvd_train.lock"
RESERVE = ".hvd_train.reserve"
EVALUATION = "evaluation.json"  # `hvd-train evaluate`'s default --out
SWEEP_LOG = "log.txt"  # a grid point's of `hvd-train sweep`: its command and output
# `hvd-train export`'s default --out, one per format, inside the folder EXPORT.
EXPORT = "export"
EXPORTED = {"saved_model": "saved_model", "onnx": "model.onnx", "litert": "model.tflite"}

# Inside a checkpoint folder `checkpoints/ckpt-<global step, 8 digits>`: its state (epoch, step,
# batches, metrics) and the prefix of tf.train.Checkpoint's files (ckpt.index, ckpt.data-*).
CHECKPOINT_FOLDER = re.compile(r"^ckpt-(\d{8})$")
CHECKPOINT_STATE = "state.json"
CHECKPOINT_PREFIX = "ckpt"
# A checkpoint that could not be loaded is renamed `<folder>.unloadable`, out of resume's way.
UNLOADABLE = ".unloadable"


def saved_model_folder(keras_file: str) -> str:
    """Where a model that cannot be saved as a `.keras` file (a subclassed model) is exported
    instead: its SavedModel folder, the path without `.keras` (`model`, `best`)."""
    return keras_file.removesuffix(".keras")


def weights_file(keras_file: str) -> str:
    """Where the weights of a model whose `.keras` file would not load elsewhere (no
    `get_config`, an unregistered class, a Lambda) are exported instead: `model.weights.h5`,
    `best.weights.h5`."""
    return keras_file.removesuffix(".keras") + ".weights.h5"


def _in_run_dir(*names: str, doc: str) -> property:
    """A RunDir property: the path of `names` inside its root."""
    return property(lambda self: os.path.join(self.root, *names), doc=doc)


@dataclass(frozen=True)
class RunDir:
    """Every path inside one run.dir (`RunDir(cfg.run.dir).summary`). Only names: nothing is
    read or created here."""

    root: str

    summary = _in_run_dir(SUMMARY, doc="How the run went and ended (record/summary.py).")
    metrics = _in_run_dir(METRICS, doc="One row per epoch.")
    config = _in_run_dir(CONFIG, doc="The resolved config.")
    model = _in_run_dir(MODEL, doc="The final plain model (`model_folder`: subclassed).")
    model_folder = _in_run_dir(saved_model_folder(MODEL), doc="A subclassed final model.")
    best = _in_run_dir(BEST, doc="The best epoch's plain model (`best_folder`: subclassed).")
    best_folder = _in_run_dir(saved_model_folder(BEST), doc="A subclassed best model.")
    model_weights = _in_run_dir(weights_file(MODEL), doc="The final model's weights alone.")
    best_weights = _in_run_dir(weights_file(BEST), doc="The best epoch's model's weights alone.")
    checkpoints = _in_run_dir(CHECKPOINTS, doc="The resumable checkpoints' folder.")
    checkpoint_pattern = _in_run_dir(CHECKPOINTS, "ckpt-*", doc="Every checkpoint, for messages.")
    checkpoint_form = _in_run_dir(
        CHECKPOINTS, "ckpt-NNNNNNNN", doc="A checkpoint, as help shows one."
    )
    tensorboard = _in_run_dir(TENSORBOARD, doc="TensorBoard's event files, the profiler's traces.")
    logs = _in_run_dir(LOGS, doc="Each rank's log (`rank_log`).")
    timeline = _in_run_dir(TIMELINE, doc="Horovod's timeline, with `horovod.timeline: true`.")
    lock = _in_run_dir(LOCK, doc="Names the job that holds run.dir (record/rundir.py).")
    reserve = _in_run_dir(RESERVE, doc="Room kept for the final summary.json on a full disk.")
    evaluation = _in_run_dir(EVALUATION, doc="`hvd-train evaluate`'s default --out.")
    sweep_log = _in_run_dir(SWEEP_LOG, doc="A grid point's command and output (hvd-train sweep).")
    exports = _in_run_dir(EXPORT, doc="`hvd-train export`'s serving models (`exported`).")

    def checkpoint(self, global_step: int) -> str:
        """checkpoints/ckpt-NNNNNNNN: the checkpoint taken after `global_step` steps."""
        return os.path.join(self.root, CHECKPOINTS, f"ckpt-{global_step:08d}")

    def best_forms(self) -> tuple[str, str, str]:
        """Every form the best model may be exported in (train/checkpoint.py
        export_plain_model): its SavedModel folder, its weights, best.keras; the last that
        exists is the one written."""
        return self.best_folder, self.best_weights, self.best

    def earlier_run(self, n: int) -> str:
        """checkpoints/earlier-N: where a job with `train.resume: never` sets aside the
        checkpoints and best model an earlier run left (the Nth time), out of its way."""
        return os.path.join(self.root, CHECKPOINTS, f"earlier-{n}")

    def exported(self, fmt: str) -> str:
        """export/saved_model, export/model.onnx, export/model.tflite: `hvd-train export`'s
        default --out for a format."""
        return os.path.join(self.root, EXPORT, EXPORTED[fmt])

    def rank_log(self, rank: int) -> str:
        """logs/rank-N.log: rank N's whole output (base/logs.py)."""
        return os.path.join(self.root, LOGS, f"rank-{rank}.log")

    def started_run_logs(self) -> Callable[[int], str] | None:
        """`rank_log` where a training job has started a run here (its summary.json exists),
        for a command that adds its output to the run's logs; None elsewhere."""
        return self.rank_log if os.path.isfile(self.summary) else None


# Every name a run (or hvd-train evaluate and sweep in it) writes at the top of run.dir, from
# RunDir's paths: a folder that holds only these (and temporaries) is an earlier run's
# (record/rundir.py).
RUN_FILES = frozenset(
    getattr(RunDir(""), name).split(os.sep)[0]
    for name, value in vars(RunDir).items()
    if isinstance(value, property)
)


def checkpoint_state(folder: str) -> str:
    """The checkpoint folder's state.json."""
    return os.path.join(folder, CHECKPOINT_STATE)


def checkpoint_prefix(folder: str) -> str:
    """The prefix tf.train.Checkpoint writes the folder's variables under (`ckpt`)."""
    return os.path.join(folder, CHECKPOINT_PREFIX)


def checkpoint_index(folder: str) -> str:
    """The index of the folder's variables (`ckpt.index`): written last by tf.train.Checkpoint."""
    return checkpoint_prefix(folder) + ".index"


def unloadable(folder: str) -> str:
    """Where a checkpoint folder that cannot be loaded is set aside."""
    return folder + UNLOADABLE
