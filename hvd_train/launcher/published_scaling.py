"""Published multi-GPU runs, and what the throughput model (throughput_model.py) predicts for
each from its single-GPU throughput, the model's parameter count and the stated network alone.

`hvd-train plan --published` prints the table docs/performance.md holds; tests/test_plan.py
recomputes it and holds each prediction to 10% of the published efficiency.
"""

from __future__ import annotations

from dataclasses import dataclass

from hvd_train.launcher.throughput_model import (
    Assumptions,
    Network,
    Workload,
    gradient_bytes,
    predict_one,
)

# Parameter counts from the Keras Applications table, millions.
PARAMS_M = {"Inception V3": 23.9, "ResNet-101": 44.7, "VGG-16": 138.4, "ResNet-50": 25.6}

# Every published run used an early Horovod (0.19 or older): fusion buffer 64 MB, as its docs
# then said, and a 5 ms cycle (assumed); the same constants otherwise as any plan.
PUBLISHED_ASSUMPTIONS = Assumptions(fusion_threshold_mb=64.0, cycle_time_ms=5.0)

# Short names; docs/performance.md lists each source in full, with its link.
HOROVOD_README = "Horovod README"
HOROVOD_DOCS = "Horovod docs"
NVIDIA = "NVIDIA DLE"
DLPERF = "DLPerf"

PASCAL_ROCE = Network(25.0, 10.0, 4, 100.0, "rdma")  # 4 Pascal GPUs a server, PCIe inside
PASCAL_TCP = Network(40.0, 10.0, 4, 100.0, "tcp")
DGX1 = Network(100.0, 10.0, 8, 1000.0, "rdma")  # 8 V100 on NVLink; 100 Gb/s InfiniBand


@dataclass(frozen=True)
class Run:
    """One published point: a model at `workers` GPUs against its own single-GPU speed.

    Args:
        source: where it was published.
        setup: the hardware, as the source states it.
        model: a key of PARAMS_M.
        batch: per-GPU batch.
        single: single-GPU examples/s.
        workers: GPUs.
        efficiency: published throughput / (workers x single), or the stated efficiency.
        net: the network as stated (assumed figures are named in the docs' table).
        fp16: float16 gradients (mixed precision).
        role: `predicted`, `calibration` (sets Assumptions.jitter) or `miss`.
        note: for a miss, the effect the model lacks.
    """

    source: str
    setup: str
    model: str
    batch: int
    single: float
    workers: int
    efficiency: float
    net: Network
    fp16: bool = False
    role: str = "predicted"
    note: str = ""

    def workload(self) -> Workload:
        params = PARAMS_M[self.model] * 1e6
        return Workload(self.single, self.batch, gradient_bytes(params, self.fp16))

    def predicted(self, a: Assumptions = PUBLISHED_ASSUMPTIONS) -> float:
        return predict_one(self.workload(), self.workers, self.net, a).efficiency


_SINGLE = {"Inception V3": 134.4, "ResNet-101": 119.4, "VGG-16": 130.9}
_T16 = {"Inception V3": 2022.6, "ResNet-101": 1746.2, "VGG-16": 1787.4}
_T64 = {"Inception V3": 7932.1, "ResNet-101": 7741.6, "VGG-16": 6084.2}
_E128 = {"Inception V3": 0.90, "ResNet-101": 0.90, "VGG-16": 0.79}
_E512 = {"Inception V3": 0.90, "ResNet-101": 0.90, "VGG-16": 0.68}
_ABOVE_ONE = (
    "published above 100% of the 16-GPU table's single GPU (119.4 img/s), so that cluster's own "
    "single GPU, not published, was faster or the figure is off; no overhead model goes above "
    "100%"
)
_DLPERF_MISS = (
    "the model lacks a cost of this software stack that grows with the host count, not of the "
    "network: NGC TensorFlow 1.15 with Horovod 0.19 fell from 0.94 (1 host) to 0.88 (2) and "
    "0.82 (4 hosts), while on the same 4 hosts (one 100 Gb/s EDR adapter each) OneFlow reached "
    "11711 img/s from 384.85 on one GPU, 0.95, within 4% of the model's 0.92 for it"
)


def _efficiencies(totals: dict[str, float], workers: int) -> dict[str, float]:
    """Each model's published throughput at `workers` GPUs / (workers x its single GPU)."""
    return {m: totals[m] / (workers * single) for m, single in _SINGLE.items()}


def _horovod_runs() -> list[Run]:
    """Horovod's benchmark (batch 64 a GPU) on each published cluster, against the single GPU
    of the README's 16-GPU table: the README gives throughputs, the docs efficiencies."""
    tables = [
        (HOROVOD_README, "4 servers x 4 Pascal, 25 Gbit/s RoCE", PASCAL_ROCE, 16,
         _efficiencies(_T16, 16)),
        (HOROVOD_README, "16 servers x 4 Pascal, 40 Gbit/s TCP", PASCAL_TCP, 64,
         _efficiencies(_T64, 64)),
        (HOROVOD_DOCS, "32 servers x 4 Pascal, 25 Gbit/s RoCE", PASCAL_ROCE, 128, _E128),
        (HOROVOD_DOCS, "128 servers x 4 Pascal, 25 Gbit/s RoCE", PASCAL_ROCE, 512, _E512),
    ]  # fmt: skip
    runs = []
    for source, setup, net, workers, effs in tables:
        for m, single in _SINGLE.items():
            above_one = (m, workers) == ("ResNet-101", 64)
            miss = {"role": "miss", "note": _ABOVE_ONE} if above_one else {}
            runs.append(Run(source, setup, m, 64, single, workers, effs[m], net, **miss))
    return runs


def _resnet50_runs() -> list[Run]:
    return [
        Run(NVIDIA, "DGX-1, 8 V100, FP32 + XLA", "ResNet-50", 128, 412, 8, 3170 / (8 * 412),
            DGX1, role="calibration"),
        Run(NVIDIA, "DGX-1, 8 V100, AMP + XLA", "ResNet-50", 256, 1270, 8, 9510 / (8 * 1270),
            DGX1, fp16=True, role="calibration"),
        Run(DLPERF, "1 server x 8 V100, FP32", "ResNet-50", 128, 362.44, 8,
            2721.98 / (8 * 362.44), DGX1, role="calibration"),
        Run(DLPERF, "4 servers x 8 V100, 100 Gb/s InfiniBand, FP32", "ResNet-50", 128, 362.44,
            32, 9514.64 / (32 * 362.44), DGX1, role="miss", note=_DLPERF_MISS),
    ]  # fmt: skip


PUBLISHED: list[Run] = _horovod_runs() + _resnet50_runs()

# Not Horovod, so not a row: OneFlow on DLPerf's cluster, the evidence of the DLPerf miss's
# note that the network allows what the model predicts.
ONEFLOW_SAME_CLUSTER = Run(DLPERF, "4 servers x 8 V100, OneFlow 0.1.9", "ResNet-50", 128, 384.85,
                           32, 11711.18 / (32 * 384.85), DGX1)  # fmt: skip


def markdown_table(runs: list[Run] = PUBLISHED) -> str:
    """The table of docs/performance.md: each run, published and predicted efficiency, and
    under it, numbered, the effect the model lacks for each miss."""
    misses = [r.note for r in runs if r.role == "miss"]
    lines = [
        "| source | setup | model | batch/GPU | 1 GPU (img/s) | GPUs | published | predicted "
        "| error | role |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        pred = r.predicted()
        role = f"miss ({misses.index(r.note) + 1})" if r.role == "miss" else r.role
        lines.append(
            f"| {r.source} | {r.setup} | {r.model}{' (fp16 gradients)' if r.fp16 else ''} "
            f"| {r.batch} | {r.single:g} | {r.workers} | {r.efficiency:.3f} | {pred:.3f} "
            f"| {100 * (pred / r.efficiency - 1):+.1f}% | {role} |"
        )
    notes = [f"{i}. {note}." for i, note in enumerate(misses, 1)]
    return "\n".join([*lines, "", *notes]) + "\n"
