"""The bookkeeping hvd_train's callbacks put into the epoch's logs (for metrics.csv, the history
and summary.json), kept out of what a person reads."""

from __future__ import annotations

import math

# Bookkeeping that the callbacks below put into the epoch's logs for metrics.csv, the history
# and summary.json, and that stays out of what Keras prints. TensorBoard gets it under these
# tags: Keras' own callback prefixes `epoch_` to every key (`epoch_epoch_examples`).
# `learning_rate` is left to that callback, which writes `epoch_learning_rate` from the schedule.
BOOKKEEPING_TAGS = {
    "epoch_examples": "throughput/epoch_examples",
    "epoch_time_s": "throughput/epoch_time_s",
    "examples_per_sec": "throughput/examples_per_sec",
    "examples_per_sec_per_worker": "throughput/examples_per_sec_per_worker",
    "step_time_ms": "throughput/step_time_ms_median",
    "input_wait_fraction": "input/wait_fraction",
}
BOOKKEEPING = frozenset([*BOOKKEEPING_TAGS, "learning_rate"])


def without_bookkeeping(logs: dict | None) -> dict:
    """The logs a person reads: the model's metrics, without `BOOKKEEPING`."""
    return {k: v for k, v in (logs or {}).items() if k not in BOOKKEEPING}


def is_number(v: object) -> bool:
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False
