"""compare_peers.py's configurations on two TensorFlow stacks, interleaved run by run.

    .venv/bin/python lab/tensorflow-stacks/compare_stacks.py     # 2.15 (.venv-tf2.15) against 2.21 (.venv)
    .venv/bin/python lab/tensorflow-stacks/compare_stacks.py --stack 2.15=.venv-tf2.15/bin/python \\
        --stack 2.18=.venv-tf2.18/bin/python --workloads light --repeats 5

Each stack is a virtualenv made by `HVD_TRAIN_TF=<stack> make install`. For every repeat,
workload and configuration, each stack runs once in turn (`<its python> compare_peers.py
--repeats 1` on that one configuration), so slow drift on the machine falls on both stacks
alike. The tables: each stack's medians, then per repeat the ratio of each stack to the first
one, and each stack's 2-worker efficiency. Raw rows go to --out/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEERS = os.path.join(ROOT, "lab", "two-workers-on-two-cores", "compare_peers.py")
TF_KERAS = "/tf_keras"  # compare_peers.py's suffix: the same configuration on tf_keras


def is_failure(rows: list[dict]) -> bool:
    """compare_peers.py's rows of a failed job: one row, with its error."""
    return len(rows) == 1 and "error" in rows[0]


def job_rate(rows: list[dict]) -> float:
    """Examples/s of a job, as compare_peers.py counts it: rank 0's figure (it counts all
    workers), or the sum of independent processes' rates."""
    if len(rows) > 1 and all(r["world"] == 1 for r in rows):
        return sum(r["examples_per_sec"] for r in rows)
    return next(r for r in rows if r.get("rank", 0) == 0)["examples_per_sec"]


def save(results: list[dict], out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json.tmp"), "w") as f:
        json.dump(results, f, indent=1)
    os.replace(os.path.join(out, "results.json.tmp"), os.path.join(out, "results.json"))


# On tf_keras: the one Keras every stack has (TensorFlow 2.15 has no Keras 3).
DEFAULT_CONFIGS = ",".join(
    f"{name}{TF_KERAS}"
    for name in ("keras@1", "keras@2-independent", "hvd_train@1", "hvd_train@2", "hvd_train@2-mpi")
)


def main() -> int:
    args = parse()
    stacks = dict(s.split("=", 1) for s in args.stack)
    missing = [py for py in stacks.values() if not os.access(os.path.join(ROOT, py), os.X_OK)]
    if missing:
        sys.exit(f"no Python at {', '.join(missing)}: make that stack with HVD_TRAIN_TF=... "
                 "make install")  # fmt: skip
    rows = []
    for rep in range(args.repeats):
        for workload in args.workloads:
            for config in args.configs:
                for stack, python in stacks.items():
                    runs = run_once(python, config, workload, args)
                    for r in runs:
                        r.update(stack=stack, config=config, repeat=rep)
                    rows.extend(runs)
                    save(rows, args.out)
                    print(f"[{rep + 1}/{args.repeats}] {workload:5s} {config:22s} TF {stack:5s} "
                          f"{job_rate(runs):8.1f} examples/s", flush=True)  # fmt: skip
    report = tables(rows, list(stacks), args)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(report)
    print(report)
    return 0


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--stack", action="append", metavar="NAME=PYTHON",
                   help="a stack and its virtualenv's python, relative to the project "
                   "(default: 2.15=.venv-tf2.15/bin/python and 2.21=.venv/bin/python)")  # fmt: skip
    p.add_argument("--configs", default=DEFAULT_CONFIGS,
                   help="compare_peers.py configurations (names without /tf_keras run Keras 3, "
                   "which TensorFlow 2.15 does not have)")  # fmt: skip
    p.add_argument("--workloads", default="light,heavy")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=30, help="measured steps per run")
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "compare_stacks"))
    args = p.parse_args()
    args.stack = args.stack or ["2.15=.venv-tf2.15/bin/python", "2.21=.venv/bin/python"]
    args.configs = [c for c in args.configs.split(",") if c]
    args.workloads = [w for w in args.workloads.split(",") if w]
    return args


def run_once(python: str, config: str, workload: str, args: argparse.Namespace) -> list[dict]:
    """One compare_peers.py run of one configuration on one stack: its workers' rows."""
    with tempfile.TemporaryDirectory(prefix="compare-stacks-") as out:
        cmd = [os.path.join(ROOT, python), PEERS,
               "--configs", config, "--workloads", workload, "--repeats", "1",
               "--steps", str(args.steps), "--out", out]  # fmt: skip
        done = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
        if done.returncode != 0:
            sys.exit(f"exit {done.returncode}: {' '.join(cmd)}\n{done.stdout[-3000:]}"
                     f"{done.stderr[-3000:]}")  # fmt: skip
        with open(os.path.join(out, "results.json")) as f:
            rows = json.load(f)
        if is_failure(rows):
            sys.exit(f"{config} failed on {python}: {rows[0]['error']}")
        return rows


def tables(rows: list[dict], stacks: list[str], args: argparse.Namespace) -> str:
    rate: dict[tuple[str, str, str], list[float]] = {}
    for workload in args.workloads:
        for config in args.configs:
            for stack in stacks:
                rate[(workload, config, stack)] = [
                    job_rate(runs)
                    for rep in range(args.repeats)
                    if (runs := [r for r in rows if (r["workload"], r["config"], r["stack"],
                                                     r["repeat"]) == (workload, config, stack, rep)])
                ]  # fmt: skip
    lines = [
        f"Host: {os.uname().nodename}, {os.cpu_count()} CPUs",
        f"Command: {' '.join(sys.argv)}",
        "",
        "| workload | config | "
        + " | ".join(f"TF {s}: examples/s (median; per repeat)" for s in stacks)
        + " |",  # fmt: skip
        "|---|---|" + "---|" * len(stacks),
    ]
    for workload in args.workloads:
        for config in args.configs:
            cells = [f"{statistics.median(v):.1f} ({', '.join(f'{x:.0f}' for x in v)})"
                     for v in (rate[(workload, config, s)] for s in stacks)]  # fmt: skip
            lines.append(f"| {workload} | {config} | " + " | ".join(cells) + " |")
    lines += ["", "| workload | ratio | per repeat | median |", "|---|---|---|---:|"]

    def ratio(label: str, num: list[float], den: list[float], scale: float = 1.0) -> None:
        per = [a / b / scale for a, b in zip(num, den, strict=True)]
        if per:
            lines.append(f"| {workload} | {label} | {', '.join(f'{x:.3f}' for x in per)} | "
                         f"{statistics.median(per):.3f} |")  # fmt: skip

    first = stacks[0]
    for workload in args.workloads:
        for stack in stacks[1:]:
            for config in args.configs:
                ratio(f"{config}: TF {stack} / TF {first}", rate[(workload, config, stack)],
                      rate[(workload, config, first)])  # fmt: skip
        for stack in stacks:
            for config in args.configs:
                one = f"hvd_train@1{TF_KERAS if config.endswith(TF_KERAS) else ''}"
                if config.startswith("hvd_train@2") and one in args.configs:
                    ratio(f"TF {stack}: 2-worker efficiency ({config} / {one} / 2)",
                          rate[(workload, config, stack)], rate[(workload, one, stack)], 2)  # fmt: skip
            for k in ("", TF_KERAS):
                if {f"hvd_train@1{k}", f"keras@1{k}"} <= set(args.configs):
                    ratio(f"TF {stack}: hvd_train@1{k} / keras@1{k}",
                          rate[(workload, f"hvd_train@1{k}", stack)],
                          rate[(workload, f"keras@1{k}", stack)])  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
