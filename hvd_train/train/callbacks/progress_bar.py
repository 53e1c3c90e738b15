"""Keras' progress bar, made from the active Keras' class, without the bookkeeping."""

from __future__ import annotations

import functools
import inspect
import sys
from types import ModuleType
from typing import Any

from hvd_train.runtime import distributed
from hvd_train.runtime.keras import binding
from hvd_train.train.callbacks.bookkeeping import without_bookkeeping


def wants_progress_bar(verbose: int) -> bool:
    """Keras' live bar: `train.verbose: 2`, on rank 0, when its stdout is a terminal. In a pipe
    (horovodrun, a file) its frames pile up into kilobyte-long lines. Under mpirun too, whose
    ranks write to a terminal of its own (a pseudo-terminal it reads, then prefixes and
    forwards each line: `isatty()` says yes, and the console got the frames, tagged)."""
    under_mpirun = distributed.controller() == "mpi"
    return verbose == 2 and distributed.is_chief() and sys.stdout.isatty() and not under_mpirun


def ProgressBar() -> Any:  # noqa: N802 - a callback class to its callers
    """Keras' progress bar without the bookkeeping (see `wants_progress_bar`). In the callback
    list, Keras uses it instead of adding its own."""
    return _progress_bar_class(binding.keras())()


@functools.cache
def _progress_bar_class(keras: ModuleType) -> type:
    class ProgressBar(keras.callbacks.ProgbarLogger):
        def __init__(self) -> None:
            # Keras 2 counts steps when told (its default is samples); Keras 3 always does.
            steps = "count_mode" in inspect.signature(keras.callbacks.ProgbarLogger).parameters
            super().__init__(**({"count_mode": "steps"} if steps else {}))

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            super().on_train_batch_end(batch, without_bookkeeping(logs))

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            super().on_epoch_end(epoch, without_bookkeeping(logs))

    return ProgressBar
