"""What the input costs: the advice when training waits for data, and summary.json's data
entries. The wait itself is measured by the InputWait callback (train/callbacks/input_wait.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from hvd_train.runtime import distributed

DECODED_ADVICE = (
    "decode less or decode faster: data.cache: memory (decode once), data.source: tfrecord "
    "(hvd-train convert-tfrecord), a smaller data.image_size, or fewer workers per host (more "
    "cores for decoding each); measure with hvd-train data-bench"
)
IN_MEMORY_SOURCES = ("synthetic", "digits")


def advice_for(source: str) -> str | None:
    """What to do about a high input wait, for a `data.source`; None when nothing can be done.

    For data already in memory (synthetic, digits) the "wait" is the step's own start-up and
    scheduling delay, which shows when steps last milliseconds: the input pipeline has nothing
    to improve, so there is no warning (the fraction is still recorded).
    """
    return None if source in IN_MEMORY_SOURCES else DECODED_ADVICE


def data_summary(
    history: dict[str, list[float]], skipped: tuple[str, ...], summary_path: str
) -> dict[str, Any]:
    """summary.json's data entries: the run's input_wait_fraction (epochs after the first, as
    for the rate) and the corrupt files skipped; logs the skipped count on rank 0, naming
    `summary_path` (run.dir's summary.json: record/layout.py) for their list."""
    waits = history.get("input_wait_fraction", [])
    measured = waits[1:] if len(waits) > 1 else waits
    if skipped:
        distributed.log(
            f"{len(skipped)} corrupt files were skipped (data.on_corrupt: skip), listed in "
            f"{summary_path} skipped_files; first: {skipped[0]}"
        )
    return {
        "input_wait_fraction": float(np.mean(measured)) if measured else 0.0,
        "skipped_files": list(skipped),
    }
