"""Random augmentation of training batches, configured by the `augment` section.

`augment_batch_fn(cfg.augment, cfg.runtime.seed)` returns a function for `dataset.map(fn, num_parallel_calls=AUTOTUNE)`
over batches `(x, y)` of float images in [0, 1], shaped `[batch, height, width, channels]`, so
the work runs on each worker's input threads, in parallel with training. Each example draws
its own crop offset, flips, brightness and contrast. All random numbers come from stateless
ops: pass `seed` (two integers, for example `(epoch, step)`) and the batch is augmented the
same way every time; without it, a generator seeded from `runtime.seed` (and the worker's
rank) supplies the seeds, so runs are seeded but the parallel map may hand them to batches in
any order.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from hvd_train.base.errors import DataError
from hvd_train.config import AugmentConfig

BatchFn = Callable[..., tuple[tf.Tensor, tf.Tensor]]


def augment_batch_fn(a: AugmentConfig, seed: int, rank: int = 0) -> BatchFn | None:
    """`fn(x, y, seed=None) -> (x, y)` applying the `augment` section, or None when it does
    nothing.

    Args:
        a: the `augment` section: what to do.
        seed: `runtime.seed`, which seeds it.
        rank: this worker's rank, so that workers draw different numbers. Defaults to 0.
    """
    if not _enabled(a):
        return None
    generator = tf.random.Generator.from_seed(seed).split(rank + 1)[rank]

    def fn(x: tf.Tensor, y: tf.Tensor, seed: tf.Tensor | None = None):
        x = tf.convert_to_tensor(x, tf.float32)
        if x.shape.rank != 4:
            raise DataError(
                f"augment: expects batches of images [batch, height, width, channels], got "
                f"shape {x.shape}; turn the augment section off for this data"
            )
        if seed is None:
            seed = generator.make_seeds(1)[:, 0]
        return augment_images(x, a, seed), y

    return fn


def _enabled(a: AugmentConfig) -> bool:
    flips = a.flip != "none" and a.flip_probability > 0
    return flips or a.random_crop > 0 or a.brightness > 0 or a.contrast > 0


def augment_images(x: tf.Tensor, a: AugmentConfig, seed: tf.Tensor) -> tf.Tensor:
    """Crop, flip, brightness, contrast, in that order, then clip to [0, 1]."""
    # One row of uniform numbers per example: crop rows, crop cols, flip h, flip v, bright, contrast.
    u = tf.random.stateless_uniform([tf.shape(x)[0], 6], seed=tf.cast(seed, tf.int64))
    if a.random_crop:
        x = _random_crop(x, a.random_crop, u[:, 0], u[:, 1])
    if a.flip in ("horizontal", "horizontal_and_vertical"):
        x = _where_each(u[:, 2] < a.flip_probability, tf.reverse(x, [2]), x)
    if a.flip in ("vertical", "horizontal_and_vertical"):
        x = _where_each(u[:, 3] < a.flip_probability, tf.reverse(x, [1]), x)
    if a.brightness:
        x = x + _per_image(a.brightness * (2.0 * u[:, 4] - 1.0))
    if a.contrast:
        mean = tf.reduce_mean(x, axis=[1, 2], keepdims=True)  # per image and channel
        x = mean + (x - mean) * _per_image(1.0 + a.contrast * (2.0 * u[:, 5] - 1.0))
    return tf.clip_by_value(x, 0.0, 1.0)


def _random_crop(x: tf.Tensor, pad: int, u_rows: tf.Tensor, u_cols: tf.Tensor) -> tf.Tensor:
    """Zero-pads `pad` pixels on each side, then cuts each image back at its own offset."""
    h, w = tf.shape(x)[1], tf.shape(x)[2]
    padded = tf.pad(x, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
    top = tf.minimum(tf.cast(u_rows * (2 * pad + 1), tf.int32), 2 * pad)
    left = tf.minimum(tf.cast(u_cols * (2 * pad + 1), tf.int32), 2 * pad)
    rows = top[:, None] + tf.range(h)[None, :]  # [batch, h]
    cols = left[:, None] + tf.range(w)[None, :]  # [batch, w]
    out = tf.gather(padded, rows, axis=1, batch_dims=1)  # [batch, h, w + 2 pad, c]
    return tf.gather(out, cols, axis=2, batch_dims=1)


def _where_each(mask: tf.Tensor, a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    return tf.where(mask[:, None, None, None], a, b)


def _per_image(v: tf.Tensor) -> tf.Tensor:
    return v[:, None, None, None]
