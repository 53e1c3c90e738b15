"""Two settings of one worker, side by side: `hvd-train launch --np 1` with the overrides of A on
one core and of B on the other, at the same time, then swapped, so that both see the same
moment of a shared machine and each core once. Prints B's rate over A's for each run and, per
swapped pair, their geometric mean (the two cores' difference cancels).

    .venv/bin/python lab/two-workers-on-two-cores/side_by_side.py --b runtime.inter_op_threads=2
    .venv/bin/python lab/two-workers-on-two-cores/side_by_side.py --a runtime.inter_op_threads=2 \
        --b runtime.inter_op_threads=1 --workloads light,heavy --pairs 3
    .venv/bin/python lab/two-workers-on-two-cores/side_by_side.py --plain a    # one worker / a plain Keras 3 fit

The workloads are compare_peers.py's (convnet on synthetic 32x32x3 images, batch 64, SGD); a
run's rate is its summary.json's `train_examples_per_sec` (the first epoch left out). With
`--plain a` (or b) that side is a plain Keras 3 `fit` of the same workload on its core instead
(compare_peers.py's keras@1: one intra-op thread, two epochs, the second timed from its start,
as summary.json times a launch, and begun when the launch's first epoch has ended). Needs two
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
import time

from compare_peers import (  # beside this file: a script's folder is on sys.path
    launch_command,
    launch_sets,
    worker_command,
)

BIN = os.path.dirname(sys.executable)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--a", action="append", default=[], help="an override of A (repeatable)")
    p.add_argument("--b", action="append", default=[], help="an override of B (repeatable)")
    p.add_argument("--plain", choices=["a", "b"], default=None,
                   help="that side is a plain Keras 3 fit, not `hvd-train launch --np 1`")  # fmt: skip
    p.add_argument("--workloads", default="light,heavy")
    p.add_argument("--pairs", type=int, default=3, help="swapped pairs of runs per workload")
    p.add_argument("--steps", type=int, default=150, help="steps an epoch (2 epochs a run)")
    return p.parse_args()


def command(core: int, workload: str, steps: int, run_dir: str, sets: list[str], plain: bool):
    """One worker on `core`: `hvd-train launch --np 1` (its summary.json in `run_dir`), or a
    plain Keras 3 fit (its result-0.json there)."""
    if plain:  # compare_peers' keras@1 beside a launch
        fit = worker_command("keras", "keras", workload, steps, 1, run_dir)
        return [*fit, "--pin", "--core", str(core), "--warmup-epoch"]
    with open(run_dir + ".yaml", "w") as f:
        f.write("{}\n")  # every key as --set
    sets = [*launch_sets(run_dir, workload, steps, 1), *sets]
    return launch_command(1, run_dir + ".yaml", sets, core=core)


def epochs_done(metrics: str) -> int:
    try:
        with open(metrics) as f:
            return max(sum(1 for _ in f) - 1, 0)  # the header
    except FileNotFoundError:
        return 0


def rate(run_dir: str, plain: bool) -> float:
    if plain:
        with open(os.path.join(run_dir, "result-0.json")) as f:
            return json.load(f)["examples_per_sec"]
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)["train_examples_per_sec"]


def side_by_side(
    workload: str, steps: int, a: list[str], b: list[str], a_core: int, plain: str | None
) -> float:
    """B's rate over A's, A on core `a_core` and B on the other, at once."""
    top = tempfile.mkdtemp(prefix="side-by-side-")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "TF_CPP_MIN_LOG_LEVEL": "2"}  # fmt: skip
    try:
        # A plain fit starts sooner than a launch: it begins its timed epoch when the launch's
        # first has ended (metrics.csv has its row), so that both time the same seconds.
        barrier = os.path.join(top, "barrier")
        os.makedirs(barrier)
        runs = {}
        for name, core, sets in (("a", a_core, a), ("b", 1 - a_core, b)):
            run_dir = os.path.join(top, name)
            os.makedirs(run_dir)
            cmd = command(core, workload, steps, run_dir, sets, plain == name)
            waits = {"PEER_BARRIER": barrier, "PEER_COUNT": "2", "PEER_INDEX": "0"}
            runs[name] = (run_dir, subprocess.Popen(
                cmd, env={**env, **waits} if plain == name else env,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))  # fmt: skip
        if plain:
            launch_dir, launch = runs["b" if plain == "a" else "a"]
            metrics = os.path.join(launch_dir, "metrics.csv")
            while launch.poll() is None and not epochs_done(metrics):
                time.sleep(0.005)
            open(os.path.join(barrier, "ready-1"), "w").close()
        rates = {}
        for name, (run_dir, proc) in runs.items():
            _, err = proc.communicate()
            if proc.returncode != 0:
                sys.exit(f"{name} failed (exit code {proc.returncode}):\n{err[-3000:]}")
            rates[name] = rate(run_dir, plain == name)
        print(f"  {workload}: A on core {a_core} {rates['a']:.1f}, B on core {1 - a_core} "
              f"{rates['b']:.1f} examples/s, B/A {rates['b'] / rates['a']:.4f}", flush=True)  # fmt: skip
        return rates["b"] / rates["a"]
    finally:
        shutil.rmtree(top, ignore_errors=True)


def main() -> int:
    args = parse()
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("side_by_side.py needs two cores")

    def said(side: str, sets: list[str]) -> str:
        return "a plain Keras 3 fit" if args.plain == side else " ".join(sets) or "the defaults"

    print(f"A: {said('a', args.a)}; B: {said('b', args.b)}")
    for workload in [w for w in args.workloads.split(",") if w]:
        pairs = []
        for _ in range(args.pairs):
            ratios = [side_by_side(workload, args.steps, args.a, args.b, core, args.plain)
                      for core in (0, 1)]  # fmt: skip
            pairs.append(math.sqrt(ratios[0] * ratios[1]))
        listed = ", ".join(f"{r:.3f}" for r in pairs)
        print(f"{workload}: B/A per swapped pair {listed}; median {statistics.median(pairs):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
