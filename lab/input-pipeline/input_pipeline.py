"""Benchmark: training from a JPEG image folder vs synthetic data of the same shape.

Writes a JPEG image folder of a small image-classification size (10 classes, 5,000 training
and 800 validation images, 32x32 RGB), then trains the same model (convnet7, batch 32 per worker) on
2 workers, each pinned to a core of its own, from: synthetic in-memory tensors of the same
shape, the JPEG folder (decoded every epoch), the JPEG folder with `data.cache: memory`, and
its TFRecord conversion. Runs are interleaved (one of each variant per repeat) so that a
change in the machine's load hits all variants alike; the median of each variant's
`train_examples_per_sec` (all workers, first epoch left out) is reported, and its ratio to
synthetic (target >= 0.95).

    .venv/bin/python lab/input-pipeline/input_pipeline.py [--repeats 3] [--epochs 3] [--steps 40]
        [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image

ROOT = pathlib.Path(__file__).resolve().parents[2]
PIN = ROOT / "lab" / "pin_to_core.sh"
BIN = pathlib.Path(sys.executable).parent

COMMON = [
    "data.image_size=[32,32]", "data.channels=3", "train.batch_size=32",
    "model.name=convnet7", "optimizer.name=sgd", "optimizer.learning_rate=0.01",
    "train.verbose=false", "logging.tensorboard=false",
]  # fmt: skip


def write_jpeg_folder(root: pathlib.Path, train_per_class: int = 500, val_per_class: int = 80):
    """Digits upscaled to 32x32, tinted and noised per image (so the JPEGs are not trivial)."""
    from hvd_train.data import digits

    images, labels = digits.load()
    rng = np.random.default_rng(0)
    for split, per_class in (("train", train_per_class), ("val", val_per_class)):
        for c in range(10):
            folder = root / split / f"class_{c}"
            folder.mkdir(parents=True, exist_ok=True)
            pool = images[labels == c]
            for i in range(per_class):
                grey = np.kron(pool[i % len(pool)] / 16.0, np.ones((4, 4)))
                tint = rng.uniform(0.3, 1.0, 3)
                img = grey[..., None] * tint + rng.normal(0, 0.08, (32, 32, 3))
                px = (np.clip(img, 0, 1) * 255).astype(np.uint8)
                Image.fromarray(px).save(folder / f"{i:04d}.jpg", quality=90)


def variants(data: pathlib.Path) -> dict[str, list[str]]:
    folder = [f"data.train_dir={data / 'train'}", f"data.val_dir={data / 'val'}"]
    return {
        "synthetic": ["data.source=synthetic", "data.train_examples=5000", "data.val_examples=800"],
        "jpeg_folder": ["data.source=image_folder", *folder],
        "jpeg_folder_cached": ["data.source=image_folder", *folder, "data.cache=memory"],
        "tfrecord": ["data.source=tfrecord", f"data.train_dir={data / 'tfr' / 'train'}",
                     f"data.val_dir={data / 'tfr' / 'val'}"],
    }  # fmt: skip


def train_once(sets: list[str], run_dir: pathlib.Path, epochs: int, steps: int) -> dict:
    overrides = [*COMMON, *sets, f"train.epochs={epochs}", f"train.steps_per_epoch={steps}",
                 f"run.dir={run_dir}"]  # fmt: skip
    cmd = [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", str(PIN),
           sys.executable, "-m", "hvd_train", "--config", str(ROOT / "configs/quickstart.yaml"),
           *[a for s in overrides for a in ("--set", s)]]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads((run_dir / "summary.json").read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3, help="the first is left out of the rate")
    p.add_argument("--steps", type=int, default=40, help="steps per epoch (of 78 in one pass)")
    p.add_argument("--workdir", default="")
    args = p.parse_args()
    work = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="hvd_input_bench_"))
    data = work / "jpeg"
    if not (data / "train").exists():
        write_jpeg_folder(data)
    if not (data / "tfr").exists():
        subprocess.run([sys.executable, "-m", "hvd_train", "convert-tfrecord", str(data / "train"),
                        str(data / "tfr"), "--shards", "4", "--val-dir", str(data / "val")],
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True,
                       capture_output=True)  # fmt: skip
    rates: dict[str, list[float]] = {name: [] for name in variants(data)}
    waits: dict[str, list[float]] = {name: [] for name in variants(data)}
    for r in range(args.repeats):
        for name, sets in variants(data).items():
            started = time.perf_counter()
            s = train_once(sets, work / f"{name}_{r}", args.epochs, args.steps)
            rates[name].append(s["train_examples_per_sec"])
            waits[name].append(s["input_wait_fraction"])
            print(f"repeat {r + 1} {name:19s} {s['train_examples_per_sec']:7.1f} examples/s "
                  f"input_wait {s['input_wait_fraction']:.3f} ({time.perf_counter() - started:.0f} s)",
                  flush=True)  # fmt: skip
    base = statistics.median(rates["synthetic"])
    print(f"\nmedian of {args.repeats} interleaved repeats, 2 workers pinned to a core each:")
    print("| variant | examples/s (all workers) | ratio to synthetic | input_wait_fraction |")
    print("|---|---|---|---|")
    for name in rates:
        med = statistics.median(rates[name])
        print(f"| {name} | {med:.1f} | {med / base:.3f} | {statistics.median(waits[name]):.3f} |")


if __name__ == "__main__":
    main()
