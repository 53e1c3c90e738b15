"""Generates the image folders of the data memory benchmark (not in the repo: under --out).

`--out/img4x`: `--classes` class folders of random-content 224x224 JPEGs (smooth colour fields
plus noise, about 30 KB each, like photos at quality 90), `--per-class` each; `--out/img1x`:
hard links to the first quarter of each class (no extra disk). Files already there are reused.

    python lab/data-larger-than-memory/make_image_sets.py --out /work/bench-data --classes 10 --per-class 14000
"""

from __future__ import annotations

import argparse
import io
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np


def _image(seed: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    low = rng.random((7, 7, 3)) * 255  # a smooth colour field, upsampled
    img = np.asarray(Image.fromarray(low.astype(np.uint8)).resize((224, 224), Image.BICUBIC))
    noise = rng.integers(-28, 29, img.shape, dtype=np.int16)
    img = np.clip(img + noise, 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _write_class(args: tuple[str, int, int]) -> int:
    folder, c, n = args
    os.makedirs(folder, exist_ok=True)
    made = 0
    for i in range(n):
        path = os.path.join(folder, f"{i:06d}.jpg")
        if not os.path.exists(path):
            with open(path + ".tmp", "wb") as f:
                f.write(_image(c * 10_000_000 + i))
            os.replace(path + ".tmp", path)
            made += 1
    return made


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="/work/bench-data")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--per-class", type=int, default=14000)
    p.add_argument("--jobs", type=int, default=2)
    a = p.parse_args()
    big = os.path.join(a.out, "img4x")
    jobs = [(os.path.join(big, f"c{c:02d}"), c, a.per_class) for c in range(a.classes)]
    with ProcessPoolExecutor(a.jobs) as pool:
        made = sum(pool.map(_write_class, jobs))
    small = os.path.join(a.out, "img1x")
    for c in range(a.classes):
        src, dst = os.path.join(big, f"c{c:02d}"), os.path.join(small, f"c{c:02d}")
        os.makedirs(dst, exist_ok=True)
        for i in range(a.per_class // 4):
            name = f"{i:06d}.jpg"
            if not os.path.exists(os.path.join(dst, name)):
                os.link(os.path.join(src, name), os.path.join(dst, name))
    print(f"made {made} images; {big}: {a.classes} x {a.per_class}, {small}: a quarter of it")


if __name__ == "__main__":
    main()
