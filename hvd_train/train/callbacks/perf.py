"""Throughput accounting: step times, examples per second, and the share of training time spent
in all-reduce (from Horovod's timeline), with warm-up left out; and the profiler window.

Warm-up is the first epoch (graph tracing, thread-pool and allocator warm-up) when the run has
more than one; in a one-epoch run it is the first `WARMUP_STEPS` steps.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import tensorflow as tf

from hvd_train.base import startup
from hvd_train.config import Config, Derived
from hvd_train.record.layout import RunDir
from hvd_train.record.summary import Summary
from hvd_train.runtime import distributed
from hvd_train.train.callbacks.base import Callback

WARMUP_STEPS = 5  # left out of a one-epoch run's figures


class StepTimer(Callback):
    """Times every training step; adds `step_time_ms` (the epoch's median) and
    `examples_per_sec_per_worker` to the epoch's logs (epoch_lines.EpochLines prints them).

    A step is the time from one batch's end to the next (the first from the epoch's start), so
    it holds everything a step costs: input, compute, all-reduce, callbacks. With
    `train.steps_per_execution` K the callbacks see one end per K steps: each of the K steps
    is that call's time / K.
    """

    def __init__(self, plan: Derived):
        super().__init__()
        self.plan = plan
        self.steps: list[list[float]] = []  # seconds, per epoch
        self.windows: list[tuple[float, float]] = []  # wall-clock (time.time) of each epoch
        self.seconds: list[float] = []  # training time of each epoch (EpochStats' when there)
        self._last = 0.0
        self._start = 0.0
        self._done = 0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.steps.append([])
        self._start, self._last = time.time(), time.perf_counter()
        self._done = 0  # the steps of this fit's epoch timed

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        now = time.perf_counter()
        # One call into TensorFlow runs train.steps_per_execution steps: each gets its mean.
        ran = self.steps_done(batch) - self._done
        self._done += ran
        self.steps[-1].extend([(now - self._last) / ran] * ran)
        self._last = now
        startup.mark("first_step")  # the first only

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        steps = self.steps[-1]
        self.windows.append((self._start, self._start + sum(steps)))
        # float(): the workers' mean, from MetricAverageCallback, is a numpy float32, which stays
        # one through the arithmetic below under numpy 2 (and is no JSON for summary.json).
        self.seconds.append(float(logs.get("epoch_time_s") or sum(steps)))
        if not steps:
            return
        logs["step_time_ms"] = 1000 * statistics.median(steps)
        rate = len(steps) * self.plan.per_worker_batch / self.seconds[-1]
        logs["examples_per_sec_per_worker"] = rate

    def measured(self) -> tuple[list[float], float, list[tuple[float, float]], str]:
        """Past warm-up: the step times, their total training time, their wall-clock windows,
        and what was left out."""
        if len(self.steps) > 1:
            steps = [s for epoch in self.steps[1:] for s in epoch]
            return steps, sum(self.seconds[1:]), self.windows[1:], "first epoch"
        if not self.steps:
            return [], 0.0, [], "nothing"
        skip = min(WARMUP_STEPS, len(self.steps[0]) // 2)
        steps = self.steps[0][skip:]
        start = self.windows[0][0] + sum(self.steps[0][:skip])
        return steps, sum(steps), [(start, start + sum(steps))], f"first {skip} steps"


def throughput_summary(timer: StepTimer, cfg: Config) -> Summary:
    """summary.json's throughput keys, warm-up left out; the all-reduce shares need
    `horovod.timeline: true` (they are computed on rank 0, null elsewhere and without it)."""
    plan = timer.plan
    steps, seconds, windows, warmup = timer.measured()
    per_worker = len(steps) * plan.per_worker_batch / seconds if seconds else 0.0
    shares = _timeline_shares(RunDir(cfg.run.dir).timeline, windows) if cfg.horovod.timeline else {}
    return {
        "train_examples_per_sec": per_worker * plan.world_size,
        "train_examples_per_sec_per_worker": per_worker,
        "step_time_ms": 1000 * statistics.median(steps) if steps else None,
        "warmup_excluded": warmup,
        "accumulation_steps": plan.accumulation_steps,
        "effective_batch_size": plan.effective_batch,
        "allreduce_time_share": shares.get("ALLREDUCE"),
        "negotiation_time_share": shares.get("NEGOTIATE_ALLREDUCE"),
    }


def log_throughput(summary: Summary) -> None:
    """Rank 0's closing throughput line."""
    share = summary.get("allreduce_time_share")
    comm = f", all-reduce {100 * share:.1f}% of training time" if share is not None else ""
    step = summary.get("step_time_ms") or 0.0
    distributed.log(
        f"throughput ({summary['warmup_excluded']} left out): "
        f"{summary['train_examples_per_sec']:.0f} examples/s, "
        f"{summary['train_examples_per_sec_per_worker']:.0f}/worker, step {step:.1f} ms{comm}"
    )


def _timeline_shares(path: str, windows: list[tuple[float, float]]) -> dict[str, float]:
    """Share of the measured wall time covered by all-reduce (and by negotiation) on rank 0,
    from Horovod's timeline at `path`."""
    if not distributed.is_chief() or not windows:
        return {}
    distributed.stop_timeline()  # Horovod then flushes and closes the file
    events = read_timeline(path)
    return {
        op: covered_share(activity_intervals(events, op), windows)
        for op in ("ALLREDUCE", "NEGOTIATE_ALLREDUCE")
    }


def read_timeline(path: str, wait_s: float = 10.0) -> list[dict[str, Any]]:
    """The events of a Horovod timeline (Chrome trace JSON), waiting up to `wait_s` for the
    writer to finish; a file cut mid-event (a crashed or still-running job) is read up to its
    last whole event."""
    deadline = time.monotonic() + wait_s
    last = None
    while True:
        with open(path) as f:
            text = f.read().rstrip()
        # Horovod ends every event with "]", so a valid file may still grow: wait until the
        # writer's buffer is out (the file stops changing) or the time is up.
        if text == last or time.monotonic() > deadline:
            try:
                return json.loads(text)
            except json.JSONDecodeError:
                if time.monotonic() > deadline:
                    break
        last = text
        time.sleep(0.2)
    cut = text.rfind("},")
    return json.loads(text[: cut + 1] + "]") if cut > 0 else []


def activity_intervals(events: list[dict[str, Any]], op: str) -> list[tuple[float, float]]:
    """(start, end) of every `op` activity (e.g. ALLREDUCE), in seconds since the Unix epoch.

    Horovod writes one "process" per tensor; on it, nested B/E pairs: the operation
    (NEGOTIATE_ALLREDUCE, ALLREDUCE) and inside it the steps (GLOO_ALLREDUCE, ...).
    """
    start_us = next(
        (e["args"]["start_time_since_epoch_in_micros"] for e in events
         if e.get("ph") == "M" and "start_time_since_epoch_in_micros" in e.get("args", {})),
        0,
    )  # fmt: skip
    stacks: dict[int, list[tuple[str, float]]] = {}
    out = []
    for e in events:
        ph = e.get("ph")
        if ph == "B":
            stacks.setdefault(e["pid"], []).append((e["name"], e["ts"]))
        elif ph == "E" and stacks.get(e["pid"]):
            name, begin = stacks[e["pid"]].pop()
            if name == op:
                out.append(((start_us + begin) / 1e6, (start_us + e["ts"]) / 1e6))
    return out


def covered_share(
    intervals: list[tuple[float, float]], windows: list[tuple[float, float]]
) -> float:
    """The fraction of the total length of `windows` that `intervals` cover (overlaps once)."""
    total = sum(b - a for a, b in windows)
    if total <= 0:
        return 0.0
    covered = 0.0
    for w0, w1 in windows:
        clipped = sorted((max(a, w0), min(b, w1)) for a, b in intervals if b > w0 and a < w1)
        end = w0
        for a, b in clipped:
            if b > end:
                covered += b - max(a, end)
                end = b
    return covered / total


class ProfileSteps(Callback):
    """Traces training steps `first..last` (1-based, counted over the run) with TensorFlow's
    profiler into `logdir` (rank 0 only: add it to rank 0's callbacks alone). With
    `steps_per_execution` K, whole calls of K steps: from the one that holds `first` to the
    one that holds `last`."""

    def __init__(self, first: int, last: int, logdir: str, steps_per_execution: int = 1):
        super().__init__()
        self.first, self.last, self.logdir = first, last, logdir
        self.k = steps_per_execution
        self._step = 0  # the steps the calls begun so far run, over the run
        self._began = 0  # the first step traced
        self._on = False

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        start, self._step = self._step + 1, self._step + self.k
        if not self._on and start <= self.first <= self._step:
            tf.profiler.experimental.start(self.logdir)
            self._on, self._began = True, start

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._on and self._step >= self.last:
            self._stop()

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._on:  # the run ended inside the window
            self._stop()

    def _stop(self) -> None:
        tf.profiler.experimental.stop()
        self._on = False
        distributed.log(f"profiler: steps {self._began}-{self._step} traced into {self.logdir}")
