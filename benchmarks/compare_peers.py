"""Side-by-side throughput: plain Keras, hvd_train and MultiWorkerMirroredStrategy on one host.

    .venv/bin/python benchmarks/compare_peers.py            # 3 repeats, both workloads
    .venv/bin/python benchmarks/compare_peers.py --quick    # 1 repeat, few steps: a smoke run

Same model (convnet), data shape (32x32x3 synthetic, in memory), per-worker batch 64 and
TensorFlow threads per worker (1 intra-op thread, each worker bound to a core of its own) for:
plain Keras `model.fit` in one process; hvd_train at 1 and 2 workers (horovodrun --gloo, and
the recommended CPU settings: --mpi, with gradient accumulation for the heavy workload);
MWMS at 1 and 2 workers (TF_CONFIG, two local ports); and, unpinned on the whole machine, 2
hvd_train workers against one Keras process using all cores. Two workloads: light (~1.1 M
weights, compute-bound) and heavy (wide dense layers, ~12.4 M weights, ~50 MB of gradients a
step). The configurations run interleaved, repeat after repeat, so slow drift on the machine
spreads over all of them; the tables give medians and per-repeat ratios. Raw results (with the
load average before each run) go to --out as JSON. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "peer_worker.py")
PY = sys.executable
BIN = os.path.dirname(PY)


@dataclass(frozen=True)
class Setup:
    mode: str  # peer_worker.py --mode
    workers: int
    pinned: bool  # each worker bound to a core of its own
    threads: int = 1  # intra-op threads per worker; 0: the mode's default
    controller: str = "gloo"  # horovodrun --gloo or --mpi
    sets: tuple[str, ...] = ()  # hvd_train config overrides
    env: tuple[tuple[str, str], ...] = ()
    defaults: bool = False  # hvd_train: binding and threads as the config's defaults set them


OMPI_CHOICE = (("OMPI_MCA_coll_tuned_allreduce_algorithm", "0"),)  # 0: Open MPI's fixed rules
CONFIGS = {
    "keras@1": Setup("keras", 1, True),
    # The machine's ceiling for 2 workers: two plain Keras processes, each on a core of its
    # own, that never communicate (their rates added). What they lose against 2x keras@1 is
    # the cores' shared cache, memory and clock, which no all-reduce can win back.
    "keras@2-independent": Setup("keras", 2, True),
    "hvd_train@1": Setup("hvd_train", 1, True),
    "hvd_train@2": Setup("hvd_train", 2, True),
    "mwms@1": Setup("mwms", 1, True),
    "mwms@2": Setup("mwms", 2, True),
    "keras@all-cores": Setup("keras", 1, False, 0),  # TensorFlow's threads on all cores
    "hvd_train@2-unpinned": Setup("hvd_train", 2, False, 0),  # its default thread split
    # The recommended CPU settings (docs/performance.md): Open MPI, yielding while it waits
    # (hvd_train sets OMPI_MCA_mpi_yield_when_idle=1 under MPI on a CPU host).
    "hvd_train@2-mpi": Setup("hvd_train", 2, True, controller="mpi"),
    "hvd_train@2-mpi-accumulate4": Setup(
        "hvd_train", 2, True, controller="mpi", sets=("train.gradient_accumulation_steps=4",)
    ),
    "hvd_train@2-mpi-unpinned": Setup("hvd_train", 2, False, 0, "mpi"),
    # What `hvd-train launch --np 2` runs on a CPU host: Gloo, binding and threads left to the
    # config (runtime.bind_cores unset: bound when several workers share a host without GPUs).
    "hvd_train@2-default": Setup("hvd_train", 2, False, 0, defaults=True),
    # For the 2-worker investigation (docs/benchmarks.md), not in the default set:
    "horovod_example@1": Setup("horovod_example", 1, True, 0),
    "horovod_example@2": Setup("horovod_example", 2, True, 0),  # Horovod's example, pinned
    "horovod_example@2-mpi": Setup("horovod_example", 2, True, 0, "mpi"),  # horovodrun's default
    "horovod_example@2-mpi-yield": Setup(
        "horovod_example", 2, True, 0, "mpi", env=(("OMPI_MCA_mpi_yield_when_idle", "1"),)
    ),
    "horovod_example@2-unpinned": Setup("horovod_example", 2, False, 0),
    "hvd_train@2-timeline": Setup("hvd_train", 2, True, sets=("horovod.timeline=true",)),
    "hvd_train@2-cycle2ms": Setup("hvd_train", 2, True, sets=("horovod.cycle_time_ms=2",)),
    "hvd_train@2-cycle5ms": Setup("hvd_train", 2, True, sets=("horovod.cycle_time_ms=5",)),
    "hvd_train@2-cycle10ms": Setup("hvd_train", 2, True, sets=("horovod.cycle_time_ms=10",)),
    "hvd_train@2-fp16": Setup("hvd_train", 2, True, sets=("horovod.compression=fp16",)),
    "hvd_train@2-mpi-fp16": Setup(
        "hvd_train", 2, True, controller="mpi", sets=("horovod.compression=fp16",)
    ),
    "hvd_train@2-accumulate4": Setup(
        "hvd_train", 2, True, sets=("train.gradient_accumulation_steps=4",)
    ),
    # Agreeing on stops at every step (the default before: now about once a second).
    "hvd_train@2-check1": Setup("hvd_train", 2, True, sets=("checkpoint.check_every_steps=1",)),
    "hvd_train@2-check10": Setup("hvd_train", 2, True, sets=("checkpoint.check_every_steps=10",)),
    "hvd_train@2-mpi-check1": Setup(
        "hvd_train", 2, True, controller="mpi", sets=("checkpoint.check_every_steps=1",)
    ),
    "hvd_train@2-mpi-cycle5ms": Setup(
        "hvd_train", 2, True, controller="mpi", sets=("horovod.cycle_time_ms=5",)
    ),
    # Tensor fusion off: each gradient all-reduced in place, no copy into and out of the buffer.
    "hvd_train@2-mpi-nofusion": Setup(
        "hvd_train", 2, True, controller="mpi", sets=("horovod.fusion_threshold_mb=0",)
    ),
    # Open MPI's own all-reduce choice, not the ring hvd_train sets for a job on one CPU host.
    "hvd_train@2-mpi-ompi-choice": Setup("hvd_train", 2, True, controller="mpi", env=OMPI_CHOICE),
    "hvd_train@2-mpi-cycle10ms": Setup(
        "hvd_train", 2, True, controller="mpi", sets=("horovod.cycle_time_ms=10",)
    ),
}
DEFAULT = list(CONFIGS)[:12]


def main() -> int:
    args = parse()
    configs = args.configs or DEFAULT
    if args.report:  # the tables again, from a finished run's results.json
        with open(args.report) as f:
            print(tables(json.load(f), args))
        return 0
    results = []
    for rep in range(args.repeats):
        for workload in args.workloads:
            for name in configs:
                busy = wait_for_quiet(args.wait_quiet, args.wait_max) if args.wait_quiet else None
                load = os.getloadavg()[0]
                rows = launch(name, workload, args)
                for r in rows:
                    r.update(config=name, repeat=rep, load_before=load, busy_before=busy)
                results.extend(rows)
                save(results, args.out)  # as it goes: a long run can be read while it runs
                quiet = f", busy {100 * busy:.0f}% before" if busy is not None else ""
                print(f"[{rep + 1}/{args.repeats}] {workload:5s} {name:26s} "
                      f"{job_rate(rows):8.1f} examples/s  (load {load:.1f}{quiet})", flush=True)  # fmt: skip
    report = tables(results, args)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(report)
    print(report)
    return 0


def save(results: list[dict], out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json.tmp"), "w") as f:
        json.dump(results, f, indent=1)
    os.replace(os.path.join(out, "results.json.tmp"), os.path.join(out, "results.json"))


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 repeat, 5 warm-up + 15 measured steps")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=40, help="measured steps per run")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--workloads", default="light,heavy")
    p.add_argument("--configs", default="", help=f"comma list of: {', '.join(CONFIGS)}")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   help="extra hvd_train config override, e.g. horovod.compression=fp16")  # fmt: skip
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "compare_peers"))
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="SHARE",
                   help="before each run, wait until the CPUs are busy less than this share "
                   "(e.g. 0.1) over 3 s; for a machine shared with other jobs")  # fmt: skip
    p.add_argument("--wait-max", type=float, default=1800, help="seconds to wait for quiet")
    p.add_argument("--report", metavar="RESULTS_JSON",
                   help="print the tables of a finished run (with its --configs, --workloads "
                   "and --repeats) instead of running")  # fmt: skip
    args = p.parse_args()
    if args.quick:
        args.repeats, args.steps, args.warmup = 1, 15, 5
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown:
        p.error(f"unknown config(s) {unknown}; known: {', '.join(CONFIGS)}")
    return args


# --------------------------------------------------------------------------- launching


def launch(name: str, workload: str, args: argparse.Namespace) -> list[dict]:
    setup = CONFIGS[name]
    mode, workers, pinned, threads = setup.mode, setup.workers, setup.pinned, setup.threads
    results = tempfile.mkdtemp(prefix="compare-peers-")
    base = [PY, WORKER, "--mode", mode, "--workload", workload, "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--threads", str(threads), "--result-dir", results]  # fmt: skip
    base += ["--pin"] if pinned else []
    base += ["--config-defaults"] if setup.defaults else []
    if mode == "hvd_train":
        base += [a for s in [*args.overrides, *setup.sets] for a in ("--set", s)]
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2",
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **dict(setup.env)}  # fmt: skip
    if mode in ("hvd_train", "horovod_example"):
        cmd = [os.path.join(BIN, "horovodrun"), "-np", str(workers), "-H",
               f"localhost:{workers}", f"--{setup.controller}", *base]  # fmt: skip
        return collect([start(cmd, env)], args.timeout, results)
    if mode == "mwms":
        ports = free_ports(workers)
        procs = []
        for i in range(workers):
            tf_config = {"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                         "task": {"type": "worker", "index": i}}  # fmt: skip
            cmd = [*base, "--core", str(i)] if pinned else base
            procs.append(start(cmd, {**env, "TF_CONFIG": json.dumps(tf_config),
                                     "MWMS_INDEX": str(i)}))  # fmt: skip
        return collect(procs, args.timeout, results)
    # keras: one process, or `workers` independent ones that start measuring together
    barrier = {"PEER_BARRIER": results, "PEER_COUNT": str(workers)} if workers > 1 else {}
    cmds = [[*base, "--core", str(i)] if pinned else base for i in range(workers)]
    procs = [start(cmd, {**env, **barrier, "PEER_INDEX": str(i)}) for i, cmd in enumerate(cmds)]
    return collect(procs, args.timeout, results)


def start(cmd: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def collect(procs: list[subprocess.Popen], timeout: float, results: str) -> list[dict]:
    """Every worker's result file; raises with the processes' output on failure."""
    deadline = time.monotonic() + timeout
    outputs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            raise SystemExit(f"timed out after {timeout} s: {' '.join(procs[0].args)}") from None
        outputs.append(out)
        if proc.returncode != 0:
            raise SystemExit(f"exit {proc.returncode}: {' '.join(proc.args)}\n{out[-5000:]}")
    rows = []
    for name in sorted(n for n in os.listdir(results) if n.startswith("result-")):
        with open(os.path.join(results, name)) as f:
            rows.append(json.load(f))
    shutil.rmtree(results)
    if not rows:
        raise SystemExit("no results:\n" + "\n".join(o[-3000:] for o in outputs))
    return rows


def cpu_busy(seconds: float = 3.0) -> float:
    """The share of all CPUs' time spent busy over `seconds` (from /proc/stat)."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]  # total, idle + iowait

    t0, i0 = sample()
    time.sleep(seconds)
    t1, i1 = sample()
    return 1 - (i1 - i0) / max(1, t1 - t0)


def wait_for_quiet(share: float, max_wait: float) -> float:
    """Waits (up to `max_wait` s) until the machine is busy less than `share`; returns it."""
    deadline = time.monotonic() + max_wait
    busy = cpu_busy()
    while busy > share and time.monotonic() < deadline:
        busy = cpu_busy()
    return busy


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


# --------------------------------------------------------------------------- reporting


def job_rate(rows: list[dict]) -> float:
    """Examples/s of a job: rank 0's figure (it counts all workers), or the sum of
    independent processes' rates."""
    if len(rows) > 1 and all(r["world"] == 1 for r in rows):
        return sum(r["examples_per_sec"] for r in rows)
    return next(r for r in rows if r.get("rank", 0) == 0)["examples_per_sec"]


def tables(results: list[dict], args: argparse.Namespace) -> str:
    runs: dict[tuple[str, str, int], list[dict]] = {}
    for r in results:
        runs.setdefault((r["workload"], r["config"], r["repeat"]), []).append(r)
    loads = [r["load_before"] for r in results]
    busy = [r["busy_before"] for r in results if r.get("busy_before") is not None]
    quiet = f"; CPUs busy {100 * min(busy):.0f}-{100 * max(busy):.0f}% just before" if busy else ""
    shared = busy and max(busy) > 0.15  # measured with --wait-quiet: other jobs were running
    lines = [
        f"Host: {os.uname().nodename}, {os.cpu_count()} CPUs; load average before runs "
        f"{min(loads):.1f}-{max(loads):.1f} (it counts this benchmark's own last run){quiet}"
        + (" (shared machine: numbers are noisy)" if shared else ""),
        f"Command: {' '.join(sys.argv)}",
        "",
        "| workload | config | examples/s (median) | per repeat | step ms | peak RSS/worker MB "
        "| CPU ms/step (TF, Horovod) | run-queue wait ms/step |",
        "|---|---|---:|---|---:|---:|---|---:|",
    ]
    rate: dict[tuple[str, str], list[float]] = {}
    for workload in args.workloads:
        for name in args.configs or DEFAULT:
            reps = [
                runs[(workload, name, i)]
                for i in range(args.repeats)
                if (workload, name, i) in runs
            ]
            if not reps:
                continue
            rates = [job_rate(rows) for rows in reps]
            rate[(workload, name)] = rates
            last = reps[-1]
            rss = max(r["peak_rss_mb"] for rows in reps for r in rows)
            step = statistics.median(r["step_ms_median"] for rows in reps for r in rows)
            th = [r["threads"] for rows in reps for r in rows]
            tf_cpu = statistics.median(t["tensorflow"]["cpu_ms_per_step"] for t in th)
            hv = [t["horovod"]["cpu_ms_per_step"] for t in th if "horovod" in t]
            wait = statistics.median(t["tensorflow"]["runqueue_wait_ms_per_step"] for t in th)
            hv_cpu = f"{statistics.median(hv):.1f}" if hv else "-"
            lines.append(
                f"| {workload} | {name} ({len(last)} proc) | {statistics.median(rates):.1f} | "
                f"{', '.join(f'{x:.0f}' for x in rates)} | {step:.1f} | {rss:.0f} | "
                f"{tf_cpu:.1f}, {hv_cpu} | {wait:.1f} |"
            )
    lines += ["", "| workload | ratio | per repeat | median | target |", "|---|---|---|---:|---|"]
    for workload in args.workloads:
        for label, num, den, scale, target in ratios(args.configs or DEFAULT):
            if (workload, num) in rate and (workload, den) in rate:
                per = [a / b / scale for a, b in zip(rate[(workload, num)], rate[(workload, den)],
                                                     strict=False)]  # fmt: skip
                lines.append(f"| {workload} | {label} | {', '.join(f'{x:.3f}' for x in per)} | "
                             f"{statistics.median(per):.3f} | {target} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def ratios(configs: list[str]) -> list[tuple[str, str, str, int, str]]:
    """(label, numerator, denominator, divide by, the target) for the configs run:
    every 2-worker hvd_train variant against hvd_train@1, MWMS and one all-cores process."""
    rows = [
        ("hvd_train@1 / keras@1", "hvd_train@1", "keras@1", 1, ">= 0.98"),
        ("the machine's ceiling: keras@2-independent / keras@1 / 2", "keras@2-independent",
         "keras@1", 2, "-"),
    ]  # fmt: skip
    for name in configs:
        setup = CONFIGS[name]
        if setup.mode != "hvd_train" or setup.workers != 2:
            continue
        if setup.pinned:
            rows += [
                (f"2-worker efficiency ({name} / hvd_train@1 / 2)", name, "hvd_train@1", 2,
                 ">= 0.95 light, >= 0.85 heavy"),
                (f"{name} / mwms@2", name, "mwms@2", 1, ">= 1.3"),
                (f"{name} / keras@2-independent", name, "keras@2-independent", 1, "-"),
            ]  # fmt: skip
        else:
            rows.append((f"unpinned: {name} / keras@all-cores", name, "keras@all-cores", 1,
                         ">= 1.2, or say CPU is not worth it"))  # fmt: skip
    rows += [
        ("mwms 2-worker efficiency", "mwms@2", "mwms@1", 2, "-"),
        ("Horovod example@2 / hvd_train@2", "horovod_example@2", "hvd_train@2", 1, "-"),
    ]
    return rows


if __name__ == "__main__":
    sys.exit(main())
