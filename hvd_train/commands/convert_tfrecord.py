"""`hvd-train convert-tfrecord`: an image folder written as sharded TFRecord files."""

from __future__ import annotations

import argparse


def main(argv: list[str], prog: str) -> int:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Write an image folder (one sub-folder per class) as sharded TFRecord "
        "files for data.source: tfrecord (layout: docs/data.md).",
        epilog="Docs: docs/data.md",
    )
    p.add_argument("src", metavar="SRC_IMAGE_FOLDER", help="training images, a folder per class")
    p.add_argument("dst", metavar="DST", help="output folder: DST/train (and DST/val)")
    p.add_argument("--shards", type=int, default=8, help="files per split (default 8)")
    p.add_argument(
        "--val-dir", default="", metavar="FOLDER",
        help="validation images, a folder per class, written to DST/val; without it, training "
        "holds out data.validation_fraction of DST/train, as for the image folder itself",
    )  # fmt: skip
    p.add_argument(
        "--on-corrupt", choices=["error", "skip"], default="error",
        help="files that are not readable JPEG/PNG: stop naming them all (default), or leave them "
        "out, listed in DST/train/skipped.txt",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.shards < 1:
        p.error(f"--shards: expected a value >= 1, got {args.shards}")
    from hvd_train.base import logs

    logs.quiet_tensorflow()
    from hvd_train.data.tfrecords import convert

    convert(args.src, args.dst, args.shards, args.val_dir, args.on_corrupt)
    return 0
