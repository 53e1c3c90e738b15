"""Run alone: the image sources read through tf.io.gfile give what local paths give.

Usage: gfile_paths.py IDS_FOLDER IDS_TFRECORDS

A `file://` URL goes through the code for remote file systems (gs://, s3://: listing with
tf.io.gfile, records read with GFile seek/read, images checked through GFile); for each source
one epoch of training batches and the validation split must equal those of the plain path.
"""

import sys

import numpy as np

from hvd_train.config import load_config
from hvd_train.data.job import plan_job
from hvd_train.data.pipeline import train_dataset, val_shard
from hvd_train.data.sources import load_source


def batches(source_name: str, folder: str) -> list[np.ndarray]:
    cfg = load_config(None, [
        f"data.source={source_name}", f"data.train_dir={folder}", "data.image_size=[6,6]",
        "train.batch_size=8", "train.epochs=1", "data.validation_fraction=0.25",
    ])  # fmt: skip
    source = load_source(cfg)
    job = plan_job(cfg, source, 1)
    val = val_shard(source, 8, 0, 1)
    return [x.numpy() for x, _ in train_dataset(job, 0)] + [x.numpy() for x, _, _ in val]


for name, folder in (("image_folder", sys.argv[1]), ("tfrecord", sys.argv[2])):
    local, remote = batches(name, folder), batches(name, "file://" + folder)
    assert len(local) == len(remote) > 0, f"{name}: {len(local)} vs {len(remote)} batches"
    for a, b in zip(local, remote, strict=True):
        np.testing.assert_array_equal(a, b, err_msg=f"{name}: file:// differs")
    print(f"gfile {name}: {len(local)} batches equal")
