"""Trains like `python -m hvd_train CONFIG_ARGS...`, with one phase held open for 2 s on every
rank (a slow disk, a slow validation set; SLOW_PHASE_S seconds when set), and the file named by
SLOW_PHASE_MARKER created when the phase first begins: a test can then stop the job, or kill a
rank, in the middle of it.

- checkpoint: each checkpoint write, after its files are written and before they are renamed
  into place (rank 0 writes checkpoints).
- validation: each validation, before its first batch.
- read: one record's read from a TFRecord file (the 100th of the worker), inside a batch's
  reads on the input pipeline's thread.

Usage: slow_phase.py checkpoint|validation|read --config FILE [--set KEY=VALUE ...]
"""

import itertools
import os
import pathlib
import sys
import time

from hvd_train import cli
from hvd_train.base import files
from hvd_train.data import tfrecords
from hvd_train.train import evaluation

SLOW_S = float(os.environ.get("SLOW_PHASE_S", "2"))


def held(begins: bool) -> None:
    if begins:
        pathlib.Path(os.environ["SLOW_PHASE_MARKER"]).touch()
        time.sleep(SLOW_S)


sync_folder = files.sync_folder
evaluate = evaluation.Evaluator.evaluate


def slow_sync_folder(path: str) -> None:
    """The checkpoint's temporary folder is synced once its files are (base/files.py)."""
    held(os.path.basename(path).startswith(".tmp-ckpt-"))
    sync_folder(path)


def slow_evaluate(self: evaluation.Evaluator) -> dict[str, float]:
    held(True)
    return evaluate(self)


read = tfrecords.Records.read
reads = itertools.count(1)  # next() is atomic: the pipeline reads from several threads


def slow_read(self: tfrecords.Records, i: int) -> bytes:
    held(next(reads) == 100)
    return read(self, i)


phase = sys.argv.pop(1)
if phase == "checkpoint":
    files.sync_folder = slow_sync_folder
elif phase == "validation":
    evaluation.Evaluator.evaluate = slow_evaluate
elif phase == "read":
    tfrecords.Records.read = slow_read
else:
    sys.exit(f"slow_phase.py: no phase {phase!r} (checkpoint, validation, read)")
sys.exit(cli.main(sys.argv[1:]))
