"""Training from a position (epoch, step): the part-done epoch on its own, then the rest.

Shared by the static trainer and each Horovod Elastic membership: the data order depends only
on (seed, epoch), so a part-done epoch is its epoch's data with the done steps skipped.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from hvd_train.data.job import Job, Position
from hvd_train.data.pipeline import to_device, train_dataset
from hvd_train.runtime import distributed
from hvd_train.runtime.keras import binding
from hvd_train.train.callbacks.callback_list import RunCallbacks
from hvd_train.train.callbacks.input_wait import InputWait
from hvd_train.train.callbacks.progress_bar import wants_progress_bar

# Keras times the callbacks' batch hooks over a fit's first batches, the first included, and
# warns when they take longer than the steps. The first batch's on_train_batch_end is slow,
# nearly all of it Horovod's BroadcastGlobalVariablesCallback tracing and running its
# broadcast, once; from the third batch on, the hooks are a small part of a step
# (docs/benchmarks.md, "The callbacks' cost a step, and the host reads between steps"). The
# warning so reports a one-off start-up cost as a per-step one, and the user can do nothing
# about it.
SLOW_FIRST_BATCH = "Callback method `on_train_batch_end` is slow compared to the batch time"


def fit_from(
    model: Any,
    job: Job,
    at: Position,
    callbacks: RunCallbacks,
    history: dict[str, list[float]] | None = None,
) -> dict[str, list[float]]:
    """Runs `model.fit` from `at` (epoch, step) to `train.epochs` with `callbacks.all` (in
    Keras' order, as callback_list.build_callbacks makes them; `callbacks.input_wait`, among
    them, time-stamps the data); returns the joined history.

    Each `fit`'s history is added to `history` as soon as it ends, so an elastic reset in a
    later `fit` keeps the earlier ones. Stops early when a callback sets `model.stop_training`
    (an agreed stop, a NaN).
    """
    history = {} if history is None else history
    cfg, epoch, step = job.cfg, at.epoch, at.step
    # Keras' bar (build_callbacks put a progress_bar.ProgressBar in the list), else none.
    verbose = 1 if wants_progress_bar(cfg.train.verbose) else 0
    while epoch < cfg.train.epochs:
        data = fit_dataset(job, Position(epoch, step), callbacks.input_wait)
        last = epoch + 1 if step else cfg.train.epochs  # a part-done epoch on its own
        steps = job.plan.steps_per_epoch - step
        # The hooks get each step's logs as tensors on both Kerases: no host read a step.
        listed = binding.active().fit_callbacks(list(callbacks.all), model, verbose, last, steps)
        with without_first_batch_timing_warning():
            h = model.fit(
                data, initial_epoch=epoch, epochs=last, steps_per_epoch=steps, callbacks=listed,
                verbose=verbose, shuffle=False,  # the data is in its epoch's order already
            )  # fmt: skip
        for key, values in h.history.items():
            history.setdefault(key, []).extend(values)
        if model.stop_training:
            break
        epoch, step = last, 0
    return history


def fit_dataset(job: Job, at: Position, input_wait: InputWait) -> tf.data.Dataset:
    """This worker's batches from `at` (epoch, step), as `fit` reads them: the epoch's data with the
    done steps skipped, the input-wait stamp, and last (TensorFlow requires it last) the copy
    to the GPU that `data.prefetch_to_device` asks for.

    A part-done epoch (`at.step` > 0) is its own `fit` and gets only that epoch's steps left:
    where they are no multiple of `train.steps_per_execution` (a resume at another worker
    count, an elastic reset), Keras 3's last call ends at the end of this data instead of
    running on into the next epoch's batches."""
    data = train_dataset(job, distributed.rank(), first_epoch=at.epoch)
    if at.step:
        data = data.skip(at.step).take(job.plan.steps_per_epoch - at.step)
    return to_device(input_wait.attach(data), job.cfg.data.prefetch_to_device)


class _DropMessage(logging.Filter):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


@contextlib.contextmanager
def without_first_batch_timing_warning() -> Iterator[None]:
    """Drops Keras' slow-callback warning for on_train_batch_end (see SLOW_FIRST_BATCH), and
    only it, only while `fit` runs."""
    dropped = _DropMessage(SLOW_FIRST_BATCH)
    tf.get_logger().addFilter(dropped)
    try:
        yield
    finally:
        tf.get_logger().removeFilter(dropped)
