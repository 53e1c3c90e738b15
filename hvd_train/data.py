"""Data sources and the per-worker input pipeline.

Sharding is by index, before any decoding: every epoch is one seeded permutation of the training
set, cut into `steps_per_epoch` global batches; worker r takes the r-th slice of each global
batch. So in every epoch each example goes to exactly one worker, every worker runs the same
number of full steps, and N workers at batch B see exactly the global batches that one worker
sees at batch N x B (synchronous data parallelism is large-batch training).

Image sources (`image_folder`, `tfrecord`) hold one string per example (a file path, or the
encoded bytes) instead of the input itself: a worker decodes only the examples its slice names,
in parallel (autotuned), into uint8 images that become float32 in [0, 1] a batch at a time.
`data.cache: memory` decodes every image once before training instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import tensorflow as tf

from hvd_train.augment import augment_batch_fn
from hvd_train.config import Config, Derived
from hvd_train.errors import DataError


@dataclass(frozen=True)
class Source:
    """A dataset addressed by example index (labels int32).

    In-memory sources hold the inputs in `x_train`/`x_val` (float32, or uint8 images) and no
    `decode`. Image sources hold one string per example there (a file path or encoded bytes)
    and `decode`, which turns one string into a uint8 image of `image_shape`.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    num_classes: int
    decode: Callable | None = None
    image_shape: tuple[int, ...] = ()
    skipped_files: tuple[str, ...] = ()  # corrupt files left out (data.on_corrupt: skip)
    description: str = ""  # one line for the log: where the data came from

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.image_shape if self.decode else tuple(self.x_train.shape[1:])

    @property
    def num_train(self) -> int:
        return len(self.x_train)


def load_source(cfg: Config) -> Source:
    """Builds the configured source; identical on every rank (it depends only on the config)."""
    if cfg.data.source == "synthetic":
        return _synthetic(cfg)
    if cfg.data.source == "digits":
        return _digits(cfg)
    if cfg.data.source in ("image_folder", "tfrecord"):
        from hvd_train.image_sources import load_image_source

        source = load_image_source(cfg)
        return cache_in_memory(source) if cfg.data.cache == "memory" else source
    raise DataError(f"data.source: unknown source {cfg.data.source!r}")  # config rejects first


def _synthetic(cfg: Config) -> Source:
    """Random inputs with labels a fixed random linear map can learn, made once in memory."""
    d = cfg.data
    rng = np.random.default_rng(cfg.runtime.seed)
    shape = tuple(d.image_size) + ((d.channels,) if len(d.image_size) == 2 else ())
    n = d.train_examples + d.val_examples
    x = rng.random((n, *shape), dtype=np.float32)
    # Labels from a random projection of the centred inputs: learnable, so loss can fall.
    proj = rng.standard_normal((int(np.prod(shape)), d.num_classes)).astype(np.float32)
    y = np.argmax((x.reshape(n, -1) - 0.5) @ proj, axis=1).astype(np.int32)
    t = d.train_examples
    return Source(x[:t], y[:t], x[t:], y[t:], d.num_classes)


def _digits(cfg: Config) -> Source:
    """scikit-learn's 1,797 8x8 handwritten digits (shipped in the package), split by seed."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images.astype(np.float32) / 16.0)[..., None]
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(cfg.runtime.seed).permutation(len(x))
    n_val = int(round(len(x) * cfg.data.validation_fraction))
    val, train = order[:n_val], order[n_val:]
    return Source(x[train], y[train], x[val], y[val], 10)


def epoch_batches(n: int, d: Derived, rank: int, epoch: tf.Tensor, seed: int, shuffle: bool):
    """The `[steps_per_epoch, per_worker_batch]` example indices of one worker in one epoch."""
    idx = tf.range(n, dtype=tf.int64)
    if shuffle:
        idx = tf.random.experimental.stateless_shuffle(idx, seed=tf.stack([seed, epoch]))
    need = d.steps_per_epoch * d.global_batch
    if need > n:  # pad_by_repeat: the short last batch is filled from the epoch's first examples
        idx = tf.concat([idx, idx[: need - n]], axis=0)
    idx = tf.reshape(idx[:need], [d.steps_per_epoch, d.world_size, d.per_worker_batch])
    return idx[:, rank, :]


def train_dataset(
    source: Source, cfg: Config, d: Derived, rank: int, first_epoch: int = 0
) -> tf.data.Dataset:
    """Full batches for epochs `first_epoch .. train.epochs-1`, exactly `steps_per_epoch` each."""
    x, y = tf.constant(source.x_train), tf.constant(source.y_train)
    n, seed, shuffle = source.num_train, cfg.runtime.seed, cfg.data.shuffle

    def one_epoch(epoch: tf.Tensor) -> tf.data.Dataset:
        idx = epoch_batches(n, d, rank, epoch, seed, shuffle)
        if source.decode:  # one index at a time, so that decoding runs in parallel
            idx = tf.reshape(idx, [-1])
        return tf.data.Dataset.from_tensor_slices(idx)

    ds = tf.data.Dataset.range(first_epoch, cfg.train.epochs).flat_map(one_epoch)
    if source.decode:
        # Sharded before decoding: this worker reads and decodes only its own examples. Every
        # epoch holds steps x batch of them, so batches never straddle two epochs.
        ds = ds.map(lambda i: (source.decode(tf.gather(x, i)), tf.gather(y, i)), tf.data.AUTOTUNE)
        ds = ds.batch(d.per_worker_batch).map(lambda xb, yb: (model_input(xb), yb))
    else:
        ds = ds.map(
            lambda i: (model_input(tf.gather(x, i)), tf.gather(y, i)),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
    augment = augment_batch_fn(cfg.augment, cfg.runtime.seed, rank)
    if augment is not None:
        # Seeded by (seed, rank, global step): the same augmentation whatever the order of the
        # parallel calls, and again after a resume (the trainer skips batches after this point).
        ds = ds.enumerate(start=first_epoch * d.steps_per_epoch).map(
            lambda step, batch: augment(
                *batch, seed=tf.stack([tf.cast(seed * 1009 + rank, tf.int64), step])
            ),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
    options = tf.data.Options()
    options.experimental_deterministic = True
    ds = ds.with_options(options).prefetch(tf.data.AUTOTUNE)
    if cfg.data.prefetch_to_device and tf.config.get_visible_devices("GPU"):
        # Untested (no GPU here): copies the next batches to this worker's GPU ahead of the step.
        ds = ds.apply(tf.data.experimental.prefetch_to_device("/gpu:0"))
    return ds


def model_input(x: tf.Tensor) -> tf.Tensor:
    """uint8 images to float32 in [0, 1]; float inputs unchanged."""
    return tf.cast(x, tf.float32) / 255.0 if x.dtype == tf.uint8 else x


def cache_in_memory(source: Source) -> Source:
    """`data.cache: memory`: every image decoded once, now, and kept as uint8 arrays.

    The whole training set is kept on every worker, because each epoch's permutation gives a
    worker different examples (5,000 images at 64x64x3 take 61 MB).
    """
    x_train, x_val = _decode_all(source.x_train, source), _decode_all(source.x_val, source)
    size = (x_train.nbytes + x_val.nbytes) / 2**20
    note = f"; data.cache: memory, {size:.0f} MB of decoded images on every worker"
    return replace(
        source, x_train=x_train, x_val=x_val, decode=None, description=source.description + note
    )


def _decode_all(strings: np.ndarray, source: Source) -> np.ndarray:
    out = np.zeros((len(strings), *source.image_shape), np.uint8)
    if len(strings):
        ds = tf.data.Dataset.from_tensor_slices(strings).map(source.decode, tf.data.AUTOTUNE)
        start = 0
        for batch in ds.batch(512).as_numpy_iterator():
            out[start : start + len(batch)] = batch
            start += len(batch)
    return out


def val_shard(source: Source, batch: int, rank: int, world: int) -> tuple[tf.data.Dataset, int]:
    """This worker's validation examples (every world-th, from rank), in fixed-size batches.

    Returns the dataset of `(x, y, weight)` and the number of batches. Padding examples carry
    weight 0, so sums over all workers count each validation example exactly once.
    """
    n = len(source.x_val)
    mine = np.arange(rank, n, world)
    per_worker = -(-n // world)  # ceil: the most any worker holds
    batches = max(1, -(-per_worker // batch))
    pad = batches * batch - len(mine)
    weight = np.concatenate([np.ones(len(mine)), np.zeros(pad)]).astype(np.float32)
    if n:
        idx = np.concatenate([mine, np.zeros(pad, dtype=mine.dtype)])
        ds = tf.data.Dataset.from_tensor_slices((source.x_val[idx], source.y_val[idx], weight))
    else:
        zeros = np.zeros((pad, *source.input_shape), np.float32)
        ds = tf.data.Dataset.from_tensor_slices((zeros, np.zeros(pad, np.int32), weight))
    if source.decode and n:
        ds = ds.map(lambda s, y, w: (source.decode(s), y, w), tf.data.AUTOTUNE)
    ds = ds.batch(batch).map(lambda x, y, w: (model_input(x), y, w))
    return ds.prefetch(tf.data.AUTOTUNE), batches


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
    if source.decode:
        ds = ds.map(lambda s, y, w: (source.decode(s), y, w), tf.data.AUTOTUNE)
    ds = ds.batch(batch).map(lambda x, y, w: (model_input(x), y, w))
    return ds.prefetch(tf.data.AUTOTUNE), mine
