"""Benchmark: each worker's peak RSS and input rate at 1x and 4x the data.

Trains 2 workers (horovodrun, Gloo, each worker pinned to a core of its own) for a bounded
number of steps on image sets made by `lab/data-larger-than-memory/make_image_sets.py` (224x224 JPEGs of about
25 KB; `img1x` is a quarter of `img4x`) and on their TFRecord conversions, and records each
worker's peak RSS (`ru_maxrss`, written at exit by `lab/data-larger-than-memory/rss_worker.py`) and the run's
`train_examples_per_sec`. Images are decoded to 32x32 (convnet7, batch 32 per worker).

Variants (`--variants`, comma-separated; default all of this checkout's):
  tfrecord-1x, tfrecord-4x, folder-1x, folder-4x: this checkout, `data.read: exact`;
  ...-stream: the same with `data.read: stream`;
  ...-cached: `data.cache: memory` (every image decoded once, kept on every worker);
  base/VARIANT: the same with --base-code's checkout (e.g. main's, before this change: every
  record read into memory on every worker; `git archive COMMIT hvd_train configs | tar -x`);
  NAME/VARIANT: the same with the checkout given as `--code NAME=DIR` (repeatable).
Runs are interleaved over `--repeats`; results are appended as JSON lines to `--out`.
`--data-bench N` runs `hvd-train data-bench --batches N` (the input pipeline alone) instead.

    python lab/data-larger-than-memory/data_memory.py --data /work/bench-data --repeats 2 --out results.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent
COMMON = [
    "data.image_size=[32,32]", "data.channels=3", "train.batch_size=32",
    "model.name=convnet7", "optimizer.name=sgd", "optimizer.learning_rate=0.01",
    "train.verbose=false", "logging.tensorboard=false", "data.validation_fraction=0.01",
]  # fmt: skip


def variant_sets(name: str, data: pathlib.Path) -> list[str]:
    kind, scale, *mode = name.split("-")
    if kind == "tfrecord":
        sets = ["data.source=tfrecord", f"data.train_dir={data / f'tfr{scale}' / 'train'}"]
    else:
        sets = ["data.source=image_folder", f"data.train_dir={data / f'img{scale}'}"]
    if mode == ["stream"]:
        sets.append("data.read=stream")
    elif mode == ["cached"]:
        sets.append("data.cache=memory")
    return sets


def ensure_tfrecords(data: pathlib.Path, code: pathlib.Path, variants: list[str]) -> None:
    for scale in sorted({v.split("-")[1] for v in variants if "tfrecord" in v}):
        dst = data / f"tfr{scale}"
        if not (dst / "train" / "classes.txt").exists():
            subprocess.run([sys.executable, "-m", "hvd_train", "convert-tfrecord",
                            str(data / f"img{scale}"), str(dst), "--shards", "16"],
                           env={**os.environ, "PYTHONPATH": str(code)}, check=True)  # fmt: skip


def train_once(name, sets, code, work, epochs, steps) -> dict:
    run_dir = pathlib.Path(tempfile.mkdtemp(prefix=f"{name.replace('/', '_')}_", dir=work))
    overrides = [*COMMON, *sets, f"train.epochs={epochs}", f"train.steps_per_epoch={steps}",
                 f"run.dir={run_dir}"]  # fmt: skip
    cmd = [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
           str(ROOT / "lab" / "pin_to_core.sh"), sys.executable,
           str(pathlib.Path(__file__).resolve().parent / "rss_worker.py"), "--config",
           str(ROOT / "configs" / "quickstart.yaml"),
           *[a for s in overrides for a in ("--set", s)]]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(code), "TF_CPP_MIN_LOG_LEVEL": "2",
           "RSS_OUT": str(run_dir)}  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    rss = [int((run_dir / f"rss-rank{r}.txt").read_text()) / 1024 for r in (0, 1)]
    return {"variant": name, "code": str(code), "peak_rss_mib": rss, "wall_s": round(wall, 1),
            "train_examples_per_sec": summary["train_examples_per_sec"],
            "input_wait_fraction": summary.get("input_wait_fraction"),
            "load_avg": os.getloadavg(), "at": time.strftime("%H:%M:%S")}  # fmt: skip


def data_bench_once(name, sets, code, batches: int) -> dict:
    """`hvd-train data-bench` on 2 pinned workers: the input pipeline alone, examples/s."""
    overrides = [*COMMON, *sets]
    cmd = [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
           str(ROOT / "lab" / "pin_to_core.sh"), sys.executable, "-m", "hvd_train",
           "data-bench", "--config", str(ROOT / "configs" / "quickstart.yaml"),
           "--batches", str(batches), *[a for s in overrides for a in ("--set", s)]]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": str(code),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": "900",
    }  # the old code loads everything first
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    found = re.search(r"input pipeline (\d+) examples/s per worker", proc.stdout)
    if proc.returncode != 0 or not found:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return {"variant": name, "code": str(code), "data_bench_examples_per_sec": int(found[1]),
            "load_avg": os.getloadavg(), "at": time.strftime("%H:%M:%S")}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="/work/bench-data")
    p.add_argument("--variants", default="tfrecord-1x,tfrecord-4x,folder-1x,folder-4x")
    p.add_argument(
        "--base-code",
        default="/work/bench-data/base-code",
        help="the checkout that variants named base/... run (e.g. main's code)",
    )
    p.add_argument(
        "--code",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="another checkout, run by the variants named NAME/...",
    )
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--epochs", type=int, default=2, help="the first is left out of the rate")
    p.add_argument("--steps", type=int, default=150, help="steps per epoch")
    p.add_argument("--out", default="data_memory.jsonl")
    p.add_argument(
        "--data-bench",
        type=int,
        default=0,
        metavar="BATCHES",
        help="run hvd-train data-bench for this many batches instead of training",
    )
    args = p.parse_args()
    data = pathlib.Path(args.data)
    ensure_tfrecords(data, ROOT, args.variants.split(","))
    work = data / "runs"
    work.mkdir(exist_ok=True)
    codes = {"base": args.base_code, **dict(c.split("=", 1) for c in args.code)}
    for r in range(args.repeats):
        for name in args.variants.split(","):
            where, _, variant = name.rpartition("/")
            code = pathlib.Path(codes[where]) if where else ROOT
            sets = variant_sets(variant, data)
            if args.data_bench:
                row = data_bench_once(name, sets, code, args.data_bench)
            else:
                row = train_once(name, sets, code, work, args.epochs, args.steps)
            row["repeat"] = r
            print(json.dumps(row), flush=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
