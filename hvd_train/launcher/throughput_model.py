"""The throughput model behind `hvd-train plan`: predicted throughput, efficiency and time per epoch
at 1, 2, 4, ... N workers, from one worker's speed, the gradient bytes and the network.

The model (docs/performance.md, "Plan before you pay"), per training step at N workers:

    step(N) = compute x (1 + jitter x sqrt(2 ln N)) + exposed all-reduce

- compute: one worker's step time (per-worker batch / its examples/s).
- The slowest of N workers sets the pace of a synchronous step: with step times spread by a
  coefficient of variation `jitter`, the expected maximum of N is about
  mean x (1 + jitter x sqrt(2 ln N)).
- All-reduce: ring all-reduce of G bytes, 2(N-1)/N x G / bandwidth + 2(N-1) x latency per
  fused buffer, plus half of Horovod's cycle per fused buffer. Across hosts the ring's
  bottleneck is the host's network link (the GPUs of a host share it); on one host it is the
  intra-host link (NVLink or PCIe). Tensor fusion packs the gradients into ceil(G / fusion
  threshold) buffers.
- Overlap: Horovod starts all-reducing while backprop still runs, so `overlap` of the
  all-reduce is hidden, but never more than the backward pass (`backward_share` of compute).

Pure arithmetic: no TensorFlow, no Horovod.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Any

from hvd_train.base.errors import UserError

# Achievable share of a link's line rate for the all-reduce. RDMA (InfiniBand, RoCE): NCCL's
# all-reduce bus bandwidth reaches about 90% of line rate. TCP: assumed half of line rate
# (socket copies and per-stream limits); not measured here.
LINK_EFFICIENCY = {"rdma": 0.9, "tcp": 0.5}


@dataclass(frozen=True)
class Network:
    """The network the workers all-reduce over.

    Args:
        bandwidth_gbit: each host's network link, Gbit/s. Defaults to 25.
        latency_us: one hop across the network, microseconds. Defaults to 10.
        gpus_per_host: workers on each host (they share its link). Defaults to 1.
        intra_host_bandwidth_gbit: the link between workers of one host (NVLink, PCIe),
            Gbit/s. Defaults to 100.
        transport: `rdma` (InfiniBand, RoCE) or `tcp`; sets the achievable share of the line
            rate (LINK_EFFICIENCY). Defaults to `rdma`.
    """

    bandwidth_gbit: float = 25.0
    latency_us: float = 10.0
    gpus_per_host: int = 1
    intra_host_bandwidth_gbit: float = 100.0
    transport: str = "rdma"


@dataclass(frozen=True)
class Assumptions:
    """The model's constants: one set for every prediction.

    Args:
        overlap: share of the all-reduce hidden behind backprop. Defaults to 0.9.
        backward_share: share of a step's compute that is the backward pass, the most the
            all-reduce can hide behind. Defaults to 2/3 (backward costs about twice forward).
        jitter: coefficient of variation of a worker's step time; the one constant calibrated,
            on the single-host 8-GPU rows of docs/performance.md. Defaults to 0.03.
        fusion_threshold_mb: Horovod's fusion buffer (HOROVOD_FUSION_THRESHOLD), MB.
            Defaults to 128 (Horovod 0.28).
        cycle_time_ms: Horovod's background cycle (HOROVOD_CYCLE_TIME), ms. Defaults to 1
            (Horovod 0.28).
        intra_host_latency_us: one hop between workers of a host. Defaults to 2.
    """

    overlap: float = 0.9
    backward_share: float = 2 / 3
    jitter: float = 0.03
    fusion_threshold_mb: float = 128.0
    cycle_time_ms: float = 1.0
    intra_host_latency_us: float = 2.0


@dataclass(frozen=True)
class Workload:
    """What one worker does per step.

    Args:
        throughput: one worker's examples/s, all-reduce-free (a 1-worker run).
        batch: examples per worker per step.
        gradient_bytes: bytes all-reduced per step (parameters x 4, or x 2 in float16).
        examples_per_epoch: for the time per epoch; 0 when unknown. Defaults to 0.
    """

    throughput: float
    batch: int
    gradient_bytes: float
    examples_per_epoch: int = 0

    @property
    def compute_s(self) -> float:
        return self.batch / self.throughput


@dataclass(frozen=True)
class Prediction:
    """One row of the plan."""

    workers: int
    step_s: float
    allreduce_s: float
    exposed_s: float
    throughput: float
    efficiency: float
    epoch_s: float | None


def hosts(workers: int, net: Network) -> int:
    """The hosts `workers` fill, `net.gpus_per_host` to a host."""
    return math.ceil(workers / net.gpus_per_host)


def allreduce_seconds(gradient_bytes: float, workers: int, net: Network, a: Assumptions) -> float:
    """Time of one step's ring all-reduce of `gradient_bytes` over `workers`, fused.

    Args:
        gradient_bytes: bytes each worker contributes.
        workers: the ring's size; 1 means no all-reduce.
        net: the links.
        a: fusion threshold, cycle time, intra-host latency.
    """
    if workers <= 1:
        return 0.0
    across = hosts(workers, net) > 1
    gbit = net.bandwidth_gbit if across else net.intra_host_bandwidth_gbit
    efficiency = LINK_EFFICIENCY[net.transport] if across else LINK_EFFICIENCY["rdma"]
    bytes_per_s = gbit * 1e9 / 8 * efficiency
    hop_s = (net.latency_us if across else a.intra_host_latency_us) * 1e-6
    buffers = max(1, math.ceil(gradient_bytes / (a.fusion_threshold_mb * 2**20)))
    steps = 2 * (workers - 1)  # reduce-scatter then all-gather, each N-1 hops
    transfer = steps / workers * gradient_bytes / bytes_per_s
    return transfer + buffers * (steps * hop_s + a.cycle_time_ms * 1e-3 / 2)


def exposed_seconds(allreduce_s: float, compute_s: float, a: Assumptions) -> float:
    """The part of the all-reduce the step waits for: all but `overlap` of it, and at least
    what does not fit behind the backward pass."""
    return max((1 - a.overlap) * allreduce_s, allreduce_s - a.backward_share * compute_s)


def straggler_factor(workers: int, a: Assumptions) -> float:
    """The slowest of `workers` relative to the mean: 1 + jitter x sqrt(2 ln N)."""
    return 1 + a.jitter * math.sqrt(2 * math.log(workers)) if workers > 1 else 1.0


def predict_one(w: Workload, workers: int, net: Network, a: Assumptions) -> Prediction:
    """The step, throughput and efficiency of `w` at `workers` workers."""
    allreduce = allreduce_seconds(w.gradient_bytes, workers, net, a)
    exposed = exposed_seconds(allreduce, w.compute_s, a)
    step = w.compute_s * straggler_factor(workers, a) + exposed
    rate = workers * w.batch / step
    epoch = w.examples_per_epoch / rate if w.examples_per_epoch else None
    efficiency = rate / (workers * w.throughput)
    return Prediction(workers, step, allreduce, exposed, rate, efficiency, epoch)


def predict(w: Workload, workers: list[int], net: Network, a: Assumptions) -> list[Prediction]:
    """One Prediction per worker count."""
    return [predict_one(w, n, net, a) for n in workers]


def gradient_bytes(parameters: float, fp16: bool) -> float:
    """Bytes all-reduced per step: 4 per parameter, 2 with float16 gradients."""
    return parameters * (2 if fp16 else 4)


def workload_from_run(run_dir: str, fp16: bool) -> Workload:
    """A Workload from a finished 1-worker run's summary.json: its median step time, batch,
    gradient bytes and examples per epoch.

    Raises:
        UserError: no summary.json, a run of several workers, or figures missing.
    """
    from hvd_train.record.layout import RunDir
    from hvd_train.record.summary import read_summary

    path = RunDir(run_dir).summary
    if not os.path.isfile(path):
        raise UserError(f"plan: {path}: no such file; expected a run.dir written by hvd-train")
    s = read_summary(path)
    if s.get("world_size") != 1:
        raise UserError(
            f"plan: {path}: a run of {s.get('world_size')} workers; plan from a 1-worker run "
            "(its step has no all-reduce), or pass --throughput, --params and --batch"
        )
    step_ms, batch = s.get("step_time_ms"), s.get("per_worker_batch_size")
    params = s.get("trainable_parameters")
    missing = [k for k, v in [("step_time_ms", step_ms), ("per_worker_batch_size", batch),
                              ("trainable_parameters", params)] if not v]  # fmt: skip
    if missing:
        raise UserError(
            f"plan: {path}: no {', '.join(missing)} (a run that trained no step, or one "
            "recorded before hvd-train recorded them); pass --throughput, --params and --batch"
        )
    epoch = (s.get("steps_per_epoch") or 0) * (s.get("global_batch_size") or 0)
    fp16 = fp16 or s.get("gradient_dtype") == "float16"
    return Workload(1000 * batch / step_ms, batch, gradient_bytes(params, fp16), epoch)


def check_positive(name: str, value: float | None) -> None:
    """A one-line error naming the option unless `value` > 0."""
    if value is None or not value > 0:
        raise UserError(f"plan: {name}: expected a number > 0, got {value}")


def check_network(net: Network) -> None:
    """One line naming the option when a figure of `net` is not usable."""
    check_positive("--bandwidth-gbit", net.bandwidth_gbit)
    check_positive("--intra-host-bandwidth-gbit", net.intra_host_bandwidth_gbit)
    check_positive("--gpus-per-host", net.gpus_per_host)
    if net.latency_us < 0:
        raise UserError(f"plan: --latency-us: expected a number >= 0, got {net.latency_us}")


def parse_workers(text: str) -> list[int]:
    """`1,2,4` into [1, 2, 4]; a one-line error for anything else."""
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise UserError(f"plan: --workers: expected counts >= 1 like 1,2,4, got {text!r}")
    return sorted(set(counts))


def format_table(rows: list[Prediction]) -> str:
    """Plain text: workers, examples/s, efficiency, step, all-reduce, time per epoch."""
    head = f"{'workers':>7}  {'examples/s':>11}  {'efficiency':>10}  {'step ms':>8}  " \
           f"{'all-reduce ms':>13}  {'exposed ms':>10}  {'epoch':>9}"  # fmt: skip
    lines = [head]
    for r in rows:
        epoch = _duration(r.epoch_s) if r.epoch_s is not None else "-"
        lines.append(
            f"{r.workers:>7}  {r.throughput:>11.1f}  {r.efficiency:>10.3f}  "
            f"{1000 * r.step_s:>8.1f}  {1000 * r.allreduce_s:>13.1f}  "
            f"{1000 * r.exposed_s:>10.1f}  {epoch:>9}"
        )
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def describe(w: Workload, net: Network, a: Assumptions) -> str:
    """The assumptions of a plan, in one paragraph."""
    link = LINK_EFFICIENCY[net.transport]
    return (
        f"Assumptions: one worker computes {w.throughput:.1f} examples/s at batch {w.batch} "
        f"({1000 * w.compute_s:.1f} ms a step); {w.gradient_bytes / 1e6:.1f} MB of gradients "
        f"all-reduced per step by ring all-reduce, fused into buffers of "
        f"{a.fusion_threshold_mb:g} MB, half a {a.cycle_time_ms:g} ms cycle of wait per buffer; "
        f"{net.gpus_per_host} worker(s) per host share a {net.bandwidth_gbit:g} Gbit/s "
        f"{net.transport} link ({100 * link:.0f}% of line rate usable, {net.latency_us:g} us a "
        f"hop); workers on one host use {net.intra_host_bandwidth_gbit:g} Gbit/s "
        f"({100 * LINK_EFFICIENCY['rdma']:.0f}% usable, {a.intra_host_latency_us:g} us a hop); "
        f"{100 * a.overlap:.0f}% of the all-reduce hidden behind backprop, never more than the "
        f"backward pass ({100 * a.backward_share:.0f}% of compute); the slowest worker sets "
        f"the pace (step-time spread {100 * a.jitter:g}%: x(1 + {a.jitter:g} sqrt(2 ln N))). "
        "Not modelled: input pipeline limits, CPU contention between workers of a host, "
        "other traffic. Model and its check against published runs: docs/performance.md."
    )


def default_workers(largest: int = 512) -> list[int]:
    """1, 2, 4, ... `largest`."""
    return [2**i for i in range(int(math.log2(largest)) + 1)]


def with_fusion(a: Assumptions, fusion_mb: float | None, cycle_ms: float | None) -> Assumptions:
    """`a` with the fusion threshold and cycle time given on the command line, if any."""
    changes: dict[str, Any] = {}
    if fusion_mb is not None:
        check_positive("--fusion-threshold-mb", fusion_mb)
        changes["fusion_threshold_mb"] = fusion_mb
    if cycle_ms is not None:
        if cycle_ms < 0:
            raise UserError(f"plan: --cycle-time-ms: expected a number >= 0, got {cycle_ms}")
        changes["cycle_time_ms"] = cycle_ms
    return replace(a, **changes)


@dataclass(frozen=True)
class StatedWorkload:
    """A workload given as numbers (`hvd-train plan --throughput --params --batch`) instead of
    a run; each None when not given.

    Args:
        throughput: one worker's examples/s.
        params: trainable parameters.
        batch: per-worker batch.
    """

    throughput: float | None = None
    params: float | None = None
    batch: int | None = None


def workload(
    run: str | None, stated: StatedWorkload, fp16: bool, examples_per_epoch: int | None
) -> Workload:
    """The workload of `hvd-train plan`: from a run.dir, or from the numbers stated.

    Args:
        run: a 1-worker run.dir, or None for the numbers stated.
        stated: the numbers given instead of `run`.
        fp16: float16 gradients.
        examples_per_epoch: overrides the run's; None keeps it.

    Raises:
        UserError: a mix of both, a number missing or not positive.
    """
    explicit = {
        "--throughput": stated.throughput,
        "--params": stated.params,
        "--batch": stated.batch,
    }
    if run and any(v is not None for v in explicit.values()):
        raise UserError("plan: give --run or --throughput/--params/--batch, not both")
    if run:
        w = workload_from_run(run, fp16)
    else:
        for name, value in explicit.items():
            if value is None:
                raise UserError(
                    f"plan: {name} is missing; give --run RUN_DIR, or --throughput, --params "
                    "and --batch"
                )
            check_positive(name, value)
        w = Workload(stated.throughput, stated.batch, gradient_bytes(stated.params, fp16))
    if examples_per_epoch is not None:
        check_positive("--examples-per-epoch", examples_per_epoch)
        w = replace(w, examples_per_epoch=examples_per_epoch)
    return w
