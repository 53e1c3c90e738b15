"""Is training waiting for its input? `input_wait_fraction` per epoch, and `data-bench`.

How the wait is measured: Keras fetches the next batch inside the compiled train step, so the
wait cannot be timed from Python around `next()`. Instead the pipeline's last stage (`attach`)
is a sequential map placed after the prefetch buffer; it runs in the step's own thread the
moment the step's fetch returns, and stores `tf.timestamp()` in a variable. The wait of a step
is that time minus the time Keras called `on_train_batch_begin` just before starting the step:
near zero when the prefetch buffer already held a batch, the whole delay when the pipeline was
behind. It includes the step's entry (tens of microseconds), so it is never exactly 0. The
run's very first step (tracing, filling the buffer) is left out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import tensorflow as tf

from hvd_train import distributed, tuning
from hvd_train.config import Config, Derived, derive
from hvd_train.data import Source, load_source, train_dataset
from hvd_train.keras_stack import keras
from hvd_train.training_step import build_compiled_model

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


class InputWait(keras.callbacks.Callback):
    """Adds `input_wait_fraction` (time waiting for input / step time, the largest over the
    workers) to each epoch's logs; rank 0 warns, once, when it passes `warn_above`, with
    `advice` (not for the first epoch when more follow: like the rate, it is warm-up; never
    without advice).

    Put it first in the callback list (its epoch end is a collective, and later callbacks
    write the logs to files); feed `fit` the dataset `attach` returns.

    Args:
        warn_above: the fraction above which rank 0 warns.
        advice: what the warning tells the user to do; None: no warning (nothing to do).
            Defaults to `DECODED_ADVICE`.
        clock: seconds, read when a step begins and when it ends. Defaults to `time.time`.
        stamp: the same clock as a TensorFlow op, read in the pipeline when the step's batch
            arrives. Defaults to `tf.timestamp` (which reads the clock `time.time` reads).
    """

    def __init__(
        self,
        warn_above: float,
        advice: str | None = DECODED_ADVICE,
        clock: Callable[[], float] = time.time,
        stamp: Callable[[], tf.Tensor] = tf.timestamp,
    ):
        super().__init__()
        self.warn_above = warn_above
        self.advice = advice
        self._clock, self._stamp = clock, stamp
        self._ready = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self._first_step = True
        self._warned = False
        self._epochs_seen = 0  # the first, with tracing and filling buffers, warns only alone
        self._begin = self._wait = self._busy = 0.0

    def attach(self, ds: tf.data.Dataset) -> tf.data.Dataset:
        """`ds` with the time-stamping last stage (sequential, after the prefetch)."""

        def stamp(*batch):
            now = tf.cast(self._stamp(), tf.float64)
            with tf.control_dependencies([self._ready.assign(now)]):
                return tuple(tf.identity(t) for t in batch)

        options = tf.data.Options()
        # No prefetch may be slipped in after the stamp, or it would time the wrong thread.
        options.experimental_optimization.inject_prefetch = False
        return ds.map(stamp).with_options(options)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._wait = self._busy = 0.0

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self._begin = self._clock()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        end = self._clock()
        if self._first_step:
            self._first_step = False
            return
        self._wait += min(max(float(self._ready.numpy()) - self._begin, 0.0), end - self._begin)
        self._busy += end - self._begin

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        mine = self._wait / self._busy if self._busy > 0 else 0.0
        # Horovod: every rank takes part; the worst worker's input holds back all of them.
        fraction = max(distributed.allgather_object(mine, name="input_wait_fraction"))
        logs["input_wait_fraction"] = fraction
        warm_up = not self._epochs_seen and epoch + 1 < self.params.get("epochs", 0)
        self._epochs_seen += 1
        if self.advice and fraction > self.warn_above and not self._warned and not warm_up:
            self._warned = True
            distributed.log(
                f"warning: epoch {epoch + 1} spent {fraction:.0%} of its step time waiting for "
                f"input (input_wait_fraction {fraction:.3f} > {self.warn_above:g}); {self.advice}"
            )


def data_summary(history: dict[str, list[float]], skipped: tuple[str, ...]) -> dict[str, Any]:
    """summary.json's data entries: the run's input_wait_fraction (epochs after the first, as
    for the rate) and the corrupt files skipped; logs the skipped count on rank 0."""
    waits = history.get("input_wait_fraction", [])
    measured = waits[1:] if len(waits) > 1 else waits
    if skipped:
        distributed.log(
            f"{len(skipped)} corrupt files were skipped (data.on_corrupt: skip), listed in "
            f"summary.json skipped_files; first: {skipped[0]}"
        )
    return {
        "input_wait_fraction": float(np.mean(measured)) if measured else 0.0,
        "skipped_files": list(skipped),
    }


# --------------------------------------------------------------------------- data-bench


def data_bench(cfg: Config, batches: int) -> dict[str, float]:
    """Examples/s per worker of the input pipeline alone, and of the model on in-memory tensors
    of the same shape, as each worker of this job (run it under horovodrun for N workers).

    Prints one line on rank 0 and returns the slowest worker's rates.
    """
    tuning.before_init(cfg)  # as the trainer: core binding and XLA set up before Horovod
    distributed.init(cfg.horovod, cfg.run.dir)
    device = distributed.configure_devices(
        cfg.runtime.intra_op_threads, cfg.runtime.inter_op_threads
    )
    keras.utils.set_random_seed(cfg.runtime.seed)
    source = load_source(cfg)
    plan = derive(cfg, distributed.size(), source.num_train)
    warm = 5
    epochs = -(-(warm + batches) // plan.steps_per_epoch)
    long_cfg = _with_epochs(cfg, epochs)
    input_rate = _pipeline_rate(
        train_dataset(source, long_cfg, plan, distributed.rank()), warm, batches
    )
    model_rate = _model_rate(cfg, plan, source, device, warm, batches)
    rates = distributed.allgather_object((input_rate, model_rate), name="data_bench")
    worst_in, worst_model = min(r[0] for r in rates), min(r[1] for r in rates)
    ratio = worst_in / worst_model
    verdict = "input-bound: training will wait for data" if ratio < 1 else "not input-bound"
    distributed.log(
        f"data-bench ({cfg.data.source}, {plan.world_size} worker(s), batch "
        f"{plan.per_worker_batch}/worker, {batches} batches): input pipeline {worst_in:.0f} "
        f"examples/s per worker | model consumes {worst_model:.0f} examples/s per worker | "
        f"ratio {ratio:.2f}: {verdict}"
    )
    return {"input_examples_per_sec": worst_in, "model_examples_per_sec": worst_model}


def _with_epochs(cfg: Config, epochs: int) -> Config:
    return replace(cfg, train=replace(cfg.train, epochs=max(epochs, cfg.train.epochs)))


def _pipeline_rate(ds: tf.data.Dataset, warm: int, batches: int) -> float:
    it = iter(ds)
    for _ in range(warm):
        x, _ = next(it)
    start, n = time.perf_counter(), 0
    for _ in range(batches):
        x, _ = next(it)
        n += int(x.shape[0])
    _ = x.numpy()  # the last batch is really there
    return n / (time.perf_counter() - start)


def _model_rate(
    cfg: Config, plan: Derived, source: Source, device: str, warm: int, batches: int
) -> float:
    """The trainer's own training step (training_step.build_compiled_model: precision, XLA,
    Horovod's averaged gradients) on one in-memory batch repeated: what the model consumes when
    input costs nothing."""
    model = build_compiled_model(cfg, plan, source.input_shape, source.num_classes, device)
    x = tf.random.uniform([plan.per_worker_batch, *source.input_shape])
    y = tf.zeros([plan.per_worker_batch], tf.int32)
    clock = _StepClock(warm)
    ds = tf.data.Dataset.from_tensors((x, y)).repeat()
    model.fit(ds, steps_per_epoch=warm + batches, epochs=1, callbacks=[clock], verbose=0)
    return batches * plan.per_worker_batch / (clock.end - clock.start)


class _StepClock(keras.callbacks.Callback):
    def __init__(self, warm: int):
        super().__init__()
        self.warm, self.start, self.end = warm, 0.0, 0.0

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if batch == self.warm - 1:
            self.start = time.perf_counter()
        self.end = time.perf_counter()
