"""Users' own callbacks for tests/test_user_callbacks.py (`callbacks: [{class: probe_callbacks:...}]`).

Each records what it saw in files named by rank, so the test can count calls per rank.
"""

import os

import tensorflow as tf

RANK = int(os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))


class CountEpochs(tf.keras.callbacks.Callback):
    """Appends one line per epoch end to `out_dir/<tag>.rank<N>`: the epoch (1-based), the
    steps it ran on this rank, and the val_accuracy it was given."""

    def __init__(self, out_dir: str, tag: str):
        super().__init__()
        self.path = os.path.join(out_dir, f"{tag}.rank{RANK}")
        self.steps = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1

    def on_epoch_end(self, epoch, logs=None):
        with open(self.path, "a") as f:
            f.write(f"{epoch + 1} {self.steps} {logs.get('val_accuracy')!r}\n")


class StopOnOneRank(tf.keras.callbacks.Callback):
    """Sets stop_training on rank `rank` alone, after step `step` of epoch `epoch` (1-based):
    mid-epoch, where Keras would leave the epoch on that rank alone."""

    def __init__(self, rank: int, epoch: int, step: int):
        super().__init__()
        self.rank, self.epoch, self.step = rank, epoch, step
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch + 1

    def on_train_batch_end(self, batch, logs=None):
        if RANK == self.rank and self._epoch == self.epoch and batch + 1 == self.step:
            self.model.stop_training = True


class RankedCSVLogger(tf.keras.callbacks.CSVLogger):
    """Keras' CSVLogger, writing `<filename>.rank<N>`: a file writer, rank 0's by default."""

    def __init__(self, filename: str):
        super().__init__(f"{filename}.rank{RANK}")


class MyBackup(tf.keras.callbacks.BackupAndRestore):
    """A BackupAndRestore by another name: refused all the same."""


class MyPlateau(tf.keras.callbacks.ReduceLROnPlateau):
    """A subclass of Keras' ReduceLROnPlateau: it would set optimizer.lr, so it is refused."""


class NudgeOneWeight(tf.keras.callbacks.Callback):
    """On rank `rank` alone, adds `delta` to the model's first weight after its `step`-th
    batch (counted over the run): a replica made to differ mid-run, as a bit flip or a bug
    would (tests/test_replicas.py)."""

    def __init__(self, rank: int, step: int, delta: float = 1e-3):
        super().__init__()
        self.rank, self.step, self.delta = rank, step, delta
        self._batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self._batches += 1
        if RANK == self.rank and self._batches == self.step:
            weight = self.model.weights[0]
            weight.assign(weight + self.delta)


class EndOfDataAt(tf.keras.callbacks.Callback):
    """Raises TensorFlow's end-of-data error after step `step` of epoch `epoch` (1-based), as
    an error that Keras takes for its input running out would: Keras ends its fit quietly."""

    def __init__(self, epoch: int, step: int):
        super().__init__()
        self.epoch, self.step = epoch, step
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch + 1

    def on_train_batch_end(self, batch, logs=None):
        if (self._epoch, batch + 1) == (self.epoch, self.step):
            raise tf.errors.OutOfRangeError(None, None, "planted end of data")
