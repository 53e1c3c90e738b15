"""Side-by-side throughput: plain Keras, hvd_train, Horovod's Keras example and
MultiWorkerMirroredStrategy on one host, each on Keras 3 and on tf_keras (Keras 2).

    .venv/bin/python lab/two-workers-on-two-cores/compare_peers.py            # 3 repeats, both workloads
    .venv/bin/python lab/two-workers-on-two-cores/compare_peers.py --quick    # 1 repeat, few steps: a smoke run
    .venv/bin/python lab/two-workers-on-two-cores/compare_peers.py --launch   # `hvd-train launch --np N` itself

The launch mode (--launch) runs the default launch as a user runs it, `hvd-train launch --np 2`
(on a CPU host: Open MPI, each worker bound to its own core) and with --gloo, against one
worker (`taskset -c 0 hvd-train launch --np 1`), a plain Keras fit on one core, the
machine's ceiling (two independent Keras processes) and the project's own (two one-worker
launches at once, one per core, which never communicate: what a second busy core costs one
worker, with no all-reduce), interleaved, medians of the repeats; a
launch's rate is its summary.json's `train_examples_per_sec` (the first epoch left out), and
beside a launch the plain Keras fits are timed the same way: two epochs of `--steps`, the
second timed from its start (else: `--steps` after `--warmup` steps).

Same model (convnet), data shape (32x32x3 synthetic, in memory), per-worker batch 64, SGD with
momentum, the loss and accuracy, and TensorFlow threads per worker (1 intra-op thread, each
worker bound to a core of its own) for: plain Keras `model.fit` in one process; hvd_train at 1
and 2 workers (horovodrun --gloo, and the recommended CPU settings: --mpi, with gradient
accumulation for the heavy workload); Horovod's Keras example; MWMS at 1 and 2 workers
(TF_CONFIG, two local ports); and, unpinned on the whole machine, 2 hvd_train workers against
one Keras process using all cores. A configuration's name says its Keras: `keras@1` is Keras 3
(`import keras`; hvd_train's `runtime.keras: keras`), `keras@1/tf_keras` the same on tf_keras.
Two workloads: light (~1.1 M weights, compute-bound) and heavy (wide dense layers, ~12.4 M
weights, ~50 MB of gradients a step). The configurations run interleaved, repeat after repeat,
so slow drift on the machine spreads over all of them; the tables give medians and per-repeat
ratios, and each of the Keras 3 speed targets met or missed. A peer that fails (Horovod's
example and MWMS on Keras 3) gets a row with its error in one line, and is not run again for
that workload. Raw results (with the load before each run) go to --out as JSON. Not part of
the test suite.
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
from collections.abc import Callable
from dataclasses import dataclass, replace

from peer_worker import WORKLOADS  # beside this file: a script's folder is on sys.path

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # the repository, two folders up
WORKER = os.path.join(HERE, "peer_worker.py")
PY = sys.executable
BIN = os.path.dirname(PY)


@dataclass(frozen=True)
class Setup:
    mode: str  # peer_worker.py --mode
    workers: int
    pinned: bool  # each worker bound to a core of its own
    threads: int = 1  # intra-op threads per worker; 0: the mode's default
    controller: str = "gloo"  # horovodrun --gloo or --mpi; launch: "" leaves it to the launcher
    sets: tuple[str, ...] = ()  # hvd_train config overrides
    env: tuple[tuple[str, str], ...] = ()
    defaults: bool = False  # hvd_train: binding and threads as the config's defaults set them
    keras: str = "keras"  # peer_worker.py --keras: keras (Keras 3) or tf_keras (Keras 2)


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
    # What `hvd-train launch --np 2` runs on a CPU host: Gloo, binding and threads left to the
    # config (runtime.bind_cores unset: bound when several workers share a host without GPUs).
    "hvd_train@2-default": Setup("hvd_train", 2, False, 0, defaults=True),
    "horovod_example@2": Setup("horovod_example", 2, True, 0),  # Horovod's example, pinned
    # Open MPI's own all-reduce choice, not the ring hvd_train sets for a job on one CPU host.
    "hvd_train@2-mpi-ompi-choice": Setup("hvd_train", 2, True, controller="mpi", env=OMPI_CHOICE),
    # `hvd-train launch --np N`, as a user runs it (the launch mode, --launch): the controller
    # and the binding are the launcher's defaults (on this CPU host: Open MPI, each worker bound
    # to a core of its own). One worker is started under `taskset` on one core, the baseline
    # of "twice one worker".
    "launch@1": Setup("launch", 1, True, 0, ""),
    "launch@2": Setup("launch", 2, False, 0, ""),
    # Two one-worker launches at once, each on a core of its own, that never communicate:
    # the project's own ceiling for 2 workers (what the second core costs its one worker).
    "launch@1-independent": Setup("launch", 2, True, 0, ""),
    "launch@2-gloo": Setup("launch", 2, False, 0, "gloo"),
    # Horovod as upstream 0.28.1 runs it: its background thread waking every cycle (not asleep
    # until a tensor is queued, patches/horovod-0.28.1 0012) and the all-reduce on the
    # controller's own transport (not in shared memory, 0013).
    "launch@2-as-upstream": Setup(
        "launch",
        2,
        False,
        0,
        "",
        env=(("HOROVOD_IDLE_CYCLE_TIME", "0"), ("HOROVOD_SHM_ALLREDUCE", "0")),
    ),
}
TF_KERAS = "/tf_keras"  # a name's suffix: the same configuration on tf_keras (Keras 2)
# The Keras 3 comparison: each Keras alone, hvd_train at 1 and 2 pinned workers (Gloo, and the
# recommended --mpi), the machine's ceiling, and the peers, on Keras 3 and on tf_keras.
DEFAULT = [
    "keras@1", "keras@2-independent", "hvd_train@1", "hvd_train@2", "hvd_train@2-mpi",
    "horovod_example@2", "mwms@2",
    "keras@1/tf_keras", "hvd_train@1/tf_keras", "hvd_train@2/tf_keras", "hvd_train@2-mpi/tf_keras",
    "horovod_example@2/tf_keras", "mwms@2/tf_keras",
]  # fmt: skip


# The launch mode (--launch): the default launch against twice its own one worker, the
# machine's ceiling and the project's own, and one worker against a plain Keras fit.
LAUNCH = ["keras@1", "keras@2-independent", "launch@1", "launch@1-independent", "launch@2",
          "launch@2-gloo"]  # fmt: skip


def setup_of(name: str) -> Setup:
    """The configuration `name`: a CONFIGS name, or one with TF_KERAS appended (on tf_keras)."""
    if name.endswith(TF_KERAS):
        return replace(CONFIGS[name.removesuffix(TF_KERAS)], keras="tf_keras")
    return CONFIGS[name]


def known(name: str) -> bool:
    return name.removesuffix(TF_KERAS) in CONFIGS


def main() -> int:
    args = parse()
    configs = args.configs
    if args.report:  # the tables again, from a finished run's results.json
        with open(args.report) as f:
            print(tables(json.load(f), args))
        return 0
    results: list[dict] = []
    failed: set[tuple[str, str]] = set()  # a failure is not repeated: it says what it says
    for rep in range(args.repeats):
        for workload in args.workloads:
            for name in configs:
                if (workload, name) in failed:
                    continue
                busy = wait_for_quiet(args.wait_quiet, args.wait_max) if args.wait_quiet else None
                load = os.getloadavg()[0]
                started = time.strftime("%Y-%m-%d %H:%M:%S")
                rows = launch(name, workload, args)
                for r in rows:
                    r.update(config=name, workload=workload, repeat=rep, load_before=load,
                             busy_before=busy, started=started)  # fmt: skip
                results.extend(rows)
                save(results, args.out)  # as it goes: a long run can be read while it runs
                quiet = f", busy {100 * busy:.0f}% before" if busy is not None else ""
                if is_failure(rows):
                    failed.add((workload, name))
                    what = f"failed: {rows[0]['error']}"
                else:
                    what = f"{job_rate(rows):8.1f} examples/s"
                print(f"[{rep + 1}/{args.repeats}] {workload:5s} {name:32s} {what}  "
                      f"(load {load:.1f}{quiet})", flush=True)  # fmt: skip
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
    p.add_argument("--configs", default="",
                   help=f"comma list of: {', '.join(CONFIGS)}; each also with {TF_KERAS} "
                   "appended (the same on tf_keras)")  # fmt: skip
    p.add_argument("--launch", action="store_true",
                   help="the launch mode: `hvd-train launch --np N` as a user runs it (default "
                   f"configs: {', '.join(LAUNCH)})")  # fmt: skip
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
    args.configs = [c for c in args.configs.split(",") if c] or (LAUNCH if args.launch else DEFAULT)
    unknown = [c for c in args.configs if not known(c)]
    if unknown:
        p.error(f"unknown config(s) {unknown}; known: {', '.join(CONFIGS)}, each also with "
                f"{TF_KERAS}")  # fmt: skip
    return args


# --------------------------------------------------------------------------- launching


def launch(name: str, workload: str, args: argparse.Namespace) -> list[dict]:
    setup = setup_of(name)
    mode, workers, pinned, threads = setup.mode, setup.workers, setup.pinned, setup.threads
    results = tempfile.mkdtemp(prefix="compare-peers-")
    base = worker_command(mode, setup.keras, workload, args.steps, threads, results, args.warmup)
    base += ["--pin"] if pinned else []
    if mode == "keras" and any(setup_of(c).mode == "launch" for c in args.configs):
        # Beside a launch, timed as its summary times an epoch: the second, from its start.
        base += ["--warmup-epoch"]
    base += ["--config-defaults"] if setup.defaults else []
    if mode == "hvd_train":
        base += [a for s in [*args.overrides, *setup.sets] for a in ("--set", s)]
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2",
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **dict(setup.env)}  # fmt: skip
    if mode == "launch":
        return launch_job(setup, workload, args, env, results)
    if mode in ("hvd_train", "horovod_example"):
        cmd = [os.path.join(BIN, "horovodrun"), "-np", str(workers), "-H",
               f"localhost:{workers}", f"--{setup.controller}", *base]  # fmt: skip
        return collect([start(cmd, env, results)], args.timeout, results)
    if mode == "mwms":
        ports = free_ports(workers)
        procs = []
        for i in range(workers):
            tf_config = {"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                         "task": {"type": "worker", "index": i}}  # fmt: skip
            cmd = [*base, "--core", str(i)] if pinned else base
            procs.append(start(cmd, {**env, "TF_CONFIG": json.dumps(tf_config),
                                     "MWMS_INDEX": str(i)}, results))  # fmt: skip
        return collect(procs, args.timeout, results)
    # keras: one process, or `workers` independent ones that start measuring together
    barrier = {"PEER_BARRIER": results, "PEER_COUNT": str(workers)} if workers > 1 else {}
    cmds = [[*base, "--core", str(i)] if pinned else base for i in range(workers)]
    procs = [start(cmd, {**env, **barrier, "PEER_INDEX": str(i)}, results)
             for i, cmd in enumerate(cmds)]  # fmt: skip
    return collect(procs, args.timeout, results)


def worker_command(
    mode: str, keras: str, workload: str, steps: int, threads: int, results: str,
    warmup: int | None = None,
) -> list[str]:  # fmt: skip
    """peer_worker.py in `mode` on `keras`, its result-<rank>.json in `results` (`warmup`: its
    --warmup steps; None: its default)."""
    return [PY, WORKER, "--mode", mode, "--keras", keras, "--workload", workload,
            "--steps", str(steps), *(["--warmup", str(warmup)] if warmup is not None else []),
            "--threads", str(threads), "--result-dir", results]  # fmt: skip


BATCH = 64  # per worker


def launch_sets(run_dir: str, workload: str, steps: int, world: int) -> list[str]:
    """The `--set`s of a launch of `workload`: 2 epochs of `steps` steps on `world` workers
    (summary.json leaves the first, which traces the step, out of its rate)."""
    return [f"run.dir={run_dir}", "train.epochs=2", f"train.steps_per_epoch={steps}",
            f"train.batch_size={BATCH}", "train.verbose=false", "logging.tensorboard=false",
            "data.source=synthetic", f"data.train_examples={steps * BATCH * world}",
            f"data.val_examples={BATCH * world}", "optimizer.name=sgd",
            f"model.dense_units={list(WORKLOADS[workload])}"]  # fmt: skip


def launch_command(
    world: int, config: str, sets: list[str], controller: str = "", core: int | None = None
) -> list[str]:
    """`hvd-train launch --np world --config config --set ...`; `controller`: "" (the
    launcher's choice), "mpi" or "gloo"; `core`: under `taskset` on that core."""
    cmd = [os.path.join(BIN, "hvd-train"), "launch", "--np", str(world), "--config", config,
           *([f"--{controller}"] if controller else []), *(a for s in sets for a in ("--set", s))]  # fmt: skip
    return cmd if core is None else ["taskset", "-c", str(core), *cmd]


def launch_job(
    setup: Setup, workload: str, args: argparse.Namespace, env: dict, results: str
) -> list[dict]:
    """`hvd-train launch --np N` on peer_worker.py's hvd_train workload (2 epochs of `--steps`
    steps; the first, which traces the step, left out as summary.json leaves it out), with the
    launcher's defaults; its rate is summary.json's `train_examples_per_sec`. Pinned: N
    launches of one worker at once, each under `taskset` on a core of its own (their rates
    added: the project's own ceiling for N workers)."""
    top = tempfile.mkdtemp(prefix="compare-peers-run-")
    config = os.path.join(results, "bench.yaml")
    with open(config, "w") as f:
        f.write("{}\n")  # every key below, as --set
    world = 1 if setup.pinned else setup.workers
    cores = sorted(os.sched_getaffinity(0))[: setup.workers] if setup.pinned else [None]
    run_dirs = [os.path.join(top, str(i)) for i in range(len(cores))]
    procs = []
    for run_dir, core in zip(run_dirs, cores, strict=True):
        sets = [*launch_sets(run_dir, workload, args.steps, world),
                f"runtime.keras={setup.keras}", *args.overrides, *setup.sets]  # fmt: skip
        cmd = launch_command(world, config, sets, setup.controller, core)
        procs.append(start(cmd, env, results))

    def rows_from_summaries() -> None:
        for i, (run_dir, core) in enumerate(zip(run_dirs, cores, strict=True)):
            with open(os.path.join(run_dir, "summary.json")) as f:
                s = json.load(f)
            row = {"world": s["world_size"], "rank": 0, "controller": s["controller"],
                   "examples_per_sec": s["train_examples_per_sec"],
                   "keras_version": s["versions"]["keras"], "summary_step_ms": s["step_time_ms"],
                   "mode": "launch", "keras": setup.keras, "workload": workload, "batch": BATCH,
                   "pinned": setup.pinned, "core": core}  # fmt: skip
            with open(os.path.join(results, f"result-{i}.json"), "w") as f:
                json.dump(row, f)

    try:
        return collect(procs, args.timeout, results, rows_from_summaries)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def start(cmd: list[str], env: dict, results: str) -> subprocess.Popen:
    """Starts `cmd` in a session of its own, its output to a file in `results` (a pipe that
    nobody reads while the driver polls could fill and stop the process)."""
    out = open(os.path.join(results, f"output-{time.monotonic_ns()}.log"), "w")  # noqa: SIM115
    with out:
        return subprocess.Popen(cmd, env=env, cwd=ROOT, text=True, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


# After one process of a job failed, how long the others get to end by themselves (horovodrun
# ends its workers; an MWMS worker may wait for its failed peer in a collective forever).
GRACE_S = 15.0


def collect(
    procs: list[subprocess.Popen], timeout: float, results: str, done: Callable | None = None
) -> list[dict]:
    """Every worker's result; for a job that failed or timed out, one row with its error in
    one line ({"error": ...}), its processes ended. `done`: called after a job that succeeded,
    before its results are read (the launch mode writes its row then)."""
    deadline = time.monotonic() + timeout
    failed_at = None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if failed_at is None and (any(p.returncode for p in procs) or errors(results)):
            failed_at = now
        if now > deadline or (failed_at is not None and now > failed_at + GRACE_S):
            end(procs)
            break
        time.sleep(0.2)
    try:
        found = errors(results)
        bad = [p for p in procs if p.returncode]
        if found or bad or time.monotonic() > deadline:
            why = found[0] if found else last_error_line(results)
            if not found and time.monotonic() > deadline:
                why = f"timed out after {timeout:.0f} s"
            return [{"error": why, "exit_codes": [p.returncode for p in procs]}]
        if done:
            done()
        rows = []
        for name in sorted(n for n in os.listdir(results) if n.startswith("result-")):
            with open(os.path.join(results, name)) as f:
                rows.append(json.load(f))
        if not rows:
            return [{"error": "no results: " + last_error_line(results)}]
        return rows
    finally:
        shutil.rmtree(results, ignore_errors=True)


def end(procs: list[subprocess.Popen]) -> None:
    """Ends the sessions this driver started: SIGTERM (horovodrun passes it on to its
    workers), then SIGKILL for what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
        try:
            for p in procs:
                p.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def errors(results: str) -> list[str]:
    """The one-line errors failed workers wrote (peer_worker.py note_error), rank 0's first."""
    out = []
    for name in sorted(n for n in os.listdir(results) if n.startswith("error-")):
        try:
            with open(os.path.join(results, name)) as f:
                out.append(json.load(f)["error"])
        except (OSError, ValueError, KeyError):
            continue  # being written
    return out


def last_error_line(results: str) -> str:
    """The last line of the workers' output that names an error (or the last line)."""
    lines: list[str] = []
    for name in sorted(n for n in os.listdir(results) if n.startswith("output-")):
        with open(os.path.join(results, name), errors="replace") as f:
            lines += [ln.strip() for ln in f if ln.strip()]
    named = [ln for ln in lines if "Error" in ln or "error:" in ln]
    return (named or lines or ["no output"])[-1][:400]


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


def is_failure(rows: list[dict]) -> bool:
    return len(rows) == 1 and "error" in rows[0]


def job_rate(rows: list[dict]) -> float:
    """Examples/s of a job: rank 0's figure (it counts all workers), or the sum of
    independent processes' rates."""
    if len(rows) > 1 and all(r["world"] == 1 for r in rows):
        return sum(r["examples_per_sec"] for r in rows)
    return next(r for r in rows if r.get("rank", 0) == 0)["examples_per_sec"]


# The Keras 3 speed targets: (what it asks, workloads, numerator, denominator, divide by, at least).
# Each is judged on the median of the per-repeat ratios, the runs of one repeat paired.
TARGETS = [
    ("Keras 3 at 1 worker / a plain Keras 3 fit", ("light", "heavy"),
     "hvd_train@1", "keras@1", 1, 0.95),
    ("Keras 3 at 2 pinned workers / the machine's ceiling", ("light",),
     "hvd_train@2", "keras@2-independent", 1, 0.95),
    ("the same, with the recommended --mpi", ("light",),
     "hvd_train@2-mpi", "keras@2-independent", 1, 0.95),
    ("Keras 3 / tf_keras, both at 2 workers", ("light", "heavy"),
     "hvd_train@2", "hvd_train@2/tf_keras", 1, 0.95),
    ("the same, with the recommended --mpi", ("light", "heavy"),
     "hvd_train@2-mpi", "hvd_train@2-mpi/tf_keras", 1, 0.95),
    # The launch mode: `hvd-train launch` with its defaults.
    ("the default launch at 2 workers / twice its one worker", ("light",),
     "launch@2", "launch@1", 2, 0.95),
    ("the default launch at 2 workers / twice its one worker", ("heavy",),
     "launch@2", "launch@1", 2, 0.90),
    ("the default launch at 1 worker / a plain Keras 3 fit", ("light", "heavy"),
     "launch@1", "keras@1", 1, 1.0),
]  # fmt: skip


def tables(results: list[dict], args: argparse.Namespace) -> str:
    """The report: the run's conditions, every configuration's rates and CPU accounting, the
    targets met or missed, and the other ratios, per repeat and median."""
    configs = args.configs or DEFAULT
    runs: dict[tuple[str, str, int], list[dict]] = {}
    for r in results:
        runs.setdefault((r["workload"], r["config"], r["repeat"]), []).append(r)
    rate: dict[tuple[str, str], dict[int, float]] = {}
    lines = [*conditions(results), "", *rate_table(runs, configs, args, rate)]
    lines += ["", "The Keras 3 targets (median of the per-repeat ratios; each repeat's runs paired):",
              "", "| target | workload | ratio | per repeat | median | at least | |",
              "|---|---|---|---|---:|---:|---|"]  # fmt: skip
    for label, workloads, num, den, scale, least in TARGETS:
        for workload in (w for w in args.workloads if w in workloads):
            per = paired(rate, workload, num, den, scale)
            if per is None:
                why = failure_of(runs, workload, num, den)
                if why:
                    lines.append(f"| {label} | {workload} | {num} / {den} | {why} | - | {least} "
                                 "| not measured |")  # fmt: skip
                continue
            med = statistics.median(per)
            below = sum(x < least for x in per)
            verdict = "**met**" if med >= least else "**missed**"
            verdict += f" ({below} of {len(per)} repeats below)" if below else ""
            lines.append(f"| {label} | {workload} | {num} / {den} | "
                         f"{', '.join(f'{x:.3f}' for x in per)} | {med:.3f} | {least} | "
                         f"{verdict} |")  # fmt: skip
    lines += ["", "| workload | ratio | per repeat | median |", "|---|---|---|---:|"]
    judged = {(num, den) for _, _, num, den, _, _ in TARGETS}
    for workload in args.workloads:
        for label, num, den, scale in ratios(configs):
            if (num, den) in judged:
                continue
            per = paired(rate, workload, num, den, scale)
            if per:
                lines.append(f"| {workload} | {label} | {', '.join(f'{x:.3f}' for x in per)} | "
                             f"{statistics.median(per):.3f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def conditions(results: list[dict]) -> list[str]:
    """Host, code, stack, times and load: the lines above the tables."""
    loads = [r["load_before"] for r in results]
    busy = [r["busy_before"] for r in results if r.get("busy_before") is not None]
    quiet = f"; CPUs busy {100 * min(busy):.0f}-{100 * max(busy):.0f}% just before" if busy else ""
    shared = busy and max(busy) > 0.15  # measured with --wait-quiet: other jobs were running
    starts = sorted(r["started"] for r in results if r.get("started"))
    stack = sorted({r["keras_version"] for r in results if r.get("keras_version")})
    return [
        f"Host: {os.uname().nodename}, {os.cpu_count()} CPUs; code {commit()}"
        + (f"; runs {starts[0]} to {starts[-1]}" if starts else ""),
        f"Load average before runs {min(loads):.1f}-{max(loads):.1f} (it counts this benchmark's "
        f"own last run){quiet}" + (" (shared machine: numbers are noisy)" if shared else ""),
        f"Kerases: {'; '.join(stack)}",
        f"Command: {' '.join(sys.argv)}",
    ]


def rate_table(
    runs: dict[tuple[str, str, int], list[dict]],
    configs: list[str],
    args: argparse.Namespace,
    rate: dict[tuple[str, str], dict[int, float]],
) -> list[str]:
    """One line per workload and configuration (its failure, if it failed); fills `rate`
    with each one's examples/s by repeat."""
    lines = [
        "| workload | config | examples/s (median) | per repeat | step ms | peak RSS/worker MB "
        "| CPU ms/step (TF, Horovod, main thread) | run-queue wait ms/step "
        "| others on its cores % (per repeat) |",
        "|---|---|---:|---|---:|---:|---|---:|---|",
    ]
    for workload in args.workloads:
        for name in configs:
            reps = {i: runs[(workload, name, i)] for i in range(args.repeats)
                    if (workload, name, i) in runs}  # fmt: skip
            if not reps:
                continue
            if any(is_failure(rows) for rows in reps.values()):
                error = next(rows[0]["error"] for rows in reps.values() if is_failure(rows))
                lines.append(f"| {workload} | {name} | failed | {error} | | | | | |")
                continue
            rate[(workload, name)] = {i: job_rate(rows) for i, rows in reps.items()}
            rates = list(rate[(workload, name)].values())
            every = [r for rows in reps.values() for r in rows]
            step = statistics.median(
                r.get("step_ms_median", r.get("summary_step_ms")) for r in every
            )
            th = [r["threads"] for r in every if "threads" in r]
            if not th:  # the launch mode: summary.json's numbers only
                lines.append(
                    f"| {workload} | {name} ({every[0]['controller']}) | "
                    f"{statistics.median(rates):.1f} | {', '.join(f'{x:.0f}' for x in rates)} | "
                    f"{step:.1f} | - | - | - | - |"
                )
                continue

            def cpu(group: str, th: list[dict] = th) -> str:
                v = [t[group]["cpu_ms_per_step"] for t in th if group in t]
                return f"{statistics.median(v):.1f}" if v else "-"

            wait = statistics.median(t["tensorflow"]["runqueue_wait_ms_per_step"] for t in th)
            # Other jobs' share of the cores this job's workers ran on, during its measured
            # steps (threadstat.py): above a few % the repeat was disturbed.
            others = [max(r["threads"]["cores_busy_by_others_share"] for r in rows)
                      for rows in reps.values()]  # fmt: skip
            lines.append(
                f"| {workload} | {name} ({len(every) // len(reps)} proc) | "
                f"{statistics.median(rates):.1f} | {', '.join(f'{x:.0f}' for x in rates)} | "
                f"{step:.1f} | {max(r['peak_rss_mb'] for r in every):.0f} | "
                f"{cpu('tensorflow')}, {cpu('horovod')}, {cpu('main')} | {wait:.1f} | "
                f"{', '.join(f'{100 * x:.0f}' for x in others)} |"
            )
    return lines


def paired(
    rate: dict[tuple[str, str], dict[int, float]], workload: str, num: str, den: str, scale: int
) -> list[float] | None:
    """num / den / scale for each repeat both ran; None when either did not run."""
    a, b = rate.get((workload, num)), rate.get((workload, den))
    if not a or not b:
        return None
    return [a[i] / b[i] / scale for i in sorted(a) if i in b] or None


def failure_of(runs: dict, workload: str, *names: str) -> str | None:
    """`name failed` for the first of `names` that failed on `workload`."""
    for (w, name, _), rows in runs.items():
        if w == workload and name in names and is_failure(rows):
            return f"{name} failed"
    return None


def commit() -> str:
    """The checkout's commit, `+changes` when its tracked files differ from it."""

    def git(*a: str) -> str:
        done = subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def ratios(configs: list[str]) -> list[tuple[str, str, str, int]]:
    """(label, numerator, denominator, divide by) for the configs run, per Keras: one worker
    against plain Keras, the machine's ceiling, every 2-worker hvd_train variant against
    hvd_train@1, the ceiling and MWMS (pinned) or one all-cores process (unpinned), the peers;
    then each configuration run on both Kerases, Keras 3 over tf_keras."""
    rows = []
    for k in ("", TF_KERAS):
        rows += [
            (f"hvd_train@1{k} / keras@1{k}", f"hvd_train@1{k}", f"keras@1{k}", 1),
            (f"the machine's ceiling: keras@2-independent{k} / keras@1{k} / 2",
             f"keras@2-independent{k}", f"keras@1{k}", 2),
        ]  # fmt: skip
        for name in configs:
            setup = setup_of(name)
            if not name.endswith(k) or (k == "" and name.endswith(TF_KERAS)):
                continue
            if setup.mode == "launch" and setup.workers == 2:
                rows += [
                    (f"{name} / launch@1{k} / 2", name, f"launch@1{k}", 2),
                    (f"{name} / keras@2-independent{k}", name, f"keras@2-independent{k}", 1),
                ]  # fmt: skip
                if not setup.pinned:  # the two workers against the project's own ceiling
                    rows.append((f"{name} / launch@1-independent{k}", name,
                                 f"launch@1-independent{k}", 1))  # fmt: skip
                continue
            if setup.mode != "hvd_train" or setup.workers != 2:
                continue
            if setup.pinned:
                rows += [
                    (f"2-worker efficiency ({name} / hvd_train@1{k} / 2)", name,
                     f"hvd_train@1{k}", 2),
                    (f"{name} / keras@2-independent{k}", name, f"keras@2-independent{k}", 1),
                    (f"{name} / mwms@2{k}", name, f"mwms@2{k}", 1),
                ]  # fmt: skip
            else:
                rows.append((f"unpinned: {name} / keras@all-cores{k}", name,
                             f"keras@all-cores{k}", 1))  # fmt: skip
        rows += [
            (f"mwms 2-worker efficiency (mwms@2{k} / mwms@1{k} / 2)", f"mwms@2{k}",
             f"mwms@1{k}", 2),
            (f"horovod_example@2{k} / hvd_train@2{k}", f"horovod_example@2{k}",
             f"hvd_train@2{k}", 1),
        ]  # fmt: skip
    rows += [(f"Keras 3 / tf_keras: {name} / {name}{TF_KERAS}", name, f"{name}{TF_KERAS}", 1)
             for name in configs if not name.endswith(TF_KERAS) and f"{name}{TF_KERAS}" in configs]  # fmt: skip
    return rows


if __name__ == "__main__":
    sys.exit(main())
