"""Data sources and the per-worker input pipeline.

Sharding is by index, before any decoding: every epoch is one seeded permutation of the training
set, cut into `steps_per_epoch` global batches; worker r takes the r-th slice of each global
batch. So in every epoch each example goes to exactly one worker, every worker runs the same
number of full steps, and N workers at batch B see exactly the global batches that one worker
sees at batch N x B (synchronous data parallelism is large-batch training).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from hvd_train.config import Config, Derived
from hvd_train.errors import DataError


@dataclass(frozen=True)
class Source:
    """A dataset held in memory as arrays (inputs float32, labels int32)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def num_train(self) -> int:
        return len(self.x_train)


def load_source(cfg: Config) -> Source:
    """Builds the configured source; identical on every rank (it depends only on the config)."""
    if cfg.data.source == "synthetic":
        return _synthetic(cfg)
    if cfg.data.source == "digits":
        return _digits(cfg)
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
        return tf.data.Dataset.from_tensor_slices(epoch_batches(n, d, rank, epoch, seed, shuffle))

    ds = tf.data.Dataset.range(first_epoch, cfg.train.epochs).flat_map(one_epoch)
    ds = ds.map(lambda i: (tf.gather(x, i), tf.gather(y, i)), num_parallel_calls=tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.experimental_deterministic = True
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


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
    idx = np.concatenate([mine, np.zeros(pad, dtype=mine.dtype)]) if n else np.zeros(pad, int)
    weight = np.concatenate([np.ones(len(mine)), np.zeros(pad)]).astype(np.float32)
    x = source.x_val[idx] if n else np.zeros((pad, *source.input_shape), np.float32)
    y = source.y_val[idx] if n else np.zeros(pad, np.int32)
    ds = tf.data.Dataset.from_tensor_slices((x, y, weight)).batch(batch)
    return ds.prefetch(tf.data.AUTOTUNE), batches
