"""augment_batch_fn: shapes, value ranges, and each augmentation doing what it says."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from hvd_train.base.errors import DataError
from hvd_train.config import load_config
from hvd_train.data.augment import augment_batch_fn

X = np.random.default_rng(0).random((16, 8, 6, 3), dtype=np.float32)
Y = np.arange(16, dtype=np.int32)


def fn_for(*overrides: str):
    cfg = load_config(None, list(overrides))
    return augment_batch_fn(cfg.augment, cfg.runtime.seed)


def test_nothing_configured_gives_no_function() -> None:
    assert fn_for() is None
    assert fn_for("augment.flip=horizontal", "augment.flip_probability=0") is None


def test_all_on_keeps_shape_labels_and_range() -> None:
    fn = fn_for("augment.flip=horizontal_and_vertical", "augment.random_crop=2",
                "augment.brightness=0.5", "augment.contrast=0.5")  # fmt: skip
    x, y = fn(X, Y, seed=[1, 2])
    assert x.shape == X.shape and x.dtype == tf.float32
    np.testing.assert_array_equal(y, Y)
    assert float(tf.reduce_min(x)) >= 0.0 and float(tf.reduce_max(x)) <= 1.0
    assert not np.allclose(x, X)


@pytest.mark.parametrize(("flip", "axis"), [("horizontal", 2), ("vertical", 1)])
def test_flip_with_probability_1_flips_every_image(flip: str, axis: int) -> None:
    x, _ = fn_for(f"augment.flip={flip}", "augment.flip_probability=1")(X, Y, seed=[0, 0])
    np.testing.assert_array_equal(x, np.flip(X, axis=axis))


def test_flip_with_probability_one_half_flips_some_images() -> None:
    x, _ = fn_for("augment.flip=horizontal")(X, Y, seed=[3, 4])
    flipped = [np.array_equal(x[i], X[i, :, ::-1]) for i in range(len(X))]
    kept = [np.array_equal(x[i], X[i]) for i in range(len(X))]
    assert all(f or k for f, k in zip(flipped, kept, strict=True))
    assert 0 < sum(flipped) < len(X)


def test_random_crop_is_a_shifted_window_of_the_zero_padded_image() -> None:
    pad = 2
    x, _ = fn_for(f"augment.random_crop={pad}")(X, Y, seed=[5, 6])
    padded = np.pad(X, [(0, 0), (pad, pad), (pad, pad), (0, 0)])
    offsets = set()
    for i in range(len(X)):
        matches = [(t, s) for t in range(2 * pad + 1) for s in range(2 * pad + 1)
                   if np.array_equal(x[i], padded[i, t:t + 8, s:s + 6])]  # fmt: skip
        assert matches, f"image {i} is not a window of its padded original"
        offsets.add(matches[0])
    assert len(offsets) > 1  # each image draws its own offset


def test_brightness_shifts_each_image_by_at_most_the_configured_delta() -> None:
    mid = np.full((16, 4, 4, 3), 0.5, np.float32)  # no clipping at +-0.2
    x, _ = fn_for("augment.brightness=0.2")(mid, Y, seed=[7, 8])
    shift = x.numpy() - 0.5
    per_image = shift.reshape(16, -1)
    np.testing.assert_allclose(per_image, per_image[:, :1].repeat(48, 1), atol=1e-6)
    assert np.abs(shift).max() <= 0.2 + 1e-6 and np.abs(shift).max() > 0.01


def test_contrast_scales_around_each_image_channel_mean() -> None:
    x, _ = fn_for("augment.contrast=0.5")(X, Y, seed=[9, 10])
    mean = X.mean(axis=(1, 2), keepdims=True)
    factor = (x.numpy() - mean) / (X - mean)
    unclipped = (x.numpy() > 0) & (x.numpy() < 1) & (np.abs(X - mean) > 1e-3)
    for i in range(len(X)):
        f = factor[i][unclipped[i]]
        assert 0.5 - 1e-4 <= f.min() and f.max() <= 1.5 + 1e-4
        assert f.max() - f.min() < 1e-3  # one factor per image


def test_same_seed_same_batch_and_unseeded_calls_vary() -> None:
    fn = fn_for("augment.random_crop=2", "augment.flip=horizontal", "augment.brightness=0.1")
    a, _ = fn(X, Y, seed=[1, 1])
    b, _ = fn(X, Y, seed=[1, 1])
    np.testing.assert_array_equal(a, b)
    c, _ = fn(X, Y)
    d, _ = fn(X, Y)
    assert not np.array_equal(c, d)


def test_the_same_seed_gives_the_same_run() -> None:
    """Without explicit seeds, two functions built from the same config draw the same numbers
    (runtime.seed); another rank draws different ones."""
    cfg = load_config(None, ["augment.brightness=0.3"])
    fns = [augment_batch_fn(cfg.augment, cfg.runtime.seed, rank) for rank in (0, 0, 1)]
    runs = [[fn(X, Y)[0].numpy() for _ in range(2)] for fn in fns]
    np.testing.assert_array_equal(runs[0], runs[1])
    assert not np.array_equal(runs[0][0], runs[2][0])


def test_runs_inside_a_parallel_dataset_map() -> None:
    fn = fn_for("augment.flip=horizontal", "augment.random_crop=1", "augment.contrast=0.2")
    ds = tf.data.Dataset.from_tensor_slices((X, Y)).batch(4)
    ds = ds.map(fn, num_parallel_calls=tf.data.AUTOTUNE)
    batches = list(ds)
    assert [tuple(x.shape) for x, _ in batches] == [(4, 8, 6, 3)] * 4
    np.testing.assert_array_equal(np.concatenate([y for _, y in batches]), Y)


def test_flat_inputs_are_a_data_error() -> None:
    with pytest.raises(DataError, match=r"augment: expects batches of images"):
        fn_for("augment.brightness=0.1")(np.zeros((4, 10), np.float32), Y[:4])


def test_training_pipeline_applies_it_seeded_by_step() -> None:
    """In train_dataset: flip with probability 1 mirrors every batch; brightness draws the same
    numbers for the same step when the data is rebuilt from a later epoch (as on a resume)."""
    from dataclasses import replace

    from hvd_train.data.job import plan_job
    from hvd_train.data.pipeline import train_dataset
    from hvd_train.data.sources import load_source

    base = ["data.source=digits", "train.epochs=3"]
    plain_cfg = load_config(None, base)
    job = plan_job(plain_cfg, load_source(plain_cfg), 1)
    plan = job.plan
    plain = next(iter(train_dataset(job, 0)))[0].numpy()
    flip_cfg = load_config(None, [*base, "augment.flip=horizontal", "augment.flip_probability=1"])
    flipped = next(iter(train_dataset(replace(job, cfg=flip_cfg), 0)))[0].numpy()
    np.testing.assert_array_equal(flipped, plain[:, :, ::-1, :])
    bright = replace(job, cfg=load_config(None, [*base, "augment.brightness=0.3"]))
    whole = list(train_dataset(bright, 0).take(plan.steps_per_epoch + 1))
    later = next(iter(train_dataset(bright, 0, first_epoch=1)))
    np.testing.assert_array_equal(whole[plan.steps_per_epoch][0].numpy(), later[0].numpy())
    assert not np.array_equal(whole[0][0].numpy(), plain)
