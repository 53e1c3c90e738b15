"""Where a training step's CPU goes: one worker, two independent processes, two workers.

    .venv/bin/python lab/two-workers-on-two-cores/profile_step.py --workload heavy
    .venv/bin/python lab/two-workers-on-two-cores/profile_step.py --workload light \
        --configs keras@1,keras@2-independent,launch@1,launch@2

Each configuration (compare_peers.py's, run by it: its one worker, the machine's ceiling, the
default launch) runs alone, once, for --steps steps; after --delay seconds, when its steps run
steadily, `perf record -a` samples both cores for --seconds. Every sample is put in one
category by the code it was in (TensorFlow's JIT-compiled oneDNN kernels, the rest of
TensorFlow, Python, libc, Horovod and Open MPI, the kernel), and a category's share of the
samples times the configuration's step time gives its milliseconds of a worker's step (each
worker has a core of its own and keeps it busy). The columns side by side say what the second
worker and the all-reduce add to a step, and where. Needs `perf` (Debian: linux-perf) and the
permission to sample every CPU (root, or kernel.perf_event_paranoid <= 0). Not part of the
test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable

CATEGORIES = [
    "TensorFlow: oneDNN's kernels (JIT)",
    "TensorFlow: other ops and the executor",
    "Python",
    "libc (memcpy, malloc)",
    "Horovod and Open MPI",
    "the kernel (page faults, scheduling, syscalls)",
    "other",
]
# Threads that are not the job's: the idle loop, perf itself, the kernel's workers.
NOT_THE_JOB = ("swapper", "perf", "kdamond", "kworker", "ksoftirqd", "rcu_")


def category(dso: str) -> str:
    if dso.startswith("[JIT]"):
        return CATEGORIES[0]
    if "libtensorflow" in dso or "_pywrap" in dso:
        return CATEGORIES[1]
    # Before Python's: Horovod's library is named mpi_lib.cpython-311-...so.
    if "mpi_lib" in dso or "mca_" in dso or "libmpi" in dso or "libopen-" in dso:
        return CATEGORIES[4]
    if "python" in dso:
        return CATEGORIES[2]
    if dso.startswith("libc.so") or dso.startswith("libc-"):
        return CATEGORIES[3]
    if "kernel" in dso:
        return CATEGORIES[5]
    return CATEGORIES[6]


def categorize(data: str) -> Counter:
    report = ["perf", "report", "-i", data, "--no-children", "--sort", "comm,dso", "-q", "-n"]
    out = subprocess.run(report, capture_output=True, text=True, check=True).stdout
    samples: Counter = Counter()
    for line in out.splitlines():
        m = re.match(r"\s*[\d.]+%\s+(\d+)\s+(\S+)\s+(.*)$", line)
        if m and not m.group(2).startswith(NOT_THE_JOB):
            samples[category(m.group(3).strip())] += int(m.group(1))
    return samples


def step_ms(results: str) -> float:
    """The configuration's step time: the launch's summary.json median, or the Keras
    processes' measured median (their mean, for two independent ones)."""
    with open(results) as f:
        rows = json.load(f)
    ms = [r.get("summary_step_ms") or r.get("step_ms_median") for r in rows]
    if not ms or None in ms:
        sys.exit(f"profile_step: no step time in {results}: {rows[:1]}")
    return sum(ms) / len(ms)


def profile(config: str, args: argparse.Namespace, tmp: str) -> tuple[Counter, float]:
    out = os.path.join(tmp, config.replace("@", "-"))
    data = out + ".data"
    run = [PY, os.path.join(HERE, "compare_peers.py"), "--configs", config, "--workloads",
           args.workload, "--steps", str(args.steps), "--repeats", "1", "--out", out]  # fmt: skip
    job = subprocess.Popen(run, stdout=subprocess.DEVNULL)
    time.sleep(args.delay)
    record = ["perf", "record", "-o", data, "-F", str(args.frequency), "-a", "--", "sleep",
              str(args.seconds)]  # fmt: skip
    subprocess.run(record, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    if job.wait() != 0:
        sys.exit(f"profile_step: {config} failed (exit {job.returncode})")
    return categorize(data), step_ms(os.path.join(out, "results.json"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workload", default="heavy", choices=["light", "heavy"])
    p.add_argument("--configs", default="keras@1,keras@2-independent,launch@1,launch@2")
    p.add_argument("--steps", type=int, default=600, help="measured steps of each run")
    p.add_argument("--delay", type=float, default=20.0, help="seconds before sampling starts")
    p.add_argument("--seconds", type=float, default=10.0, help="seconds sampled")
    p.add_argument("--frequency", type=int, default=499, help="samples a second on each CPU")
    p.add_argument(
        "--keep",
        metavar="DIR",
        help="keep each configuration's perf.data and results here (for perf report)",
    )
    args = p.parse_args()
    if shutil.which("perf") is None:
        print("profile_step: needs perf (Debian: apt-get install linux-perf)", file=sys.stderr)
        return 2
    configs = [c for c in args.configs.split(",") if c]
    columns = {}
    with tempfile.TemporaryDirectory(prefix="profile_step-") as tmp:
        if args.keep:
            os.makedirs(args.keep, exist_ok=True)
            tmp = args.keep
        for config in configs:
            samples, ms = profile(config, args, tmp)
            total = sum(samples.values())
            columns[config] = ({k: ms * samples[k] / total for k in CATEGORIES}, ms)
            print(f"{config}: step {ms:.1f} ms, {total} samples", flush=True)
    print(
        f"\nCPU ms of a worker's step, {args.workload} workload (a category's share of the "
        "samples x the step time)\n"
    )
    print("| category | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for k in CATEGORIES:
        print(f"| {k} | " + " | ".join(f"{c[0][k]:.1f}" for c in columns.values()) + " |")
    print("| step | " + " | ".join(f"{c[1]:.1f}" for c in columns.values()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
