"""Trains in this one process (`trainer.train`) as rank 0 of a job whose other worker dies in
the collective that shares rank 0's claim on run.dir: the collective fails after the claim, as
Gloo's does at once (before horovodrun's SIGTERM), and the run must write its ending under
the claim it holds.

The failure is put in the public collective every rank-0-computes step goes through
(`distributed.chief_computes`), once run.dir's config.yaml is there: the claim writes it.

Usage: claim_collective_fails.py CONFIG RUN_DIR
"""

import os
import sys

import tensorflow as tf

from hvd_train.config import load_config
from hvd_train.runtime import distributed
from hvd_train.train.run import trainer

config, run_dir = sys.argv[1:]
chief_computes = distributed.chief_computes


def fails_once_claimed(fn, name):
    result = chief_computes(fn, name)
    if os.path.exists(os.path.join(run_dir, "config.yaml")):  # rank 0 claimed run.dir
        raise tf.errors.UnknownError(None, None, "Horovod has been shut down. This was caused by "
                                     "an exception on one of the ranks")  # fmt: skip
    return result


distributed.chief_computes = fails_once_claimed
trainer.train(load_config(config, [f"run.dir={run_dir}", "data.source=synthetic"]))
