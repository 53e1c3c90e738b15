"""The early-death matrix, soaked: rank 1 killed (SIGKILL) at each early moment of a 2-worker job,
under every launcher, many times, beside busy loops; counts the records that tell the truth.

    .venv/bin/python lab/early-deaths/early_death_soak.py --runs 30 --load 2

A rank that dies for any reason but a stop ends the run `failed`, with no `stopped_by`, whatever
the timing (tests/test_stops.py holds one job of each kind; this repeats them until a rare
ordering shows). Each cell is one launcher and one moment; the cells are interleaved, so the
machine's noise falls on all of them alike. Per cell it prints:

- true: summary.json says `failed`, with no `stopped_by` nor `stop_detail`;
- false: it says anything else (`interrupted`, `running`, `completed`): the record lies;
- none: no summary.json (rank 0 died before it heard signals, and no launcher writes one:
  raw horovodrun and launch/single_node.sh; nothing claims anything);
- missed: the job ended before the moment came (nothing was killed; not counted).

A false record's summary and console are kept in --keep (default /tmp/early_death_soak).

The moments, as seen from outside rank 0:
- process: rank 1's process exists;
- imports: rank 0 hears signals (it installs its handlers right after reading the config,
  before TensorFlow loads: SigCgt in /proc);
- horovod-init: rank 0 has loaded Horovod's TensorFlow ops (`import horovod.tensorflow`, then
  `hvd.init`: /proc's maps);
- first-collective: rank 0 wrote run.dir/config.yaml (it claimed run.dir; the ranks then agree
  on the claim in one collective);
- first-step: summary.json says `running` (the model, the broadcast and the first step follow).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

from hvd_train.launcher.supervise import local_ranks

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYTHON = sys.executable
BIN = pathlib.Path(PYTHON).parent
CONFIG = ROOT / "configs" / "quickstart.yaml"
SETS = ("model.dropout=0", "train.verbose=false", "logging.tensorboard=false",
        "data.source=synthetic", "data.train_examples=1024", "data.val_examples=256")  # fmt: skip
LAUNCHERS = ("hvd-train launch --mpi", "hvd-train launch --gloo", "single_node.sh --mpi",
             "horovodrun --mpi", "horovodrun --gloo", "hvd-train launch --slurm")  # fmt: skip
MOMENTS = ("process", "imports", "horovod-init", "first-collective", "first-step")
SLURM_ENV = {"SLURM_JOB_NODELIST": "localhost", "SLURM_NTASKS_PER_NODE": "2"}
JOB_LIMIT_S = 180.0


def command(launcher: str, run_dir: pathlib.Path) -> list[str]:
    """The 2-worker job as each launcher starts it."""
    sets = [x for s in (*SETS, f"run.dir={run_dir}") for x in ("--set", s)]
    name, flag = launcher.rsplit(" ", 1)
    trainer = [PYTHON, "-m", "hvd_train", "--config", str(CONFIG), *sets]
    if name == "horovodrun":
        return [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", flag, *trainer]
    if name == "single_node.sh":
        return [str(ROOT / "launch" / "single_node.sh"), str(CONFIG), "--np", "2", flag, *sets]
    np_ = [] if flag == "--slurm" else ["--np", "2"]
    return [PYTHON, "-m", "hvd_train", "launch", *np_, flag, "--config", str(CONFIG), *sets]


def _read(path: pathlib.Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def catches_sigterm(pid: int) -> bool:
    status = _read(pathlib.Path(f"/proc/{pid}/status"))
    caught = next((ln.split()[1] for ln in status.splitlines() if ln.startswith("SigCgt:")), "0")
    return bool(int(caught, 16) & (1 << (signal.SIGTERM - 1)))


def summary(run_dir: pathlib.Path) -> dict:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def reached(moment: str, run_dir: pathlib.Path, job: int) -> bool:
    found = local_ranks(job)
    if 1 not in found or 0 not in found and moment != "process":
        return False
    rank0 = found.get(0)
    if moment == "process":
        return True
    if moment == "imports":
        return catches_sigterm(rank0)
    if moment == "horovod-init":
        return "horovod/tensorflow/mpi_lib" in _read(pathlib.Path(f"/proc/{rank0}/maps"))
    if moment == "first-collective":
        return (run_dir / "config.yaml").exists()
    return summary(run_dir).get("status") == "running"


def one_job(launcher: str, moment: str, run_dir: pathlib.Path) -> tuple[str, dict, str]:
    """Runs one job, kills rank 1 at `moment`; returns (verdict, summary, console)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "TF_CPP_MIN_LOG_LEVEL": "2", **(SLURM_ENV if "slurm" in launcher else {})}  # fmt: skip
    proc = subprocess.Popen(command(launcher, run_dir), cwd=run_dir.parent, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    killed = False
    deadline = time.monotonic() + JOB_LIMIT_S
    while proc.poll() is None and time.monotonic() < deadline:
        if reached(moment, run_dir, proc.pid):
            try:
                os.kill(local_ranks(proc.pid)[1], signal.SIGKILL)
                killed = True
            except (KeyError, ProcessLookupError):
                pass
            break
        time.sleep(0.005)
    try:
        out, _ = proc.communicate(timeout=JOB_LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return "false", {"hung": True}, out
    # rank 0's keeper writes the ending rank 0 could not, a moment after the job's end.
    end = time.monotonic() + 60
    while time.monotonic() < end and (
        summary(run_dir).get("status") == "running" or (run_dir / ".hvd_train.lock").exists()
    ):
        time.sleep(0.1)
    s = summary(run_dir)
    if not killed:
        return "missed", s, out
    if not s:
        return "none", s, out
    true = s.get("status") == "failed" and "stopped_by" not in s and "stop_detail" not in s
    return ("true" if true else "false"), s, out


def busy_loops(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([PYTHON, "-c", "while True: pass"]) for _ in range(n)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="jobs per cell (default 30)")
    parser.add_argument("--load", type=int, default=2, help="busy loops beside (default 2)")
    parser.add_argument("--launchers", nargs="*", default=list(LAUNCHERS), choices=LAUNCHERS)
    parser.add_argument("--moments", nargs="*", default=list(MOMENTS), choices=MOMENTS)
    parser.add_argument("--keep", default="/tmp/early_death_soak", help="false records go here")
    parser.add_argument("--parallel", type=int, default=1, help="jobs at a time (default 1)")
    parser.add_argument("--tally", action="store_true",
                        help="print the table of --keep's results.jsonl (a soak cut short)")  # fmt: skip
    args = parser.parse_args(argv)
    keep = pathlib.Path(args.keep)
    keep.mkdir(parents=True, exist_ok=True)
    cells = [(launcher, moment) for launcher in args.launchers for moment in args.moments]
    if args.tally:
        return tally(keep / "results.jsonl", cells)
    counts: dict[tuple[str, str], collections.Counter] = collections.defaultdict(
        collections.Counter
    )
    loops = busy_loops(args.load)
    started = time.time()
    jobs = [(i, launcher, moment) for i in range(args.runs) for launcher, moment in cells]
    done = 0
    try:
        with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
            # Each stream its own run.dir; the cells stay interleaved across the streams.
            runs = {pool.submit(one_job, launcher, moment, keep / f"run{n % args.parallel}-{n}"):
                    (i, launcher, moment) for n, (i, launcher, moment) in enumerate(jobs)}  # fmt: skip
            for future in concurrent.futures.as_completed(runs):
                i, launcher, moment = runs[future]
                verdict, s, out = future.result()
                counts[launcher, moment][verdict] += 1
                with open(keep / "results.jsonl", "a") as f:  # --tally reads it, also if cut short
                    row = {"launcher": launcher, "moment": moment, "verdict": verdict}
                    f.write(json.dumps({**row, "status": s.get("status")}) + "\n")
                if verdict == "false":
                    name = f"{launcher}-{moment}-{i}".replace(" ", "_").replace("/", "_")
                    (keep / f"{name}.txt").write_text(json.dumps(s, indent=1) + "\n" + out)
                done += 1
                if done % len(cells) == 0:
                    print(f"[soak] {done}/{len(jobs)} jobs, {time.time() - started:.0f} s",
                          file=sys.stderr, flush=True)  # fmt: skip
    finally:
        for p in loops:
            p.kill()
    print(
        f"{args.runs} jobs a cell, {args.parallel} at a time beside {args.load} busy loops, "
        f"{time.time() - started:.0f} s"
    )
    return table(counts, cells)


def table(counts: dict, cells: list[tuple[str, str]]) -> int:
    """Prints each cell's counts; 1 if any record lied."""
    print("| launcher | moment | true | false | none | missed |\n|---|---|---:|---:|---:|---:|")
    for launcher, moment in cells:
        c = counts[launcher, moment]
        print(
            f"| {launcher} | {moment} | {c['true']} | {c['false']} | {c['none']} | {c['missed']} |"
        )
    return 1 if any(c["false"] for c in counts.values()) else 0


def tally(results: pathlib.Path, cells: list[tuple[str, str]]) -> int:
    """The table of a soak's results.jsonl, one line a job (a soak cut short has one too)."""
    counts: dict = collections.defaultdict(collections.Counter)
    for line in results.read_text().splitlines():
        row = json.loads(line)
        counts[row["launcher"], row["moment"]][row["verdict"]] += 1
    print(f"{sum(sum(c.values()) for c in counts.values())} jobs in {results}")
    return table(counts, cells)


if __name__ == "__main__":
    sys.exit(main())
