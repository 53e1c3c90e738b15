"""Comparing finished runs: one figure of validation curves and one table (`hvd-train compare`).

Reads what each run directory holds (metrics.csv, summary.json, config.yaml) and nothing else,
so it works on runs copied from other machines, without Horovod.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
from dataclasses import dataclass
from typing import Any

import yaml

from hvd_train.base.errors import DataError
from hvd_train.record import layout
from hvd_train.record.layout import RunDir


@dataclass(frozen=True)
class Run:
    """One run directory as written by rank 0."""

    name: str
    rows: list[dict[str, float]]  # metrics.csv, one per epoch
    summary: dict[str, Any]  # summary.json ({} if absent)
    config: dict[str, Any]  # config.yaml ({} if absent)

    def times(self) -> list[float]:
        """Training seconds since the start at each epoch's end: the running sum of
        `epoch_time_s` (validation and start-up not counted)."""
        total, out = 0.0, []
        for r in self.rows:
            total += r["epoch_time_s"]
            out.append(total)
        return out


def load_run(path: str, name: str) -> Run:
    files = RunDir(path)
    metrics = files.metrics
    if not os.path.isfile(metrics):
        raise DataError(
            f"compare: {path}: no {layout.METRICS}; expected a run.dir written by hvd-train"
        )
    with open(metrics, newline="") as f:
        rows = [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]
    if not rows:
        raise DataError(f"compare: {metrics}: no epochs recorded yet")
    return Run(
        name,
        rows,
        _read(files.summary, json.load),
        _read(files.config, yaml.safe_load),
    )


def _number(v: str | None) -> float:
    try:
        return float(v) if v not in (None, "") else math.nan
    except ValueError:
        return math.nan


def _read(path: str, parse) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return parse(f) or {}


def load_runs(paths: list[str]) -> list[Run]:
    """The runs, named by their paths relative to the folder they share."""
    paths = [os.path.normpath(p) for p in paths]
    common = os.path.commonpath([os.path.abspath(p) for p in paths]) if len(paths) > 1 else ""
    names = [
        os.path.relpath(os.path.abspath(p), common) if common else os.path.basename(p) or p
        for p in paths
    ]
    return [load_run(p, n) for p, n in zip(paths, names, strict=True)]


def table(runs: list[Run]) -> list[dict[str, Any]]:
    """Per run: workers, batches, epochs, best validation accuracy and when it was reached."""
    out = []
    for run in runs:
        s, cfg_train = run.summary, run.config.get("train", {})
        acc = [r["val_accuracy"] for r in run.rows]
        best = max(range(len(acc)), key=lambda i: -math.inf if math.isnan(acc[i]) else acc[i])
        rate = s.get("train_examples_per_sec")
        if rate is None:
            rate = _mean([r["examples_per_sec"] for r in run.rows])
        out.append({
            "run": run.name,
            "model": _model_name(run.config),
            "workers": s.get("world_size", "?"),
            "per_worker_batch": s.get("per_worker_batch_size", cfg_train.get("batch_size", "?")),
            "global_batch": s.get("global_batch_size", "?"),
            "epochs": len(run.rows),
            "best_val_accuracy": acc[best],
            "best_epoch": int(run.rows[best]["epoch"]),
            "time_to_best_s": run.times()[best],
            "examples_per_sec": rate,
        })  # fmt: skip
    return out


def _model_name(config: dict[str, Any]) -> str:
    m = config.get("model", {})
    return m.get("factory") or m.get("name", "?")


def _mean(values: list[float]) -> float:
    ok = [v for v in values if not math.isnan(v)]
    return sum(ok) / len(ok) if ok else math.nan


COLUMNS = [
    ("run", "run", "{}"),
    ("model", "model", "{}"),
    ("workers", "workers", "{}"),
    ("per_worker_batch", "batch/worker", "{}"),
    ("global_batch", "global batch", "{}"),
    ("epochs", "epochs", "{}"),
    ("best_val_accuracy", "best val acc", "{:.4f}"),
    ("best_epoch", "at epoch", "{}"),
    ("time_to_best_s", "time to best (s)", "{:.1f}"),
    ("examples_per_sec", "examples/s", "{:.0f}"),
]


def format_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table, columns aligned; notes which clock `time to best` used."""
    cells = [[title for _, title, _ in COLUMNS]]
    for row in rows:
        cells.append([_cell(fmt, row[key]) for key, _, fmt in COLUMNS])
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in cells]
    note = "time: cumulative training time (epoch_time_s)"
    return "\n".join([*(line.rstrip() for line in lines), note])


def _cell(fmt: str, value: Any) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "-"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def plot(runs: list[Run], out: str) -> None:
    """Validation accuracy and loss against epoch and against time, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharey="row")
    for run in runs:
        epochs = [r["epoch"] for r in run.rows]
        for i, key in enumerate(("val_accuracy", "val_loss")):
            values = [r[key] for r in run.rows]
            axes[i][0].plot(epochs, values, marker="o", label=run.name)
            axes[i][1].plot(run.times(), values, marker="o", label=run.name)
    for i, ylabel in enumerate(("validation accuracy", "validation loss")):
        axes[i][0].set_ylabel(ylabel)
        axes[i][0].xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        axes[i][1].set_xlim(left=0)  # time from the start, so the runs' costs compare
        for j, xlabel in enumerate(("epoch", "training time (s)")):
            axes[i][j].set_xlabel(xlabel)
            axes[i][j].grid(alpha=0.3)
    axes[0][0].legend(fontsize="small")
    fig.suptitle(f"{len(runs)} run(s)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: list[str], prog: str) -> int:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Compare runs: validation accuracy and loss against epoch and time "
        "(one PNG), and a table of batches, best accuracy, time to reach it and throughput.",
        epilog="Docs: docs/models.md",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run.dir of each run")
    p.add_argument("--out", default="compare.png", help="PNG to write")
    args = p.parse_args(argv)
    runs = load_runs(args.run_dirs)
    print(format_table(table(runs)))
    plot(runs, args.out)
    print(f"wrote {args.out}")
    return 0
