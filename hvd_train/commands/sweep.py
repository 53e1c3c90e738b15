"""`hvd-train sweep`: a grid of worker counts x batch sizes, each point a real horovodrun job;
one folder with scaling.csv, scaling.md and PNG plots (the grid itself: hvd_train/launcher/sweep.py)."""

from __future__ import annotations

import argparse
import os
import shlex

from hvd_train.config import add_config_arguments, load_config
from hvd_train.launcher.sweep import (
    Point,
    SweepRun,
    add_speedups,
    read_point,
    refuse_what_this_host_cannot_run,
    run_point,
    write_reports,
)


def parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Run a scaling grid (workers x batch sizes), each point a horovodrun job on "
        "this host; write scaling.csv, scaling.md and plots into one folder.",
        epilog="Docs: docs/performance.md",
    )
    add_config_arguments(
        p, "YAML config every point starts from", "config override for every point (repeatable)"
    )
    p.add_argument("--workers", required=True, type=_int_list, help="e.g. 1,2,4")
    p.add_argument("--batch-sizes", required=True, type=_int_list, help="e.g. 32,64")
    p.add_argument("--batch-size-mode", choices=["per_worker", "global"], default="per_worker")
    p.add_argument("--out", default="runs/sweep", help="output folder (default: runs/sweep)")
    p.add_argument("--target-accuracy", type=float, default=None,
                   help="report the training time until val_accuracy first reaches this")  # fmt: skip
    p.add_argument("--pin-cores", action="store_true",
                   help="CPU: bind each worker to its own cores (runtime.bind_cores=true; "
                   "unset, points of several workers are bound anyway)")  # fmt: skip
    p.add_argument("--oversubscribe", action="store_true",
                   help="allow more workers than cores on a host without GPUs")  # fmt: skip
    p.add_argument("--timeout", type=float, default=None, help="seconds per point")
    return p


def main(argv: list[str], prog: str = "hvd-train sweep") -> int:
    args = parser(prog).parse_args(argv)
    args.command = f"{prog} {shlex.join(argv)}"
    overrides = [*args.overrides, f"train.batch_size_mode={args.batch_size_mode}"]
    if args.pin_cores:
        overrides.append("runtime.bind_cores=true")
    cfg = load_config(args.config, overrides)
    points = [Point(w, b) for b in args.batch_sizes for w in args.workers]
    refuse_what_this_host_cannot_run(cfg, points, args.oversubscribe)
    # Before anything is written: a tracking server that does not answer is one line, exit 2.
    parent = SweepRun(cfg.logging, args.out, args.command) if cfg.logging.mlflow else None
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for i, point in enumerate(points, 1):
        print(f"[sweep] {i}/{len(points)}: {point.workers} worker(s), batch {point.batch_size} "
              f"({args.batch_size_mode})", flush=True)  # fmt: skip
        run_dir = os.path.join(args.out, "points", point.name)
        status = run_point(args.config, overrides, point, run_dir, args.timeout)
        rows.append(read_point(point, run_dir, status, args.target_accuracy))
    add_speedups(rows)
    write_reports(rows, args)
    failed = [r for r in rows if r["status"] != "ok"]
    if parent:
        parent.end(args.out, ok=not failed)
    print(f"[sweep] {len(rows) - len(failed)}/{len(rows)} points done; see "
          f"{os.path.join(args.out, 'scaling.md')}", flush=True)  # fmt: skip
    return 1 if failed else 0


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return sorted(set(values))
