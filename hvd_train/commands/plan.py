"""`hvd-train plan`: predicted throughput, efficiency and time per epoch at 1..N workers."""

from __future__ import annotations

import argparse


def parser(prog: str) -> argparse.ArgumentParser:
    from hvd_train.launcher.throughput_model import LINK_EFFICIENCY, Assumptions, Network

    p = argparse.ArgumentParser(
        prog=prog,
        description="Predict throughput, scaling efficiency and time per epoch at 1, 2, 4, ... "
        "workers under Horovod's ring all-reduce, from a finished 1-worker run or from "
        "explicit numbers, and the network. Prints the assumptions under the table.",
        epilog="Docs: docs/performance.md (the model, and its check against published runs)",
    )
    src = p.add_argument_group("the workload: --run, or --throughput, --params and --batch")
    src.add_argument("--run", metavar="RUN_DIR", help="a finished 1-worker run.dir")
    src.add_argument("--throughput", type=float, help="one worker's examples/s")
    src.add_argument("--params", type=float, help="trainable parameters (e.g. 25.6e6)")
    src.add_argument("--batch", type=int, help="examples per worker per step")
    src.add_argument(
        "--examples-per-epoch", type=int, metavar="N",
        help="for the time per epoch (default: the run's; without a run, not shown)",
    )  # fmt: skip
    src.add_argument("--fp16", action="store_true", help="float16 gradients: 2 bytes each")
    d, a = Network(), Assumptions()
    net = p.add_argument_group("the network")
    for flag, kind, field, what in (
        ("--bandwidth-gbit", float, "bandwidth_gbit", "each host's link, Gbit/s"),
        ("--latency-us", float, "latency_us", "one network hop, microseconds"),
        ("--gpus-per-host", int, "gpus_per_host", "workers per host, sharing its link"),
        ("--intra-host-bandwidth-gbit", float, "intra_host_bandwidth_gbit",
         "between the workers of a host (NVLink, PCIe), Gbit/s"),
    ):  # fmt: skip
        default = getattr(d, field)
        net.add_argument(flag, type=kind, default=default, help=f"{what} (default {default:g})")
    net.add_argument(
        "--transport", choices=sorted(LINK_EFFICIENCY), default=d.transport,
        help=f"usable share of the line rate: {LINK_EFFICIENCY} (default {d.transport})",
    )  # fmt: skip
    p.add_argument("--workers", metavar="N,N,...", help="worker counts (default 1,2,4,...,512)")
    p.add_argument(
        "--fusion-threshold-mb", type=float,
        help=f"HOROVOD_FUSION_THRESHOLD in MB (default {a.fusion_threshold_mb:g})",
    )  # fmt: skip
    p.add_argument(
        "--cycle-time-ms", type=float,
        help=f"HOROVOD_CYCLE_TIME in ms (default {a.cycle_time_ms:g})",
    )  # fmt: skip
    p.add_argument(
        "--published", action="store_true",
        help="print the check against published runs (the table of docs/performance.md)",
    )  # fmt: skip
    return p


def main(argv: list[str], prog: str) -> int:
    args = parser(prog).parse_args(argv)
    if args.published:
        from hvd_train.launcher.published_scaling import markdown_table

        print(markdown_table(), end="")
        return 0
    from hvd_train.launcher import throughput_model as tm  # the scaling model

    net = tm.Network(args.bandwidth_gbit, args.latency_us, args.gpus_per_host,
                     args.intra_host_bandwidth_gbit, args.transport)  # fmt: skip
    tm.check_network(net)
    a = tm.with_fusion(tm.Assumptions(), args.fusion_threshold_mb, args.cycle_time_ms)
    stated = tm.StatedWorkload(args.throughput, args.params, args.batch)
    w = tm.workload(args.run, stated, args.fp16, args.examples_per_epoch)
    workers = tm.parse_workers(args.workers) if args.workers else tm.default_workers()
    print(tm.format_table(tm.predict(w, workers, net, a)))
    print(tm.describe(w, net, a))
    return 0
