"""Is training waiting for its input? `input_wait_fraction` per epoch, and `data-bench`.

How the wait is measured: Keras fetches the next batch inside the compiled train step, so the
wait cannot be timed from Python around `next()`. Instead the pipeline's last stage (`attach`)
is a sequential map placed after the prefetch buffer; it runs in the step's own thread the
moment the step's fetch returns. The wait of a step is that moment (`tf.timestamp()`) minus the
time Keras called `on_train_batch_begin` just before starting the step: near zero when the
prefetch buffer already held a batch, the whole delay when the pipeline was behind. It
includes the step's entry (tens of microseconds), so it is never exactly 0. The run's very
first step (tracing, filling the buffer) is left out.

No step waits on the host for it: the stage adds each arrival (from the epoch's start) to a
sum on the CPU, the hook adds each begin to a Python float, and the epoch's wait is the one
minus the other, read once an epoch (every arrival follows its own begin).

With `train.steps_per_execution` K, one call into TensorFlow runs K steps and fetches K
batches after one begin: the stage counts the fetches and adds only each call's first. The
fetches inside a call have no begin to be timed from, so their waits count as step time: the
fraction is then the wait before each call, a lower bound of the whole wait (docs/data.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import tensorflow as tf

from hvd_train.data.diagnostics import DECODED_ADVICE
from hvd_train.runtime import distributed
from hvd_train.train.callbacks.base import Callback


class InputWait(Callback):
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
        clock: seconds, read when a step begins and when the epoch ends. Defaults to
            `time.time`.
        stamp: the same clock as a TensorFlow op, read in the pipeline when the step's batch
            arrives. Defaults to `tf.timestamp` (which reads the clock `time.time` reads).
        steps_per_execution: the steps (and fetches) of one call into TensorFlow
            (`train.steps_per_execution`); only each call's first fetch is timed. Defaults to 1.
    """

    def __init__(
        self,
        warn_above: float,
        advice: str | None = DECODED_ADVICE,
        clock: Callable[[], float] = time.time,
        stamp: Callable[[], tf.Tensor] = tf.timestamp,
        steps_per_execution: int = 1,
    ):
        super().__init__()
        self.warn_above = warn_above
        self.advice = advice
        self._clock, self._stamp = clock, stamp
        self.k = steps_per_execution
        with tf.device("/CPU:0"):  # beside the pipeline, whatever device trains
            self._origin = tf.Variable(0.0, dtype=tf.float64, trainable=False)  # the epoch's
            self._arrivals = tf.Variable(0.0, dtype=tf.float64, trainable=False)  # their sum
            self._fetches = tf.Variable(0, dtype=tf.int64, trainable=False)  # in the epoch
        self._first_step = True
        self._warned = False
        self._epochs_seen = 0  # the first, with tracing and filling buffers, warns only alone
        self._start = 0.0  # the epoch's origin: times are summed from it (float64 keeps them)
        self._begins = 0.0  # the sum of the counted steps' begins, from the origin
        self._since: float | None = None  # when the first counted step of the epoch began

    def attach(self, ds: tf.data.Dataset) -> tf.data.Dataset:
        """`ds` with the time-stamping last stage (sequential, after the prefetch)."""

        def stamp(*batch):
            with tf.control_dependencies([self.arrived()]):
                return tuple(tf.identity(t) for t in batch)

        options = tf.data.Options()
        # No prefetch may be slipped in after the stamp, or it would time the wrong thread.
        options.experimental_optimization.inject_prefetch = False
        return ds.map(stamp).with_options(options)

    def arrived(self) -> tf.Operation:
        """The pipeline's stage, as the step's batch arrives: adds the moment to the sum (a
        call's first fetch only)."""
        if self.k == 1:
            return self._arrivals.assign_add(tf.cast(self._stamp(), tf.float64) - self._origin)
        first = tf.equal(self._fetches % self.k, 0)
        moment = tf.cast(self._stamp(), tf.float64) - self._origin
        with tf.control_dependencies([self._arrivals.assign_add(tf.where(first, moment, 0.0))]):
            return self._fetches.assign_add(1)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._start = self._clock()
        self._origin.assign(self._start)
        self._fetches.assign(0)
        self._since = None

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        now = self._clock()
        if self._first_step:
            self._first_step = False  # its arrival is dropped at the next step's begin
            return
        if self._since is None:  # the epoch's first counted step: the sums start here
            self._since, self._begins = now, 0.0
            self._arrivals.assign(0.0)
        self._begins += now - self._start

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        busy = self._clock() - self._since if self._since is not None else 0.0
        mine = (float(self._arrivals.numpy()) - self._begins) / busy if busy > 0 else 0.0
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
