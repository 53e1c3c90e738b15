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


@dataclass(frozen=True)
class RunDir:
    """Every path inside one run.dir. Only names: nothing is read or created here."""

    root: str

    def _at(self, *names: str) -> str:
        return os.path.join(self.root, *names)

    @property
    def summary(self) -> str:
        """summary.json: how the run went and ended (record/summary.py)."""
        return self._at(SUMMARY)

    @property
    def metrics(self) -> str:
        """metrics.csv: one row per epoch."""
        return self._at(METRICS)

    @property
    def config(self) -> str:
        """config.yaml: the resolved config."""
        return self._at(CONFIG)

    @property
    def model(self) -> str:
        """model.keras: the final plain model (`model_folder` for a subclassed model)."""
        return self._at(MODEL)

    @property
    def model_folder(self) -> str:
        """model: the final model of a subclassed model, as a SavedModel folder."""
        return saved_model_folder(self.model)

    @property
    def best(self) -> str:
        """best.keras: the best epoch's plain model (`best_folder` for a subclassed model)."""
        return self._at(BEST)

    @property
    def best_folder(self) -> str:
        return saved_model_folder(self.best)

    @property
    def checkpoints(self) -> str:
        """checkpoints/: the resumable checkpoints."""
        return self._at(CHECKPOINTS)

    def checkpoint(self, global_step: int) -> str:
        """checkpoints/ckpt-NNNNNNNN: the checkpoint taken after `global_step` steps."""
        return self._at(CHECKPOINTS, f"ckpt-{global_step:08d}")

    @property
    def checkpoint_pattern(self) -> str:
        """checkpoints/ckpt-*: every checkpoint folder, as a shell pattern (for messages)."""
        return self._at(CHECKPOINTS, "ckpt-*")

    @property
    def checkpoint_form(self) -> str:
        """checkpoints/ckpt-NNNNNNNN: a checkpoint folder, as messages and help show one."""
        return self._at(CHECKPOINTS, "ckpt-NNNNNNNN")

    @property
    def tensorboard(self) -> str:
        """tensorboard/: TensorBoard's event files and the profiler's traces."""
        return self._at(TENSORBOARD)

    @property
    def logs(self) -> str:
        """logs/: each rank's log."""
        return self._at(LOGS)

    def rank_log(self, rank: int) -> str:
        """logs/rank-N.log: rank N's whole output (base/logs.py)."""
        return self._at(LOGS, f"rank-{rank}.log")

    @property
    def timeline(self) -> str:
        """timeline.json: Horovod's timeline, with `horovod.timeline: true`."""
        return self._at(TIMELINE)

    @property
    def lock(self) -> str:
        """.hvd_train.lock: the job that holds run.dir (record/rundir.py)."""
        return self._at(LOCK)

    @property
    def reserve(self) -> str:
        """.hvd_train.reserve: room kept for the final summary.json on a full disk."""
        return self._at(RESERVE)

    @property
    def evaluation(self) -> str:
        """evaluation.json: `hvd-train evaluate`'s default --out."""
        return self._at(EVALUATION)

    @property
    def sweep_log(self) -> str:
        """log.txt: a grid point's command and output, in `hvd-train sweep`'s run.dir of it."""
        return self._at(SWEEP_LOG)


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
