"""Runs on every rank (or alone): iterates the real input pipelines and evaluates a saved model.

Usage: data_exactness.py IDS_FOLDER IDS_TFRECORDS DIGITS_FOLDER MODEL

IDS_FOLDER holds PNGs whose pixel (0, 0) encodes the image's id (red * 256 + green), and
IDS_TFRECORDS the same images converted. For both sources and both remainder modes, each rank
reads two epochs of its training batches and one pass of its validation shard and decodes the
ids it got; rank 0 checks, across ranks, that every image was used as the brief says. Then every
rank evaluates MODEL on DIGITS_FOLDER's validation split with the exact Evaluator, and rank 0
prints the metrics for the test to compare across worker counts.
"""

import json
import sys

from hvd_train.runtime.keras import binding

binding.import_tensorflow()  # as hvd_train's workers import it: base/deferred.py

# isort: split
import numpy as np
import tensorflow as tf

from hvd_train.config import load_config
from hvd_train.data.job import plan_job
from hvd_train.data.pipeline import train_dataset, val_shard
from hvd_train.data.sources import load_source
from hvd_train.runtime import distributed
from hvd_train.train.evaluation import Evaluator

ids_folder, ids_records, digits_folder, model_path = sys.argv[1:5]
distributed.init(load_config(None).horovod, "unused")
rank, world = distributed.rank(), distributed.size()
EPOCHS = 2


def ids_of(x: tf.Tensor) -> list[int]:
    px = np.rint(x.numpy()[:, 0, 0, :] * 255).astype(int)
    return (px[:, 0] * 256 + px[:, 1]).tolist()


def check_source(source_name: str, folder: str, remainder: str) -> None:
    cfg = load_config(None, [
        f"data.source={source_name}", f"data.train_dir={folder}", "data.image_size=[6,6]",
        "data.channels=3", f"data.remainder={remainder}", "train.batch_size=8",
        f"train.epochs={EPOCHS}", "data.validation_fraction=0.25",
    ])  # fmt: skip
    source = load_source(cfg)
    job = plan_job(cfg, source, world)
    d = job.plan
    epochs = [[] for _ in range(EPOCHS)]
    batches = 0
    for step, (x, _) in enumerate(train_dataset(job, rank)):
        assert x.shape[0] == d.per_worker_batch, f"rank {rank}: short batch {x.shape}"
        epochs[step // d.steps_per_epoch].extend(ids_of(x))
        batches += 1
    # A resume in the middle of epoch 1 (the trainer skips the steps done) continues the order.
    done = d.steps_per_epoch // 2
    resumed = [i for x, _ in train_dataset(job, rank, 1).skip(done) for i in ids_of(x)]
    mine_resumed = resumed == epochs[1][done * d.per_worker_batch :]
    val = val_shard(source, d.per_worker_batch, rank, world)
    val_ids = [i for x, _, w in val for i, wi in zip(ids_of(x), w.numpy(), strict=True) if wi > 0]
    mine = {"batches": batches, "epochs": epochs, "val": val_ids, "resumed": mine_resumed}
    everyone = distributed.allgather_object(mine, name=f"ids_{source_name}_{remainder}")
    if rank != 0:
        return
    what = f"{source_name}/{remainder} at {world} workers"
    counts = {r["batches"] for r in everyone}
    assert counts == {d.steps_per_epoch * EPOCHS}, f"{what}: unequal step counts {counts}"
    val_all = [i for r in everyone for i in r["val"]]
    assert len(val_all) == len(set(val_all)) == len(source.y_val), f"{what}: val ids {val_all}"
    train_ids = set(range(source.num_train + len(source.y_val))) - set(val_all)
    for e in range(EPOCHS):
        seen = [i for r in everyone for i in r["epochs"][e]]
        assert len(seen) == d.examples_per_epoch, f"{what}: epoch {e} saw {len(seen)}"
        if remainder == "drop":
            assert len(set(seen)) == len(seen), f"{what}: epoch {e} repeats an example"
            assert set(seen) <= train_ids, f"{what}: epoch {e} used non-training ids"
        else:
            assert set(seen) == train_ids, f"{what}: epoch {e} missed {train_ids - set(seen)}"
            assert len(seen) - len(set(seen)) == d.examples_per_epoch - source.num_train
    first = [i for r in everyone for i in r["epochs"][0]]
    second = [i for r in everyone for i in r["epochs"][1]]
    assert first != second, f"{what}: the epochs were not reshuffled"
    assert all(r["resumed"] for r in everyone), f"{what}: a resume changed the order"
    print(
        f"exact {what}: {d.steps_per_epoch} steps/epoch on every rank, "
        f"{len(set(first))} distinct of {source.num_train} training, {len(val_all)} validation"
    )


def check_stream(source_name: str, folder: str) -> None:
    """data.read: stream: the same full steps on every rank, training examples only."""
    cfg = load_config(None, [
        f"data.source={source_name}", f"data.train_dir={folder}", "data.image_size=[6,6]",
        "data.read=stream", "data.shuffle_buffer=16", "train.batch_size=8",
        f"train.epochs={EPOCHS}", "data.validation_fraction=0.25",
    ])  # fmt: skip
    source = load_source(cfg)
    job = plan_job(cfg, source, world)
    d = job.plan
    seen, batches = [], 0
    for x, _ in train_dataset(job, rank):
        assert x.shape[0] == d.per_worker_batch, f"rank {rank}: short batch {x.shape}"
        seen.extend(ids_of(x))
        batches += 1
    val = val_shard(source, d.per_worker_batch, rank, world)
    val_ids = [i for x, _, w in val for i, wi in zip(ids_of(x), w.numpy(), strict=True) if wi > 0]
    everyone = distributed.allgather_object(
        {"batches": batches, "seen": seen, "val": val_ids}, name=f"stream_{source_name}"
    )
    if rank != 0:
        return
    what = f"{source_name}/stream at {world} workers"
    counts = {r["batches"] for r in everyone}
    assert counts == {d.steps_per_epoch * EPOCHS}, f"{what}: unequal step counts {counts}"
    val_all = {i for r in everyone for i in r["val"]}
    used = {i for r in everyone for i in r["seen"]}
    assert not used & val_all, f"{what}: trained on validation ids {used & val_all}"
    print(f"stream {what}: {d.steps_per_epoch} steps/epoch on every rank, {len(used)} distinct")


for remainder in ("drop", "pad_by_repeat"):
    check_source("image_folder", ids_folder, remainder)
    check_source("tfrecord", ids_records, remainder)
check_stream("image_folder", ids_folder)
check_stream("tfrecord", ids_records)

cfg = load_config(None, [
    "data.source=image_folder", f"data.train_dir={digits_folder}", "data.image_size=[16,16]",
    "data.channels=1", "train.batch_size=16",
])  # fmt: skip
source = load_source(cfg)
model = tf.keras.models.load_model(model_path)
metrics = Evaluator(model, source, 16, from_logits=False).evaluate()
if rank == 0:
    print("eval " + json.dumps({"world": world, "val_examples": len(source.y_val), **metrics}))
