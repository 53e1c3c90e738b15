"""Runs a worker's cases in turn on every rank of one Horovod job (start-up paid once), for
tests/workers/horovod_keras_cases.py and horovod_tape_cases.py; tests/harness.py's `cases`
reads the outcomes.

Rank 0 prints one line per case: `CASE {"name": ..., "ok": bool, "error": str}`; a case that
failed on one rank only is reported failed, by every rank that saw it fail too.
"""

from __future__ import annotations

import hashlib
import json
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

import hvd_train.horovod as hvd


def same_on_every_rank(arrays) -> None:
    """Asserts that `arrays` hold the same bytes on every rank."""
    every = on_every_rank(arrays)
    assert len(set(every)) == 1, f"the ranks' weights differ: {every}"


def on_every_rank(arrays) -> list[int]:
    """Each rank's digest of `arrays`, in rank order."""
    digest = hashlib.sha256(b"".join(np.asarray(a).tobytes() for a in arrays)).hexdigest()
    return hvd.allgather(tf.constant([int(digest[:12], 16)], tf.int64)).numpy().tolist()


def reduction_arguments(keras: Any) -> Iterator[tuple[dict, tuple, float]]:
    """Horovod's reduction arguments (`groups` as a number or as lists of variables,
    `num_groups`, `gradient_predivide_factor`, `op=hvd.Sum`), each with three fresh variables
    a, b, c and what each gradient reduces to when each rank's is rank + 1: the ranks' mean,
    or their sum. DistributedGradientTape and DistributedOptimizer take the same ones."""
    mean = sum(range(1, hvd.size() + 1)) / hvd.size()
    total = float(sum(range(1, hvd.size() + 1)))
    for kwargs, expected in [
        ({"groups": 2}, mean), ({"num_groups": 1}, mean), ({"gradient_predivide_factor": 2.0}, mean),
        ({"op": hvd.Sum}, total), ({}, mean),
    ]:  # fmt: skip
        a, b, c = keras.Variable([0.0]), keras.Variable([0.0, 0.0]), keras.Variable([0.0])
        if kwargs == {}:
            kwargs = {"groups": [[a, c]]}  # lists of variables: b a group of its own
        yield kwargs, (a, b, c), expected


def main(cases: list[Callable[[], None]]) -> None:
    """`hvd.init()`, then each case in turn, each one's outcome printed; exits 0."""
    hvd.init()
    only = set(sys.argv[1:])  # names to run (all by default): for a quick rerun by hand
    for case in cases:
        if only and case.__name__ not in only:
            continue
        try:
            case()
            outcome = {"name": case.__name__, "ok": True, "error": ""}
        except Exception as e:  # noqa: BLE001 - a case's failure is its result
            lines = traceback.format_exception(e)
            outcome = {"name": case.__name__, "ok": False, "error": "".join(lines)[-1500:]}
        # A case that failed on one rank only must fail on every rank's report.
        oks = hvd.allgather(tf.constant([int(outcome["ok"])])).numpy().tolist()
        outcome["ok"] = all(oks)
        if hvd.rank() == 0 or not outcome["ok"]:
            print(f"CASE {json.dumps(outcome)}", flush=True)
    sys.exit(0)
