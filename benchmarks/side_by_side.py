"""Two settings of one worker, side by side: `hvd-train launch --np 1` with the overrides of A on
one core and of B on the other, at the same time, then swapped, so that both see the same
moment of a shared machine and each core once. Prints B's rate over A's for each run and, per
swapped pair, their geometric mean (the two cores' difference cancels).

    .venv/bin/python benchmarks/side_by_side.py --b runtime.inter_op_threads=2
    .venv/bin/python benchmarks/side_by_side.py --a runtime.inter_op_threads=2 \
        --b runtime.inter_op_threads=1 --workloads light,heavy --pairs 3

The workloads are compare_peers.py's (convnet on synthetic 32x32x3 images, batch 64, SGD); a
run's rate is its summary.json's `train_examples_per_sec` (the first epoch left out). Needs two
cores. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from compare_peers import launch_sets  # noqa: E402  (beside this file)

BIN = os.path.dirname(sys.executable)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--a", action="append", default=[], help="an override of A (repeatable)")
    p.add_argument("--b", action="append", default=[], help="an override of B (repeatable)")
    p.add_argument("--workloads", default="light,heavy")
    p.add_argument("--pairs", type=int, default=3, help="swapped pairs of runs per workload")
    p.add_argument("--steps", type=int, default=150, help="steps an epoch (2 epochs a run)")
    return p.parse_args()


def command(core: int, workload: str, steps: int, run_dir: str, sets: list[str]) -> list[str]:
    sets = [*launch_sets(run_dir, workload, steps, 1), *sets]
    return ["taskset", "-c", str(core), os.path.join(BIN, "hvd-train"), "launch", "--np", "1",
            "--config", os.path.join(run_dir + ".yaml"), *(a for s in sets for a in ("--set", s))]  # fmt: skip


def side_by_side(workload: str, steps: int, a: list[str], b: list[str], a_core: int) -> float:
    """B's rate over A's, A on core `a_core` and B on the other, at once."""
    top = tempfile.mkdtemp(prefix="side-by-side-")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "TF_CPP_MIN_LOG_LEVEL": "2"}  # fmt: skip
    try:
        runs = {}
        for name, core, sets in (("a", a_core, a), ("b", 1 - a_core, b)):
            run_dir = os.path.join(top, name)
            with open(run_dir + ".yaml", "w") as f:
                f.write("{}\n")  # every key as --set
            cmd = command(core, workload, steps, run_dir, sets)
            runs[name] = (run_dir, subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                                    stderr=subprocess.PIPE, text=True))  # fmt: skip
        rates = {}
        for name, (run_dir, proc) in runs.items():
            _, err = proc.communicate()
            if proc.returncode != 0:
                sys.exit(f"{name} failed (exit code {proc.returncode}):\n{err[-3000:]}")
            with open(os.path.join(run_dir, "summary.json")) as f:
                rates[name] = json.load(f)["train_examples_per_sec"]
        print(f"  {workload}: A on core {a_core} {rates['a']:.1f}, B on core {1 - a_core} "
              f"{rates['b']:.1f} examples/s, B/A {rates['b'] / rates['a']:.4f}", flush=True)  # fmt: skip
        return rates["b"] / rates["a"]
    finally:
        shutil.rmtree(top, ignore_errors=True)


def main() -> int:
    args = parse()
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("side_by_side.py needs two cores")
    print(f"A: {' '.join(args.a) or 'the defaults'}; B: {' '.join(args.b) or 'the defaults'}")
    for workload in [w for w in args.workloads.split(",") if w]:
        pairs = []
        for _ in range(args.pairs):
            ratios = [side_by_side(workload, args.steps, args.a, args.b, core) for core in (0, 1)]
            pairs.append(math.sqrt(ratios[0] * ratios[1]))
        listed = ", ".join(f"{r:.3f}" for r in pairs)
        print(f"{workload}: B/A per swapped pair {listed}; median {statistics.median(pairs):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
