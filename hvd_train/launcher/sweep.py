"""`hvd-train sweep`: runs a grid of worker counts x batch sizes, each point a real horovodrun
job, and writes one folder with scaling.csv, scaling.md and PNG plots.

Per point: examples/s (all workers, warm-up left out, from the run's summary.json), speedup and
efficiency against the fewest-worker point of the same batch size, best validation accuracy,
and the training time until the validation accuracy first reached `--target-accuracy`.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import subprocess
import time
from dataclasses import dataclass

from hvd_train.base.errors import ConfigError, UserError
from hvd_train.config import Config, LoggingConfig, check, load_config
from hvd_train.launcher import horovodrun
from hvd_train.record import mlflow_run
from hvd_train.record.layout import RunDir

# What a sweep writes in its --out folder.
REPORTS = ("scaling.csv", "scaling.md", "speedup.png", "accuracy_vs_time.png")
COLUMNS = [
    "workers", "per_worker_batch", "global_batch", "examples_per_sec",
    "examples_per_sec_per_worker", "speedup", "efficiency", "best_val_accuracy",
    "time_to_target_s", "train_time_s", "status", "run_dir",
]  # fmt: skip


@dataclass(frozen=True)
class Point:
    workers: int
    batch_size: int  # as given on the command line: per worker or global, by the mode

    @property
    def name(self) -> str:
        return f"w{self.workers}_b{self.batch_size}"


# --------------------------------------------------------------------------- the grid


def refuse_what_this_host_cannot_run(cfg: Config, points: list[Point], oversubscribe: bool):
    """Raises UserError naming the points this host cannot run, before any job starts."""
    most = max(p.workers for p in points)
    gpus = horovodrun.training_gpus(cfg.runtime)
    cores = len(os.sched_getaffinity(0))
    if gpus and most > gpus:
        raise UserError(
            f"sweep: {most} workers need {most} GPUs, this host has {gpus}; one worker per GPU "
            f"(use --workers up to {gpus})"
        )
    if not gpus and most > cores and not oversubscribe:
        raise UserError(
            f"sweep: {most} workers on {cores} CPU cores would share cores and measure "
            f"contention, not scaling; use --workers up to {cores}, or pass --oversubscribe"
        )
    if cfg.runtime.bind_cores is True and most > cores:
        raise UserError(
            f"sweep: --pin-cores gives each worker a core of its own; {most} workers > {cores} cores"
        )
    bad = []
    for p in points:
        try:
            check(_with_batch(cfg, p.batch_size), p.workers)
        except ConfigError as e:
            bad.append(f"{p.workers} workers x batch {p.batch_size}: {e}")
    if bad:
        raise UserError("sweep: these grid points are invalid: " + " | ".join(bad))


def _with_batch(cfg: Config, batch: int) -> Config:
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=batch))


# --------------------------------------------------------------------------- one point


def run_point(config: str, overrides: list[str], point: Point, run_dir: str, timeout) -> str:
    """Runs one grid point as horovodrun.command's job of N workers on this host (Gloo or MPI,
    as `horovodrun.chosen_controller` picks); returns its status."""
    os.makedirs(run_dir, exist_ok=True)
    sets = [*overrides, f"train.batch_size={point.batch_size}", f"run.dir={run_dir}"]
    cfg = load_config(config, sets)
    cmd, env = horovodrun.command(cfg, config, sets, horovodrun.Placement(np=point.workers))
    with open(RunDir(run_dir).sweep_log, "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            return "timed out"
    return "ok" if code == 0 else f"failed (exit {code})"


def read_point(point: Point, run_dir: str, status: str, target: float | None) -> dict:
    """The point's row: throughput from summary.json, accuracy and times from metrics.csv."""
    row = {"workers": point.workers, "status": status, "run_dir": run_dir,
           "per_worker_batch": None, "global_batch": None, "batch_size": point.batch_size,
           "curve": []}  # fmt: skip
    try:
        with open(RunDir(run_dir).summary) as f:
            summary = json.load(f)
        with open(RunDir(run_dir).metrics) as f:
            epochs = list(csv.DictReader(f))
    except (OSError, ValueError):
        row["status"] = status if status != "ok" else "no results"
        return row
    elapsed, curve = 0.0, []
    for e in epochs:
        elapsed += float(e["epoch_time_s"])
        if e.get("val_accuracy"):
            curve.append((elapsed, float(e["val_accuracy"])))
    reached = [t for t, acc in curve if target is not None and acc >= target]
    row.update(
        per_worker_batch=summary.get("per_worker_batch_size"),
        global_batch=summary.get("global_batch_size"),
        examples_per_sec=summary.get("train_examples_per_sec"),
        examples_per_sec_per_worker=summary.get("train_examples_per_sec_per_worker"),
        best_val_accuracy=max((acc for _, acc in curve), default=None),
        time_to_target_s=reached[0] if reached else None,
        train_time_s=elapsed,
        curve=curve,
    )
    return row


def add_speedups(rows: list[dict]) -> None:
    """Speedup and efficiency against the fewest-worker finished point of the same batch size."""
    for row in rows:
        same = [
            r for r in rows if r["batch_size"] == row["batch_size"] and r.get("examples_per_sec")
        ]
        if not row.get("examples_per_sec") or not same:
            continue
        base = min(same, key=lambda r: r["workers"])
        row["speedup"] = row["examples_per_sec"] / base["examples_per_sec"]
        row["efficiency"] = row["speedup"] * base["workers"] / row["workers"]


# --------------------------------------------------------------------------- MLflow


class SweepRun:
    """With logging.mlflow, the sweep's own MLflow run: each point's run is its child (the
    points' rank 0 read its id from PARENT_RUN), and it gets the reports at the end."""

    def __init__(self, logs: LoggingConfig, out: str, command: str):
        """Raises UserError (exit code 2) when the tracking server does not answer."""
        place = mlflow_run.where(logs)
        mlflow_run.check_reachable(place)
        self.tracker, _ = mlflow_run.client(place.uri)
        experiment = mlflow_run.experiment_id(self.tracker, place.experiment)
        name = os.path.basename(os.path.abspath(out))
        run = self.tracker.create_run(experiment, run_name=name, tags={"hvd_train.sweep": command})
        self.run_id = run.info.run_id
        os.environ[mlflow_run.PARENT_RUN] = self.run_id  # the points' jobs inherit it

    def end(self, out: str, ok: bool) -> None:
        """The reports as artifacts; FINISHED when every point finished, else FAILED."""
        try:
            for name in REPORTS:
                self.tracker.log_artifact(self.run_id, os.path.join(out, name))
            self.tracker.set_terminated(self.run_id, "FINISHED" if ok else "FAILED")
        except Exception as e:
            print(f"[sweep] cannot end the sweep's MLflow run {self.run_id}: "
                  f"{mlflow_run.cause(e)}", flush=True)  # fmt: skip


# --------------------------------------------------------------------------- reports


def write_reports(rows: list[dict], args: argparse.Namespace) -> None:
    table, page, speedup, accuracy = (os.path.join(args.out, name) for name in REPORTS)
    with open(table, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow(["" if r.get(c) is None else _fmt(r.get(c)) for c in COLUMNS])
    with open(page, "w") as f:
        f.write(markdown(rows, args))
    plot_speedup(rows, speedup)
    plot_accuracy(rows, accuracy, args.target_accuracy)


def markdown(rows: list[dict], args: argparse.Namespace) -> str:
    target = f"{args.target_accuracy:g}" if args.target_accuracy is not None else "-"
    lines = [
        f"# Scaling sweep: {args.config}",
        "",
        f"`{args.command}`",
        "",
        f"Host: {os.uname().nodename}, {len(os.sched_getaffinity(0))} CPU cores, "
        f"{horovodrun.count_gpus()} GPU(s); {time.strftime('%Y-%m-%d %H:%M')}. Batch size mode: "
        f"`{args.batch_size_mode}`{'; workers bound to cores' if args.pin_cores else ''}.",
        "Examples/s count all workers with the first epoch left out (warm-up); speedup and "
        "efficiency are against the fewest workers at the same batch size; times are training "
        "seconds (validation and start-up not counted).",
        "",
        "| workers | batch/worker | global batch | examples/s | speedup | efficiency "
        f"| best val acc | time to {target} (s) | status |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        cells = [r["workers"], r.get("per_worker_batch"), r.get("global_batch"),
                 _num(r.get("examples_per_sec"), ".0f"), _num(r.get("speedup"), ".2f"),
                 _num(r.get("efficiency"), ".2f"), _num(r.get("best_val_accuracy"), ".4f"),
                 _num(r.get("time_to_target_s"), ".1f"), r["status"]]  # fmt: skip
        lines.append("| " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _num(v, spec: str) -> str | None:
    return None if v is None else format(v, spec)


def _fmt(v):
    return f"{v:.6g}" if isinstance(v, float) else v


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def plot_speedup(rows: list[dict], path: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    workers = sorted({r["workers"] for r in rows})
    base = workers[0]
    ax.plot(workers, [w / base for w in workers], "k--", label="ideal (linear)")
    for batch in sorted({r["batch_size"] for r in rows}):
        done = [r for r in rows if r["batch_size"] == batch and r.get("speedup") is not None]
        if done:
            ax.plot([r["workers"] for r in done], [r["speedup"] for r in done], "o-",
                    label=f"batch {batch}")  # fmt: skip
    ax.set_xlabel("workers")
    ax.set_ylabel(f"speedup over {base} worker(s)")
    ax.set_xticks(workers)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_accuracy(rows: list[dict], path: str, target: float | None) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for r in rows:
        if r["curve"]:
            t, acc = zip(*r["curve"], strict=True)
            ax.plot(t, acc, "o-", label=f"{r['workers']} w x {r.get('per_worker_batch')}")
    if target is not None:
        ax.axhline(target, color="k", linestyle=":", label=f"target {target:g}")
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("validation accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
