"""The quickstart's time from `hvd-train launch` to its first training step, split into phases.

    .venv/bin/python lab/startup/startup.py --repeats 5
    .venv/bin/python lab/startup/startup.py --repeats 5 --compare-check   # with and without the
                                                                           # kept build check
    .venv/bin/python lab/startup/startup.py --repeats 5 --before /tmp/old /tmp/old-venv/bin/python

Each repeat runs the shipped quickstart for one step (`train.epochs=1`, `train.steps_per_epoch=1`)
with `hvd-train launch --np 2 --gloo` in a fresh run.dir, and reads rank 0's `startup_s` from
summary.json: seconds from the launch to the worker's process (`process`), then from that
process's start to the end of each phase (config loaded; TensorFlow, Horovod and the trainer
imported; Horovod's init and rendezvous; data; run.dir claimed; model built and compiled; the
first step, tracing included). The job's whole wall time is measured here too.

`--compare-check` interleaves a second variant in which horovodrun checks how Horovod was built
at every job (as Horovod 0.28.1 does unpatched: a TensorFlow import in the launcher): the kept
answers file of patches/horovod-0.28.1/0002 is hidden for that run (a folder in its place, which
the patched check can neither read nor replace), and put back after it.

`--before ROOT PYTHON` interleaves another tree of hvd_train run by another interpreter (its
own virtualenv, e.g. with Horovod unpatched): an earlier commit, given the same `startup_s`
marks, is measured by the same phases.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
PHASES = ["process", "config", "imports", "horovod_init", "data", "run_dir", "model", "first_step"]


def one_job(
    workdir: pathlib.Path, np_: int, root: pathlib.Path = ROOT, python: str = sys.executable
) -> dict[str, float]:
    """Runs the 1-step quickstart with `root`'s hvd_train under `python`; returns its phases
    (from the launch) and its wall time."""
    run_dir = pathlib.Path(tempfile.mkdtemp(dir=workdir))
    cmd = [python, "-m", "hvd_train", "launch", "--np", str(np_),
           "--gloo", "--config", str(QUICKSTART), "--set", f"run.dir={run_dir}",
           "--set", "train.epochs=1", "--set", "train.steps_per_epoch=1"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(root)}
    began = time.perf_counter()
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - began
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    startup = json.loads((run_dir / "summary.json").read_text())["startup_s"]
    shutil.rmtree(run_dir)
    launch_to_process = startup.pop("process")
    # From the launch: each phase's end.
    row = {"process": launch_to_process}
    row.update({k: launch_to_process + v for k, v in startup.items()})
    row["job_wall"] = wall
    return row


@contextlib.contextmanager
def build_checked_every_job():
    """Hides the patched horovodrun's kept answers: it then checks, importing TensorFlow."""
    from horovod.common import util

    answers = pathlib.Path(util._BUILT_CHECKS)
    aside = answers.with_name(answers.name + ".aside")
    if answers.exists():
        answers.rename(aside)
    answers.mkdir()
    try:
        yield
    finally:
        answers.rmdir()
        if aside.exists():
            aside.rename(answers)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--compare-check", action="store_true")
    p.add_argument("--before", nargs=2, metavar=("ROOT", "PYTHON"))
    p.add_argument("--workdir", default=None)
    args = p.parse_args()
    workdir = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="startup-"))
    workdir.mkdir(parents=True, exist_ok=True)
    this = functools.partial(one_job, workdir, args.np)
    variants = {"this tree": (contextlib.nullcontext, this)}
    if args.compare_check:
        variants["check at every job"] = (build_checked_every_job, this)
    if args.before:
        root, python = pathlib.Path(args.before[0]).resolve(), args.before[1]
        variants[f"before: {root}"] = (contextlib.nullcontext,
                                       functools.partial(one_job, workdir, args.np, root, python))  # fmt: skip
    for _, job in variants.values():
        job()  # warm the file cache; not counted
    rows: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for _ in range(args.repeats):
        for name, (context, job) in variants.items():  # interleaved: drift hits all alike
            with context():
                rows[name].append(job())
    for name, runs in rows.items():
        print(f"\n{name}: medians of {len(runs)} (seconds from `hvd-train launch`)")
        print(f"| {'phase ends':14} | {'from launch':>11} | {'phase':>6} |")
        print(f"|{'-' * 16}|{'-' * 13}|{'-' * 8}|")
        before = 0.0
        for phase in [*PHASES, "job_wall"]:
            at = statistics.median(r[phase] for r in runs)
            print(f"| {phase:14} | {at:11.2f} | {at - before if phase != 'job_wall' else 0:6.2f} |")
            before = at
        firsts = ", ".join(f"{r['first_step']:.2f}" for r in runs)
        print(f"launch to first step, each run: {firsts}")


if __name__ == "__main__":
    main()
