"""The Keras 2 binding: `tf.keras` on TensorFlow 2.15, the `tf_keras` package on 2.16+, with
Horovod's Keras API (`horovod.tensorflow.keras`).

Horovod's Keras API does `from tensorflow import keras` and `from keras import backend` when it
is imported. On TensorFlow 2.16+ both name Keras 3 unless TF_USE_LEGACY_KERAS=1 was set before
TensorFlow loaded, which a run that started on Keras 3 (a `model.factory` that returned a
tf_keras model under `runtime.keras: auto`) did not do. So Horovod's Keras API is imported with
`keras` and `tensorflow.keras` bound to tf_keras for the time of its import, then unbound: a
user's own `import keras` still means what it means.

Every function here has its twin in v3.py (binding.py says which runs).
"""

from __future__ import annotations

import sys
import time
from types import ModuleType
from typing import Any

import horovod.tensorflow as hvd_tf
import tensorflow as tf

from hvd_train.runtime import replicas
from hvd_train.runtime.keras import binding

NAME = binding.KERAS2


def _load_keras() -> ModuleType:
    if not binding.has_keras3():
        return tf.keras
    import tf_keras

    return tf_keras


def _load_horovod_keras(keras: ModuleType) -> ModuleType:
    """horovod.tensorflow.keras, imported with `keras` and `tensorflow.keras` bound to `keras`."""
    if not binding.has_keras3():
        import horovod.tensorflow.keras as hvd

        return hvd
    saved = {n: m for n, m in sys.modules.items() if n == "keras" or n.startswith("keras.")}
    for name in saved:
        del sys.modules[name]
    sys.modules["keras"] = keras
    tf_keras_attr = tf.__dict__.get("keras")
    tf.keras = keras  # `from tensorflow import keras` in Horovod's Keras modules
    try:
        import horovod.tensorflow.keras as hvd
    finally:
        for name in [n for n in sys.modules if n == "keras" or n.startswith("keras.")]:
            del sys.modules[name]
        sys.modules.update(saved)
        if tf_keras_attr is None:
            del tf.keras
        else:
            tf.keras = tf_keras_attr
    return hvd


keras = _load_keras()
hvd = _load_horovod_keras(keras)


def describe() -> str:
    """summary.json's `versions.keras`: `"tf_keras 2.21.0"`, or `"keras 2.15.0"` on 2.15."""
    return binding.describe(NAME)


def seed(value: int) -> None:
    """Python's, NumPy's and TensorFlow's global seeds (Keras 2 draws from them). Dropout and
    the other random layers built from now on draw from a tf.random.Generator each, whose
    state a checkpoint can keep (`random_states`): Keras 2's default, TensorFlow's stateful
    random ops, keeps its position where nothing can read it."""
    keras.backend.experimental.enable_tf_random_generator()
    keras.utils.set_random_seed(value)


def set_precision(policy: str) -> None:
    """The global precision policy the layers built from now on take."""
    keras.mixed_precision.set_global_policy(policy)


def distributed_optimizer(optimizer: Any, fp16: bool, accumulation: int, loss_scale: bool) -> Any:
    """`optimizer` wrapped in Horovod's DistributedOptimizer, and in a LossScaleOptimizer when
    `loss_scale` (mixed_float16).

    The order matters: the LossScaleOptimizer goes outside. It scales the loss, the Horovod
    optimizer inside all-reduces the (scaled) gradients, then they are unscaled; so every rank
    sees the same, all-reduced gradients when the loss scaler decides to skip a step on inf/NaN,
    and the ranks stay identical. (Horovod cannot wrap a LossScaleOptimizer: it rebuilds the
    optimizer from its class and config, which Keras' LossScaleOptimizer does not support.)
    """
    wrapped = hvd.DistributedOptimizer(
        optimizer,
        # Horovod: float16 on the wire halves the bytes; values are cast back after the sum.
        compression=hvd.Compression.fp16 if fp16 else hvd.Compression.none,
        # Horovod: sum `accumulation` batches locally, all-reduce once, divide: the update is the
        # mean gradient over the effective batch, as one step of that batch would give.
        backward_passes_per_step=accumulation,
        average_aggregated_gradients=accumulation > 1,
        # Horovod: the window's sums are dense; an Embedding's IndexedSlices are made dense
        # too (Horovod refuses them otherwise when it accumulates).
        sparse_as_dense=accumulation > 1,
    )
    _average_in_apply_gradients(wrapped)
    if not loss_scale:
        return wrapped
    scaler = keras.mixed_precision.LossScaleOptimizer(wrapped)
    _average_before_the_loss_scaler(scaler, wrapped)
    return scaler


def _average_in_apply_gradients(optimizer: Any) -> None:
    """Horovod's Keras 2 DistributedOptimizer all-reduces in `compute_gradients` (which Keras'
    own `train_step` reaches through `minimize`) and not in `apply_gradients`: a `train_step`
    of the user's that computes its gradients with a GradientTape and calls
    `self.optimizer.apply_gradients(zip(grads, vars))`, as Keras 2's guide "Customizing what
    happens in fit()" writes it, applied each rank's own gradients, and the ranks parted.
    Here `apply_gradients` all-reduces the gradients it is given unless `compute_gradients`
    did so in the same step (set as the step is traced: the one runs just before the other).
    Instance attributes, not a subclass: Horovod's methods call `super(self.__class__, self)`."""
    compute, apply = optimizer._compute_gradients, optimizer.apply_gradients
    optimizer._hvd_train_reduced = False

    def _compute_gradients(*args: Any, **kwargs: Any) -> Any:
        optimizer._hvd_train_reduced = True
        return compute(*args, **kwargs)

    def apply_gradients(grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        if not optimizer._hvd_train_reduced:
            grads, variables = zip(*grads_and_vars, strict=True)
            grads_and_vars = list(
                zip(optimizer._allreduce(grads, variables), variables, strict=True)
            )
        optimizer._hvd_train_reduced = False
        return apply(grads_and_vars, *args, **kwargs)

    optimizer._compute_gradients, optimizer.apply_gradients = _compute_gradients, apply_gradients


def _average_before_the_loss_scaler(scaler: Any, wrapped: Any) -> None:
    """A `train_step` of the user's calls the LossScaleOptimizer's `apply_gradients` with its
    own gradients, and the loss scaler checks them before `wrapped` would all-reduce them: a
    rank whose gradients overflowed skipped the step, and its all-reduce, alone, and the others
    waited for it in theirs. Here the scaler's `apply_gradients` all-reduces first (unless
    `compute_gradients` did, in Keras' own step), so every rank's scaler sees the same
    averages and skips the same steps."""
    apply = scaler.apply_gradients

    def apply_gradients(grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        if not wrapped._hvd_train_reduced:
            grads, variables = zip(*grads_and_vars, strict=True)
            grads_and_vars = list(zip(wrapped._allreduce(grads, variables), variables, strict=True))
            wrapped._hvd_train_reduced = True  # `wrapped.apply_gradients` does not again
        try:
            return apply(grads_and_vars, *args, **kwargs)
        finally:
            wrapped._hvd_train_reduced = False  # also where the scaler skipped the step

    scaler.apply_gradients = apply_gradients


def inner_optimizer(optimizer: Any) -> Any:
    """The optimizer under mixed_float16's LossScaleOptimizer (the optimizer itself otherwise)."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def build_for_training(model: Any, input_shape: tuple[int, ...], num_classes: int) -> None:
    """Creates the optimizer's, the loss's and the metrics' variables before the first step.

    Keras would create them inside the first traced step, and a tf.function that creates
    variables is traced twice (once to create them, once more without): with Horovod's
    all-reduce in it, each trace costs seconds of every job's start-up (docs/benchmarks.md,
    "Start-up"). Built from the shapes `compile` was given for: one output
    of `num_classes` scores and sparse integer labels, as `fit` then sees them. The optimizer's
    slots must also exist on every rank before a resume restores or broadcasts them.

    A subclassed model, whose layers are built at its first call, is called once on a batch of
    zeros first: its variables must exist before the optimizer's slots are made for them.
    """
    if not model.built:
        model(tf.zeros((1, *input_shape)), training=False)
    model.optimizer.build(model.trainable_variables)
    helper = _window(model)
    if helper is not None and not helper.locally_aggregated_grads:
        # Horovod creates each sum at the first step, inside the traced step: then a resume
        # could not give a rank its sums before the step that ends the window. Created here,
        # one per trainable variable in the order the step's gradients come in (a gradient
        # that is None leaves its sum at zero, and Horovod's count of sums is then right).
        helper.locally_aggregated_grads = {
            i: tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False)
            for i, v in enumerate(model.trainable_variables)
        }
    y_pred = tf.zeros((1, num_classes))
    model.compiled_loss.build(y_pred)
    model.compiled_metrics.build(y_pred, tf.zeros((1,), tf.int64))


def broadcast_model(model: Any) -> None:
    """Rank 0's replicated state on every rank: weights, optimizer state, the dynamic loss
    scale (a collective; runtime/replicas.py)."""
    replicas.broadcast(model)


def _window(model: Any) -> Any:
    """Horovod's accumulation helper (its counter and sums), or None without accumulation."""
    return getattr(inner_optimizer(model.optimizer), "_agg_helper", None)


def accumulation_sums(model: Any) -> tuple[Any, ...]:
    """Each rank's running gradient sums of the accumulation window (none without one)."""
    helper = _window(model)
    sums = helper.locally_aggregated_grads if helper is not None else {}
    return tuple(sums[i] for i in sorted(sums))


def mid_window(model: Any) -> bool:
    """Whether the accumulation window is part-way: its sums hold batches not yet applied."""
    helper = _window(model)
    return helper is not None and int(helper.counter.numpy()) != 0


def start_window(model: Any, restart: bool = False) -> None:
    """After a restore and broadcast: the window's position from the step counter, which
    every rank holds alike and which counts every batch (mixed_float16, whose skipped steps
    would not count, is refused with accumulation: config/rules.py). `restart` (a Horovod
    Elastic reset): the part-done window starts again, its sums zeroed."""
    helper = _window(model)
    if helper is None:
        return
    iterations = int(inner_optimizer(model.optimizer).iterations.numpy())
    helper.counter.assign(0 if restart else iterations % helper.backward_passes_per_step)
    if restart:
        for total in accumulation_sums(model):
            total.assign(tf.zeros_like(total))


def moving_statistics(model: Any) -> list[Any]:
    """The moving mean and variance of each BatchNormalization layer that is each rank's own
    (not a `SyncBatchNormalization`, hvd_train's or Horovod's)."""
    found = []
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, keras.layers.BatchNormalization) and not isinstance(
            layer, (SyncBatchNormalization, hvd_tf.SyncBatchNormalization)
        ):
            found += [layer.moving_mean, layer.moving_variance]
    return found


class _BroadcastAfterFirstBatch(keras.callbacks.Callback):
    """Rank 0's replicated state on every rank after the first batch: anything the first
    step created (the model was broadcast before `fit`), as Horovod's
    BroadcastGlobalVariablesCallback does for the model's and optimizer's `variables`."""

    def __init__(self) -> None:
        super().__init__()
        self._supports_tf_logs = True  # it reads no logs: Keras 2 need not convert them for it
        self.done = False

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if not self.done:
            self.done = True
            replicas.broadcast(self.model)


def broadcast_callback() -> Any:
    return _BroadcastAfterFirstBatch()


# Each batch hook, and the older hook Keras 2's default of it calls (`on_batch_end` for
# `on_train_batch_end`); test and predict have none.
_BATCH_HOOKS = {
    f"on_{mode}_batch_{when}": (f"on_batch_{when}",) if mode == "train" else ()
    for mode in ("train", "test", "predict")
    for when in ("begin", "end")
}


class CallbackList(keras.callbacks.CallbackList):
    """Keras 2's CallbackList, but a batch hook calls only the callbacks that act on it.

    Once any callback has a batch hook, Keras 2 calls every callback's hook at every step, and
    most of those are defaults that do nothing (Keras' own History, Horovod's metric average,
    hvd_train's callbacks that act at an epoch's end): about two dozen Python calls a step.
    Here the hooks that act are found once. Keras' timing of the first batches, for its
    slow-callback warning, and its conversion of the logs stay as Keras 2 does them (no
    conversion where every callback with a batch hook takes tensor logs, `_supports_tf_logs`)."""

    def __init__(self, callbacks: list[Any] | None = None, **kwargs: Any) -> None:
        super().__init__(callbacks, **kwargs)
        self._find_acting()

    def append(self, callback: Any) -> None:
        super().append(callback)
        self._find_acting()

    def _find_acting(self) -> None:
        self._acting = {
            hook: [getattr(cb, hook) for cb in self.callbacks if _acts(cb, hook, *older)]
            for hook, older in _BATCH_HOOKS.items()
        }

    def _call_batch_hook_helper(self, hook_name: str, batch: int, logs: Any) -> None:
        # Keras 2's own helper, with the hooks that act in place of every callback's.
        start = time.time() if self._check_timing else None
        logs = self._process_logs(logs, is_batch_hook=True)
        for hook in self._acting[hook_name]:
            hook(batch, logs)
        if start is not None:  # Keras' first batches, timed for its warning
            self._hook_times.setdefault(hook_name, []).append(time.time() - start)


def _acts(callback: Any, hook: str, *older: str) -> bool:
    """Whether `hook` (or an `older` one its default calls) is more than a default that does
    nothing (Keras' marker, `_is_default`, which hvd_train's base callback sets on its own
    defaults too). A training hook never acts where the callback answers Keras' own question,
    `_implements_train_batch_hooks`, with no (hvd_train's checkpoint and sync points, when the
    config sets no mid-epoch point)."""
    if hook.startswith("on_train_") and not callback._implements_train_batch_hooks():
        return False
    return not all(getattr(getattr(callback, h), "_is_default", False) for h in (hook, *older))


def fit_callbacks(callbacks: list[Any], model: Any, verbose: int, epochs: int, steps: int) -> Any:
    """What `fit` takes as `callbacks=`: `CallbackList` (Keras' History added, and its bar when
    `verbose`), made for `epochs` and `steps` as Keras 2's `fit` makes its own. Its callbacks
    that take tensor logs (`_supports_tf_logs`) get the logs as tensors, as in Keras' own."""
    return CallbackList(
        callbacks, add_history=True, add_progbar=verbose != 0, model=model, verbose=verbose,
        epochs=epochs, steps=steps,
    )  # fmt: skip


def metric_average_callback() -> Any:
    """Horovod's callback that averages the epoch's training metrics over the workers."""
    return hvd.callbacks.MetricAverageCallback()


def last_learning_rate(optimizer: Any) -> float:
    """The rate the optimizer's last step used (Keras 2 keeps it as `learning_rate`)."""
    return float(optimizer.learning_rate)


def per_example_loss(from_logits: bool) -> Any:
    """The sparse categorical cross-entropy of each example (no reduction)."""
    return keras.losses.SparseCategoricalCrossentropy(
        from_logits=from_logits, reduction=keras.losses.Reduction.NONE
    )


def checkpoint(model: Any) -> tf.train.Checkpoint:
    """What a resumable checkpoint holds: the model's and the optimizer's variables (weights,
    slots, the step counter that drives the learning-rate schedule)."""
    return tf.train.Checkpoint(model=model, optimizer=model.optimizer)


def random_states(model: Any) -> list[Any]:
    """The states of the random layers' generators (dropout), which advance at every draw;
    not among the model's variables. Each rank keeps its own."""
    found = []
    for layer in model._flatten_layers(include_self=False, recursive=True):
        generator = getattr(getattr(layer, "_random_generator", None), "_generator", None)
        if generator is not None:
            found.append(generator.state)
    return found


def rank_random_state(state: Any, rank: int) -> Any:
    """A Philox generator's state [counter, counter, key] moved to `rank`'s own stream (rank
    0's kept): another key."""
    moved = state.copy()
    moved[-1] = (int(state[-1]) + rank * 0x9E3779B9) % 2**62
    return moved


def save_plain(model: Any, path: str) -> None:
    """Writes `model` (a plain clone: no optimizer) to `path` (.keras)."""
    model.save(path)


# A subclassed model (no clone): Keras 3 saves it as .keras; Keras 2 as a SavedModel folder.
SUBCLASSED_AS_KERAS = False


def save_subclassed(model: Any, path: str) -> None:
    """A subclassed model, which cannot be cloned: a SavedModel folder without the optimizer."""
    model.save(path, save_format="tf", include_optimizer=False)


def load_model(path: str) -> Any:
    """A saved model (model.keras, best.keras, a SavedModel folder), uncompiled."""
    return keras.models.load_model(path, compile=False)


def export(model: Any, path: str, fmt: str, spec: tf.TensorSpec) -> None:
    """Keras 2 has no `model.export` to ONNX or LiteRT: one traced inference function, written
    by TensorFlow (SavedModel, LiteRT) or tf2onnx."""
    serve = tf.function(lambda images: model(images, training=False), input_signature=[spec])
    if fmt == "saved_model":
        tf.saved_model.save(model, path, signatures={"serving_default": serve})
    elif fmt == "onnx":
        import tf2onnx  # the extra hvd_train[export]

        tf2onnx.convert.from_function(serve, input_signature=[spec], output_path=path)
    else:
        converter = tf.lite.TFLiteConverter.from_concrete_functions(
            [serve.get_concrete_function()], model
        )
        with open(path, "wb") as f:
            f.write(converter.convert())


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """BatchNormalization whose batch statistics are the global batch's: each worker's mean
    and mean of squares are averaged over the workers with one all-reduce (every worker's batch
    has the same size, so the average is the global batch's), inside the traced step."""

    def __init__(self, fused: bool | None = False, **kwargs: Any):
        super().__init__(fused=False, **kwargs)

    def _moments(self, inputs: Any, reduction_axes: Any, keep_dims: bool, **kwargs: Any) -> Any:
        mean, variance = super()._moments(inputs, reduction_axes, keep_dims=keep_dims, **kwargs)
        return _global_moments(mean, variance)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.pop("fused", None)
        return config


def _global_moments(mean: tf.Tensor, variance: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The global batch's moments from each worker's (Var[X] = E[X^2] - E[X]^2)."""
    if hvd_tf.size() == 1:
        return mean, variance
    stacked = tf.stack([mean, variance + tf.square(mean)])
    total = hvd_tf.allreduce(stacked, op=hvd_tf.Sum, name=None) / hvd_tf.size()
    global_mean, mean_of_square = tf.unstack(total)
    return global_mean, mean_of_square - tf.square(global_mean)


def elastic_state(model: Any, **position: Any) -> Any:
    """Horovod Elastic's state: the replicated state, and the run's position."""
    return replicas.ElasticState(model, **position)
