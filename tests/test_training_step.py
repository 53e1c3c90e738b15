"""The first step's cost: the train step is traced once, and autograph leaves Horovod's code and
hvd_train's own alone, with the same results as before (the seconds these save are in
docs/benchmarks.md; that hvd_train's dataset and evaluation functions trace as graph code
unconverted, every job of the suite shows); and a run without validation examples traces no
validation step."""

from __future__ import annotations

import numpy as np
import pytest

from hvd_train.runtime import (
    distributed,  # noqa: F401 - installs the autograph rule, as the trainer does
)

pytestmark = pytest.mark.stack

CLASSES = 10


def _fit_one_step(active, build_first: bool) -> tuple[int, dict, list[np.ndarray]]:
    """A small compiled model of the active Keras, as the trainer compiles it, fit one step
    from fixed weights and data: how often its train step was traced, its history and its
    weights after the step."""
    keras = active.keras
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    outputs = keras.layers.Dense(CLASSES)(keras.layers.Flatten()(x))
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=False,
    )
    model.optimizer.build(model.trainable_variables)  # as build_for_training does too
    if build_first:
        active.build_for_training(model, (8, 8, 1), CLASSES)
    traced = []
    step = model.train_step
    model.train_step = lambda data: traced.append(1) or step(data)
    rng = np.random.default_rng(0)
    xs = rng.random((16, 8, 8, 1), dtype=np.float32)
    ys = rng.integers(0, CLASSES, 16).astype(np.int32)
    history = model.fit(xs, ys, batch_size=16, epochs=1, shuffle=False, verbose=0).history
    return len(traced), history, model.get_weights()


def test_built_loss_and_metrics_trace_the_step_once_with_the_same_results(each_keras) -> None:
    """Keras creates the loss's and metrics' variables inside the first traced step, and a
    tf.function that creates variables is traced twice; built before, once (Keras 3 and 2).
    The step's loss, accuracy and new weights are the same either way."""
    traces, history, weights = _fit_one_step(each_keras, build_first=True)
    before_traces, before_history, before_weights = _fit_one_step(each_keras, build_first=False)
    assert (traces, before_traces) == (1, 2)
    assert history == before_history
    for got, expected in zip(weights, before_weights, strict=True):
        np.testing.assert_array_equal(got, expected)


def test_autograph_converts_neither_horovods_functions_nor_hvd_trains() -> None:
    import horovod.tensorflow as hvd
    from tensorflow.python.autograph.impl import conversion

    from hvd_train.data import images, pipeline
    from hvd_train.runtime import schedules
    from hvd_train.train import evaluation

    assert conversion.is_allowlisted(hvd.allreduce)
    assert conversion.is_allowlisted(hvd.grouped_allreduce)
    for hvd_trains in (pipeline.epoch_batches, pipeline.model_input, images.decode_image,
                       evaluation.batch_sums, schedules.WarmupScaledMath.__call__):  # fmt: skip
        assert conversion.is_allowlisted(hvd_trains), hvd_trains
    # The rules name Horovod and hvd_train, not everyone: a user's code (a model factory, a
    # callback) is converted as before.
    assert not conversion.is_allowlisted(_fit_one_step)


class _CountedModel:
    """What `Evaluator` reads of a model (a call, its `losses`), noting each call: a trace of
    the validation step calls it."""

    def __init__(self, active) -> None:
        self.calls = 0
        self.losses: list = []
        self.flat = active.keras.layers.Flatten()
        self.dense = active.keras.layers.Dense(CLASSES)

    def __call__(self, x, training: bool = False):
        self.calls += 1
        return self.dense(self.flat(x))


def test_a_run_without_validation_examples_traces_no_validation_step(each_keras) -> None:
    """`data.val_examples: 0` (or a validation_fraction of 0): every rank holds no validation
    example, so none traces the validation step or all-reduces its empty sums; the epoch's
    logs get no val_ metrics. A batch of examples is traced through the same model, so the
    count would see a trace."""
    from hvd_train.data.sources import Source
    from hvd_train.train import evaluation

    rng = np.random.default_rng(0)
    x = rng.random((4, 8, 8, 1), dtype=np.float32)
    y = rng.integers(0, CLASSES, 4).astype(np.int32)
    model = _CountedModel(each_keras)
    evaluation.batch_sums(model, from_logits=True)(x, y, np.ones(4, np.float32))
    assert model.calls > 0, "the count sees a traced validation step"
    model.calls = 0
    none = Source(x, y, x[:0], y[:0], CLASSES)
    assert evaluation.Evaluator(model, none, 16, from_logits=True).evaluate() == {}
    assert model.calls == 0
