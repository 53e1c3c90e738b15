"""The per-worker input pipeline: each worker's batches of a source, by example index.

Sharding is by index, before any decoding: every epoch is one seeded permutation of the training
set, cut into `steps_per_epoch` global batches; worker r takes the r-th slice of each global
batch. So in every epoch each example goes to exactly one worker, every worker runs the same
number of full steps, and N workers at batch B see exactly the global batches that one worker
sees at batch N x B (synchronous data parallelism is large-batch training).

Image sources (`image_folder`, `tfrecord`; see `sources`) hold a reference per example (an
index into a table of paths or of record offsets) instead of the input itself: a worker reads
and decodes only the examples its slice names: the references of a batch are read in one call,
the images decoded in parallel (autotuned) into uint8 images that become float32 in [0, 1] a
batch at a time; only the prefetch window is ever decoded.
`data.cache: memory` decodes every image once before training instead. The sources themselves
(`Source`, `load_source`) are in `sources`.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from hvd_train.data.augment import augment_batch_fn
from hvd_train.data.job import Job
from hvd_train.data.sources import Source

__all__ = [
    "train_dataset",
    "to_device",
    "val_shard",
    "batch_shard",
    "model_input",
]


def epoch_batches(job: Job, rank: int, epoch: tf.Tensor):
    """The `[steps_per_epoch, per_worker_batch]` example indices of one worker in one epoch:
    the training examples shuffled by (`runtime.seed`, epoch) when `data.shuffle`."""
    n, plan, seed = job.source.num_train, job.plan, job.cfg.runtime.seed
    idx = tf.range(n, dtype=tf.int64)
    if job.cfg.data.shuffle:
        idx = tf.random.experimental.stateless_shuffle(idx, seed=tf.stack([seed, epoch]))
    need = plan.steps_per_epoch * plan.global_batch
    if need > n:  # pad_by_repeat: the short last batch is filled from the epoch's first examples
        idx = tf.concat([idx, idx[: need - n]], axis=0)
    idx = tf.reshape(idx[:need], [plan.steps_per_epoch, plan.world_size, plan.per_worker_batch])
    return idx[:, rank, :]


def train_dataset(job: Job, rank: int, first_epoch: int = 0) -> tf.data.Dataset:
    """Full batches for epochs `first_epoch .. train.epochs-1`, exactly `steps_per_epoch` each."""
    cfg, plan, source = job.cfg, job.plan, job.source
    x, y = tf.constant(source.x_train), tf.constant(source.y_train)
    seed = cfg.runtime.seed

    def one_epoch(epoch: tf.Tensor) -> tf.data.Dataset:
        idx = epoch_batches(job, rank, epoch)
        if source.decode:  # one index at a time, so that decoding runs in parallel
            idx = tf.reshape(idx, [-1])
        return tf.data.Dataset.from_tensor_slices(idx)

    if cfg.data.read == "stream" and source.decode:
        ds = stream_indices(job, rank, first_epoch)
    else:
        ds = tf.data.Dataset.range(first_epoch, cfg.train.epochs).flat_map(one_epoch)
    if source.decode:
        # Sharded before decoding: this worker reads and decodes only its own examples. Every
        # epoch holds steps x batch of them, so batches never straddle two epochs.
        ds = ds.map(lambda i: (tf.gather(x, i), tf.gather(y, i)))
        ds = source.decoded_batches(ds, plan.per_worker_batch)
        ds = ds.map(lambda xb, yb: (model_input(xb), yb))
    else:
        ds = ds.map(
            lambda i: (model_input(tf.gather(x, i)), tf.gather(y, i)),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
    augment = augment_batch_fn(cfg.augment, cfg.runtime.seed, rank)
    if augment is not None:
        # Seeded by (seed, rank, global step): the same augmentation whatever the order of the
        # parallel calls, and again after a resume (the trainer skips batches after this point).
        ds = ds.enumerate(start=first_epoch * plan.steps_per_epoch).map(
            lambda step, batch: augment(
                *batch, seed=tf.stack([tf.cast(seed * 1009 + rank, tf.int64), step])
            ),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
    options = tf.data.Options()
    options.experimental_deterministic = True
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


def to_device(ds: tf.data.Dataset, prefetch_to_device: bool) -> tf.data.Dataset:
    """`ds` as the step reads it: with `data.prefetch_to_device` and a GPU visible, its next
    batches copied to this worker's GPU ahead of the step. TensorFlow requires that stage to
    be the pipeline's last, so it goes on after every other (the trainer's `skip` and input-wait
    stamp included), right before `fit`. Not run on a GPU by this project."""
    if prefetch_to_device and tf.config.get_visible_devices("GPU"):
        return ds.apply(tf.data.experimental.prefetch_to_device("/gpu:0"))
    return ds


def stream_indices(job: Job, rank: int, first_epoch: int) -> tf.data.Dataset:
    """`data.read: stream`: this worker's training examples, file by file, never ending.

    Files (`source.groups`; without groups, each example is its own file) go to workers
    balanced by example count; a worker interleaves its files, each read in order, repeats them
    (reshuffling the file order every pass) and shuffles within `data.shuffle_buffer`. It takes
    exactly the examples of `steps_per_epoch` full batches per remaining epoch, so every worker
    runs the same number of steps whatever its files hold.
    """
    cfg, plan = job.cfg, job.plan
    mine = assign_files(job.source, plan.world_size, cfg.runtime.seed)[rank]
    seed = cfg.runtime.seed * 1009 + rank * 7919 + first_epoch  # a resume streams anew
    ends = tf.constant(np.cumsum([len(f) for f in mine]), tf.int64)
    starts = tf.concat([[0], ends[:-1]], axis=0)
    flat = tf.constant(np.concatenate(mine).astype(np.int64))
    ds = (
        tf.data.Dataset.range(len(mine))
        .shuffle(len(mine), seed=seed, reshuffle_each_iteration=True)
        .repeat()
        .interleave(
            lambda k: tf.data.Dataset.range(starts[k], ends[k]),
            cycle_length=min(len(mine), 8),
        )
        .map(lambda j: tf.gather(flat, j))
    )
    if cfg.data.shuffle:
        ds = ds.shuffle(cfg.data.shuffle_buffer, seed=seed)
    epochs = cfg.train.epochs - first_epoch
    return ds.take(epochs * plan.steps_per_epoch * plan.per_worker_batch)


def assign_files(source: Source, world: int, seed: int) -> list[list[np.ndarray]]:
    """Each worker's files, as arrays of training-example positions (in file order).

    Largest file first to the worker holding the fewest examples so far, so workers differ by
    at most one file's examples. With fewer files than workers, a worker without a file shares
    one (round robin): every worker must have examples to stream.
    """
    n = source.num_train
    if source.groups is None:  # each example a file of its own: a seeded deal
        order = np.random.default_rng(seed).permutation(n)
        return [[np.sort(order[r::world])] for r in range(world)]
    by_file = np.argsort(source.groups, kind="stable")  # positions, grouped, in order
    _, first, counts = np.unique(source.groups[by_file], return_index=True, return_counts=True)
    files = [by_file[f : f + c] for f, c in zip(first, counts, strict=True)]
    load, out = np.zeros(world, np.int64), [[] for _ in range(world)]
    for k in sorted(range(len(files)), key=lambda k: (-len(files[k]), k)):
        r = int(np.argmin(load))
        out[r].append(files[k])
        load[r] += len(files[k])
    for r in range(world):
        if not out[r]:
            out[r].append(files[r % len(files)])
    return out


def model_input(x: tf.Tensor) -> tf.Tensor:
    """uint8 images to float32 in [0, 1]; float inputs unchanged."""
    return tf.cast(x, tf.float32) / 255.0 if x.dtype == tf.uint8 else x


def val_shard(source: Source, batch: int, rank: int, world: int) -> tf.data.Dataset:
    """This worker's validation examples (every world-th, from rank), in fixed-size batches of
    `(x, y, weight)`: as many batches on every worker, the last filled up with weight-0 copies
    of example 0, so sums over all workers count each validation example exactly once. The
    source holds at least one validation example (a run without any validates nothing:
    train/evaluation.py).
    """
    n = len(source.x_val)
    mine = np.arange(rank, n, world)
    per_worker = -(-n // world)  # ceil: the most any worker holds
    batches = -(-per_worker // batch)
    pad = batches * batch - len(mine)
    weight = np.concatenate([np.ones(len(mine)), np.zeros(pad)]).astype(np.float32)
    idx = np.concatenate([mine, np.zeros(pad, dtype=mine.dtype)])
    ds = tf.data.Dataset.from_tensor_slices((source.x_val[idx], source.y_val[idx], weight))
    ds = source.decoded_batches(ds, batch) if source.decode else ds.batch(batch)
    ds = ds.map(lambda x, y, w: (model_input(x), y, w))
    return ds.prefetch(tf.data.AUTOTUNE)


def batch_shard(
    source: Source, batch: int, rank: int, world: int
) -> tuple[tf.data.Dataset, np.ndarray]:
    """This worker's whole batches of the validation examples: (dataset, their batch numbers).

    The examples are cut into batches of `batch` in index order; worker r takes batches r,
    r + world, ... The last batch is filled up with weight-0 copies of example 0. So every
    example sits in the same place of the same batch at any worker count, and a worker may
    get no batch at all. The dataset yields `(x, y, weight)`.
    """
    n = len(source.x_val)
    mine = np.arange(rank, -(-n // batch), world)
    idx = (mine[:, None] * batch + np.arange(batch)).reshape(-1)
    weight = (idx < n).astype(np.float32)
    idx = np.where(idx < n, idx, 0)
    ds = tf.data.Dataset.from_tensor_slices((source.x_val[idx], source.y_val[idx], weight))
    ds = source.decoded_batches(ds, batch) if source.decode else ds.batch(batch)
    ds = ds.map(lambda x, y, w: (model_input(x), y, w))
    return ds.prefetch(tf.data.AUTOTUNE), mine
