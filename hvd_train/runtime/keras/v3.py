"""The Keras 3 binding: `import keras` (TensorFlow 2.16+, its TensorFlow backend) trained with
Horovod's TensorFlow ops.

Horovod's own Keras API cannot train Keras 3: its callbacks and its DistributedGradientTape call
`.ref()` on Keras 3 variables, which have none (horovod#4290), and its DistributedOptimizer
wraps Keras 2's optimizer API. So the pieces are written here on `horovod.tensorflow`'s
all-reduce and broadcast, once: `hvd_train.horovod` makes them public under Horovod's names
and arguments (docs/horovod.md), and `hvd_train.keras3` under shorter ones for users' own
`model.fit` scripts (docs/models.md, examples/keras3_fit.py):

- `DistributedOptimizer(optimizer)`: the same optimizer class (name, module, config), whose
  `apply` averages the gradients over the workers first, so clipping, weight decay and the
  loss scaler's finiteness check all see the averaged gradients;
- `reduce_gradients(grads, variables, Reduction(...))`: that all-reduce, with Horovod's
  arguments (groups, local variables, compression, scaling), which `hvd_train.horovod`'s
  DistributedGradientTape calls too;
- `BroadcastInitialState()`: rank 0's weights and optimizer state on every rank, as training
  begins (Horovod's `BroadcastGlobalVariablesCallback`);
- `MetricAverage()`: each epoch's training metrics averaged over the workers (Horovod's
  `MetricAverageCallback`);
- `warmup(...)`: the learning rate scaled by the worker count, reached over a warm-up, inside
  the optimizer's schedule;
- `SyncBatchNormalization`: batch statistics of the global batch.

Keras 3 notes this binding acts on: `model.variables` holds the dropout layers' seed generator
states beside the weights, and a broadcast of them would give every rank the same dropout masks:
`model.weights` is broadcast, and the seed states are each rank's own (`random_states`). A
`jit_compile` left on "auto" compiles the whole step with XLA on a GPU, all-reduce included,
which XLA cannot do with this Horovod: hvd_train always passes it explicitly.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any

import horovod.tensorflow as hvd_tf
import keras
import numpy as np
import tensorflow as tf
from keras.src.utils import python_utils  # Keras' own test and conversion of a step's logs

from hvd_train.base import xla_env
from hvd_train.runtime import distributed, replicas, xla
from hvd_train.runtime.keras import binding
from hvd_train.runtime.schedules import schedule_class, warmup_scaled

NAME = binding.KERAS3
keras = keras  # the binding's Keras, as v2.keras
# Registered now, not at the first `warmup`: `load_model` of a file whose optimizer holds the
# schedule (a user's `model.save`) then works wherever this module is imported.
WarmupScaled = schedule_class(keras)


def describe() -> str:
    """summary.json's `versions.keras`: `"keras 3.15.1"`."""
    return binding.describe(NAME)


def seed(value: int) -> None:
    """Python's, NumPy's, TensorFlow's and Keras' global seeds."""
    keras.utils.set_random_seed(value)


def set_precision(policy: str) -> None:
    """The global dtype policy the layers built from now on take."""
    keras.mixed_precision.set_global_policy(policy)


def init() -> None:
    """Starts Horovod (`horovod.tensorflow.init`) and gives this worker its device: on a host
    with GPUs, the one its local rank names (memory growth on), as Horovod's own recipe does;
    on a host without, TensorFlow's thread pools sized to this worker's share of the cores.
    A user script's first call, before TensorFlow runs anything (hvd_train's trainer starts
    Horovod with its config's knobs instead: runtime/distributed.py)."""
    hvd_tf.init()
    try:
        distributed.configure_devices(0, 0)
    except RuntimeError as e:  # TensorFlow's "cannot be modified after initialization"
        raise RuntimeError(
            f"init() must come before TensorFlow runs anything (a model, a tensor): {e}"
        ) from None


# --------------------------------------------------------------------------- the optimizer


@dataclasses.dataclass(frozen=True)
class Reduction:
    """How gradients are all-reduced: Horovod's DistributedOptimizer and DistributedGradientTape
    arguments, one value for both (`reduce_gradients`).

    `op` None is Average; `compression` None is float16 when `fp16` else none; `prescale` and
    `postscale` scale before and after the sum; `groups` None is one all-reduce group, a
    number N is N groups of consecutive gradients, a tuple of tuples of variables each a group
    (the rest a group each); `device` and `name` place and name the all-reduces; `local` holds
    the variables whose gradient is each rank's own (not all-reduced), scaled by 1/size when
    `scale_local`.
    """

    op: Any = None
    compression: Any = None
    fp16: bool = False
    prescale: float = 1.0
    postscale: float = 1.0
    groups: Any = None
    device: str = ""
    name: str | None = None
    local: tuple[Any, ...] = ()
    scale_local: bool = True

    def with_local(self, var: Any) -> Reduction:
        """This reduction with `var`'s gradient kept each rank's own."""
        return dataclasses.replace(self, local=(*self.local, var))


def reduce_gradients(grads: list[Any], variables: list[Any] | None, how: Reduction) -> list[Any]:
    """`grads` (of `variables`, in order; None stays None) all-reduced over the workers as `how`
    says: one grouped all-reduce, or one per tensor in a step XLA compiles whole. Sparse
    gradients are all-reduced dense (the sums are the same). At one worker nothing is
    all-reduced, but the gradients wait for each other (`_after_all`)."""
    present = [i for i, g in enumerate(grads) if g is not None]
    if not present:
        return list(grads)
    if hvd_tf.size() == 1:
        return _after_all(grads, present)
    if how.local and (own := _local_positions(grads, variables, how.local)):
        out = reduce_gradients([None if i in own else g for i, g in enumerate(grads)], variables,
                               how)  # fmt: skip
        scale = 1.0 / hvd_tf.size() if how.scale_local else 1.0
        for i in own:
            out[i] = _scaled(grads[i], scale)
        return out
    dense = [tf.convert_to_tensor(grads[i]) for i in present]  # IndexedSlices: dense
    compression = how.compression or (
        hvd_tf.Compression.fp16 if how.fp16 else hvd_tf.Compression.none
    )
    kwargs = {"op": how.op or hvd_tf.Average, "compression": compression}
    if (how.prescale, how.postscale) != (1.0, 1.0):
        kwargs.update(prescale_factor=how.prescale, postscale_factor=how.postscale)
    averaged: list[Any] = [None] * len(dense)
    # Named as Horovod's own names its all-reduces (in its timeline).
    with tf.name_scope(f"{how.name or 'DistributedGradientTape'}_Allreduce"), tf.device(how.device):
        if _compiled_by_xla():  # XLA has a kernel for HorovodAllreduce alone
            averaged = [hvd_tf.allreduce(g, **kwargs) for g in dense]
        else:
            for group in _group_positions(present, variables, how.groups):
                reduced = hvd_tf.grouped_allreduce([dense[k] for k in group], **kwargs)
                for k, g in zip(group, reduced, strict=True):
                    averaged[k] = g
    out = list(grads)
    for i, g in zip(present, averaged, strict=True):
        out[i] = g
    return out


def _scaled(g: Any, scale: float) -> Any:
    if scale == 1.0:
        return g
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(g.values * scale, g.indices, g.dense_shape)
    return tf.convert_to_tensor(g) * scale


def ids_of(variables: Any) -> set[int]:
    """The ids of `variables` and of the TensorFlow variables they hold (a Keras 3 Variable's
    `.value`): either may be what a caller or a tape holds."""
    return {id(v) for v in variables} | {id(replicas.tf_variable(v)) for v in variables} - {
        id(None)
    }


def _local_positions(grads: list[Any], variables: list[Any] | None, local: Any) -> set[int]:
    """The positions in `grads` of the variables in `local` that have a gradient."""
    ids = ids_of(local)
    return {
        i for i, v in enumerate(variables or [])
        if grads[i] is not None and ids_of([v]) & ids
    }  # fmt: skip


def _group_positions(
    present: list[int], variables: list[Any] | None, groups: Any
) -> list[list[int]]:
    """The positions in `present` of each all-reduce group: one group, or Horovod's `groups` (a
    number of groups of consecutive gradients, or lists of variables, each a group, the rest
    a group each). Grouping changes how tensors are fused, not the sums."""
    if not groups:
        return [list(range(len(present)))]
    if isinstance(groups, int):
        size = -(-len(present) // groups)
        return [list(range(k, min(k + size, len(present)))) for k in range(0, len(present), size)]
    where = {i: k for k, i in enumerate(present)}
    found, taken = [], set()
    for members in groups:
        ids = ids_of(members)
        group = [
            where[i] for i, v in enumerate(variables or []) if i in where and ids_of([v]) & ids
        ]
        group = [k for k in group if k not in taken]
        if group:
            found.append(group)
            taken.update(group)
    return found + [[k] for k in range(len(present)) if k not in taken]


class Averaging:
    """Mixed in before a Keras 3 optimizer class: `apply` averages the gradients over the
    workers, then the optimizer's own `apply` runs on the averages. With `accumulation` A > 1,
    A batches' gradients are summed locally and all-reduced once, as one update of the mean
    gradient over the A batches (Horovod's `backward_passes_per_step`). The step counter counts
    every batch (a step the loss scaler skips too), so the learning-rate schedule runs per
    batch.

    The window's position (`_hvd_count`, batches seen) is in the checkpoint, and so replicated
    state (runtime/replicas.py): every rank holds rank 0's after a resume, and all-reduce at
    the same batch. The running sums (`accumulation_sums`) are each rank's own: a checkpoint
    taken mid-window keeps every rank's (train/callbacks/random_states.py). A gradient that is
    None in the step stays None in the update: a weight that got no gradient is not updated,
    nor decayed.
    """

    _hvd_accumulation = 1
    # How the gradients are all-reduced (`Reduction`: Horovod's DistributedOptimizer
    # arguments; the trainer's optimizer keeps the defaults and its fp16), and whether the
    # window applies its mean (True) or its sum (Horovod's default without
    # average_aggregated_gradients).
    _hvd_reduction = Reduction()
    _hvd_window_mean = True
    _hvd_variables: list[Any] | None = None

    def distribute(
        self, accumulation: int = 1, reduction: Reduction | None = None, window_mean: bool = True
    ) -> None:
        """How this optimizer all-reduces, as `DistributedOptimizer` sets it before it is built:
        `accumulation` batches a window, `reduction` (Horovod's arguments: `Reduction`), and
        whether a window applies its mean (else its sum)."""
        self._hvd_accumulation = int(accumulation)
        self._hvd_window_mean = bool(window_mean)
        # Past Keras' attribute tracking: a reduction's groups and local variables are the model's.
        object.__setattr__(self, "_hvd_reduction", reduction or Reduction())

    def window_sums(self) -> tuple[Any, ...]:
        """This rank's running gradient sums of the accumulation window (none without one)."""
        return tuple(getattr(self, "_hvd_sums", ()))

    def mid_window(self) -> bool:
        """Whether the accumulation window is part-way: its sums hold batches not yet applied."""
        count = getattr(self, "_hvd_count", None)
        return count is not None and int(count.numpy()) % self._hvd_accumulation != 0

    def restart_window(self) -> None:
        """The part-done window starts again at its first batch, its sums zeroed."""
        count = getattr(self, "_hvd_count", None)
        if count is not None:
            count.assign(count - count % self._hvd_accumulation)
            for total in self.window_sums():
                total.assign(tf.zeros_like(total))

    def register_local_var(self, var: Any) -> None:
        """Horovod's: a variable whose gradient is this rank's own (not all-reduced), scaled
        by 1/size unless `scale_local_gradients=False`."""
        object.__setattr__(self, "_hvd_reduction", self._hvd_reduction.with_local(var))

    def build(self, variables: Any) -> None:
        super().build(variables)
        if self._hvd_accumulation > 1 and not getattr(self, "_hvd_sums", None):
            # Each rank's own: set past Keras' attribute tracking, which would put them in the
            # checkpoint's object graph, and so in the replicated state (runtime/replicas.py).
            sums = tuple(
                tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name="hvd_sum")
                for v in variables
            )
            object.__setattr__(self, "_hvd_sums", sums)
            self._hvd_count = tf.Variable(0, dtype=tf.int64, trainable=False, name="hvd_count")

    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        if not self.built:
            self.build(trainable_variables)
        # Every batch counts, a step the loss scaler skipped (inf or NaN) included, as in
        # Keras 2: the schedule and the checkpoints count batches, which an overflow on one
        # rank must not shift (Keras 3's LossScaleOptimizer leaves a skipped step uncounted).
        before = tf.identity(self.iterations)
        how = self._hvd_reduction
        if isinstance(how.groups, (list, tuple)) or how.local:  # by variable: at tracing
            chosen = trainable_variables if trainable_variables is not None else None
            object.__setattr__(self, "_hvd_variables", list(chosen or self._trainable_variables))
        self._hvd_apply(grads, trainable_variables)
        self.iterations.assign(before + 1)

    def _hvd_apply(self, grads: Any, trainable_variables: Any) -> None:
        if self._hvd_accumulation == 1:
            super().apply(self._hvd_average(list(grads)), trainable_variables)
            return
        grads = list(grads)
        for total, g in zip(self._hvd_sums, grads, strict=True):
            if g is not None:
                total.assign_add(tf.convert_to_tensor(g))
        self._hvd_count.assign_add(1)

        def update() -> None:
            # None where the step gave no gradient: known when the step is traced.
            # The mean over the window (Horovod's sum without average_aggregated_gradients).
            means = [
                None if g is None
                else total / self._hvd_accumulation if self._hvd_window_mean
                else tf.identity(total)
                for total, g in zip(self._hvd_sums, grads, strict=True)
            ]  # fmt: skip
            super(Averaging, self).apply(self._hvd_average(means), trainable_variables)
            for total in self._hvd_sums:
                total.assign(tf.zeros_like(total))

        tf.cond(self._hvd_count % self._hvd_accumulation == 0, update, lambda: None)

    def _hvd_average(self, grads: list[Any]) -> list[Any]:
        """`grads` all-reduced over the workers as this optimizer's `Reduction` says."""
        how = self._hvd_reduction
        if how.name is None:  # as Horovod's DistributedOptimizer names its all-reduces
            how = dataclasses.replace(how, name=f"Distributed{type(self).__name__}")
        return reduce_gradients(grads, self._hvd_variables, how)


def _after_all(grads: list[Any], present: list[int]) -> list[Any]:
    """`grads`, each available only once every one of them is (a control dependency).

    A weight's update then never runs while the backward pass still reads that weight's value
    for a layer below, which makes TensorFlow copy the whole variable before updating it (its
    buffer is shared: training_op_helpers.h, PrepareToUpdateVariable). Several workers' grouped
    all-reduce waits for every gradient already; one worker's step did not."""
    with tf.control_dependencies([_values(grads[i]) for i in present]):
        gated = [_identity(grads[i]) for i in present]
    out = list(grads)
    for i, g in zip(present, gated, strict=True):
        out[i] = g
    return out


def _values(g: Any) -> Any:
    return g.values if isinstance(g, tf.IndexedSlices) else g


def _identity(g: Any) -> Any:
    if isinstance(g, tf.IndexedSlices):  # an Embedding's gradient
        return tf.IndexedSlices(tf.identity(g.values), g.indices, g.dense_shape)
    return tf.identity(g)


def _compiled_by_xla() -> bool:
    """Whether the step being traced is compiled whole by XLA (`jit_compile=True`): TensorFlow
    traces such a function inside an XLA context. A private TensorFlow module: where it is
    missing, False (the grouped all-reduce, as without XLA)."""
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:
        return False
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


@functools.cache
def _averaging_class(base: type) -> type:
    """`base` with `Averaging` mixed in, under `base`'s own name and module: saved with a
    model, it loads as the plain optimizer, with neither Horovod nor hvd_train installed."""
    cls = type(base.__name__, (Averaging, base), {})
    cls.__module__, cls.__qualname__ = base.__module__, base.__qualname__
    return cls


def loading_class(base: type, reduction: Reduction, window_mean: bool = True) -> type:
    """`base` as `DistributedOptimizer` makes it, with `reduction` and `window_mean`, for Keras
    to deserialize a saved optimizer into (its config, then its variables: `load_model`'s
    `custom_objects`)."""
    cls = type(
        base.__name__, (_averaging_class(base),),
        {"_hvd_reduction": reduction, "_hvd_window_mean": window_mean},
    )  # fmt: skip
    cls.__module__, cls.__qualname__ = base.__module__, base.__qualname__
    return cls


def DistributedOptimizer(  # noqa: N802 - a class to its caller, as Horovod's
    optimizer: keras.optimizers.Optimizer,
    fp16: bool = False,
    accumulation: int = 1,
    reduction: Reduction | None = None,
    window_mean: bool = True,
) -> keras.optimizers.Optimizer:
    """A copy of `optimizer` (not built yet) whose updates use the gradients averaged over the
    workers: the one thing every worker's optimizer needs under Horovod.

    Args:
        optimizer: a Keras 3 optimizer, or a `LossScaleOptimizer` around one (mixed_float16:
            then the average comes before the loss scaler's finiteness check, so every rank
            skips the same steps, and none waits alone in an all-reduce). Under the global
            policy mixed_float16, a plain optimizer is put in a LossScaleOptimizer first, as
            `compile` would otherwise do around the distributed one.
        fp16: send the gradients as float16 (half the bytes). Defaults to False.
        accumulation: batches whose gradients are summed locally per all-reduce and update.
            Defaults to 1.
        reduction: how the gradients are all-reduced (Horovod's arguments: `Reduction`).
            Defaults to their average, sent as float16 when `fp16`.
        window_mean: with `accumulation` > 1, apply the window's mean gradient (False: its
            sum, Horovod's default). Defaults to True.
    """
    if optimizer.built:
        raise ValueError(
            "DistributedOptimizer: wrap the optimizer before it is built (before compile's "
            "first step or optimizer.build)"
        )
    if keras.mixed_precision.global_policy().name == "mixed_float16" and not isinstance(
        optimizer, keras.optimizers.LossScaleOptimizer
    ):
        # Outside, compile's LossScaleOptimizer would check each rank's own gradients: one
        # rank would skip a step that the others take into an all-reduce, and the job hang.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    copy = _averaging_class(type(optimizer)).from_config(optimizer.get_config())
    copy.distribute(accumulation, reduction or Reduction(fp16=fp16), window_mean)
    return copy


def distributed_optimizer(optimizer: Any, fp16: bool, accumulation: int, loss_scale: bool) -> Any:
    """`optimizer`, in a LossScaleOptimizer when `loss_scale` (mixed_float16), made distributed
    (see `DistributedOptimizer`). `compile` then keeps it: it is a LossScaleOptimizer already."""
    if loss_scale:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return DistributedOptimizer(optimizer, fp16=fp16, accumulation=accumulation)


def inner_optimizer(optimizer: Any) -> Any:
    """The optimizer under mixed_float16's LossScaleOptimizer (the optimizer itself otherwise)."""
    return getattr(optimizer, "inner_optimizer", optimizer)


# --------------------------------------------------------------------------- the first broadcast


def build_for_training(model: Any, input_shape: tuple[int, ...], num_classes: int) -> None:
    """Creates the optimizer's, the loss's and the metrics' variables before the first step.

    A resume restores and broadcasts the optimizer's, so its slots must exist on every rank;
    and a tf.function that creates variables is traced twice (once to create them, once more
    without), which costs seconds of every job's first step with Horovod's all-reduce in it.
    Keras' own symbolic build creates the loss's and metrics' from one example's shape and a
    sparse label, as `fit` then sees them, without tracing the step.

    A model whose layers are built at its first call (a subclassed model, as keras.io's guides
    write them) is called once on a batch of zeros first: the optimizer can only update the
    variables it was built with, and a resume restores into variables that exist."""
    if not all(layer.built for layer in model._flatten_layers()):  # Keras' own test (fit's)
        model(tf.zeros((1, *input_shape)), training=False)
    model.optimizer.build(model.trainable_variables)
    example = (tf.zeros((1, *input_shape)), tf.zeros((1,), tf.int64))
    model._symbolic_build(data_batch=example)


def broadcast_model(model: Any) -> None:
    """Rank 0's replicated state on every rank: weights, optimizer state, the accumulation
    window's position (a collective; runtime/replicas.py)."""
    replicas.broadcast(model)


def accumulation_sums(model: Any) -> tuple[Any, ...]:
    """Each rank's running gradient sums of the accumulation window (none without one)."""
    optimizer = model.optimizer
    return optimizer.window_sums() if isinstance(optimizer, Averaging) else ()


def mid_window(model: Any) -> bool:
    """Whether the accumulation window is part-way: its sums hold batches not yet applied."""
    optimizer = model.optimizer
    return isinstance(optimizer, Averaging) and optimizer.mid_window()


def start_window(model: Any, restart: bool = False) -> None:
    """After a restore and broadcast: the window's position is in the checkpoint
    (`_hvd_count`), so every rank holds rank 0's already. `restart` (a Horovod Elastic reset):
    the part-done window starts again, its sums zeroed, on every rank alike."""
    if restart and isinstance(model.optimizer, Averaging):
        model.optimizer.restart_window()


def moving_statistics(model: Any) -> list[Any]:
    """The moving mean and variance of each BatchNormalization layer that is each rank's own
    (not `SyncBatchNormalization`, whose statistics are the global batch's)."""
    found = []
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, keras.layers.BatchNormalization) and not isinstance(
            layer, SyncBatchNormalization
        ):
            found += [layer.moving_mean, layer.moving_variance]
    return found


class BroadcastInitialState(keras.callbacks.Callback):
    """`root_rank`'s weights and optimizer state to every rank when training begins, so that
    every replica starts from the same point (put it first in `fit`'s callbacks): the
    trainer's, `hvd_train.keras3.BroadcastInitialState()` and, with Horovod's arguments,
    `hvd_train.horovod.callbacks.BroadcastGlobalVariablesCallback(root_rank)`.

    What is broadcast is the replicated state (runtime/replicas.py), less the dropout layers'
    seed states (each rank draws its own masks) and the variables given as `local_variables`
    or to `register_local_var`. Horovod broadcasts after the first batch, when Keras 2 had
    made the optimizer's slots. Here a model whose variables exist when training begins gets
    its optimizer built and the broadcast then, so the first update is already the same on
    every rank; a model built at its first batch (a Sequential without an Input) is broadcast
    after it, as Horovod's. A `jit_compile` that would compile Horovod's all-reduce with XLA,
    which this Horovod cannot, is turned off with a warning naming the class the user called.
    """

    # Its public name, which a warning names (`api_name`), as numpy's `set_module` names its
    # classes: hvd_train.keras3 is an alias module for this class and the others.
    __module__ = "hvd_train.keras3"
    # The batch hook reads no logs: hvd_train's CallbackList need not convert them for it.
    _supports_tf_logs = True

    def __init__(self, root_rank: int = 0, device: str = "", local_variables: list | None = None):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self._local = list(local_variables or [])
        self._done = False

    def register_local_var(self, var: Any) -> None:
        """A variable each worker keeps its own: not broadcast."""
        self._local.append(var)

    def on_train_begin(self, logs: dict | None = None) -> None:
        no_xla_around_the_all_reduce(self.model, api_name(self))
        self._done = False
        # A model built at its first batch (a Sequential without an Input) has no variables
        # yet: its broadcast comes after that batch, as Horovod's always does.
        if all(layer.built for layer in self.model._flatten_layers()):
            self._broadcast()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if not self._done:
            self._broadcast()

    def _broadcast(self) -> None:
        self._done = True
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        with tf.device(self.device):
            replicas.broadcast(self.model, self.root_rank, self._local)


def api_name(obj: Any) -> str:
    """The name a user called `obj`'s class by (`hvd_train.keras3.BroadcastInitialState`,
    `hvd_train.horovod.callbacks.BroadcastGlobalVariablesCallback`), for a warning to name the
    API the user called."""
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def no_xla_around_the_all_reduce(model: Any, api: str) -> None:
    """Turns off a `jit_compile` that would compile Horovod's all-reduce with XLA, which fails
    at the first step in a Horovod without XLA ops (every CPU build; the CUDA builds for
    TensorFlow 2.19+: base/xla_env.py), and makes `fit` trace its step again, with a warning
    naming `api`, the callback the user gave `fit`. `compile`'s default, "auto", means XLA on a
    GPU. At one worker nothing is all-reduced."""
    if hvd_tf.size() == 1 or not model.jit_compile or _xla_all_reduce():
        return
    warnings.warn(
        f"{api}: jit_compile turned off: XLA cannot compile Horovod's all-reduce in this "
        "build; pass jit_compile=False to compile()",
        stacklevel=2,
    )
    model.jit_compile = False
    model.make_train_function(force=True)


def _xla_all_reduce() -> bool:
    """Whether Horovod can all-reduce inside XLA here: on a GPU, its XLA ops built and
    registered as its library loaded (HOROVOD_ENABLE_XLA_OPS=1 before `import horovod`, which
    hvd_train's commands set where they are: base/xla_env.py)."""
    return xla_env.whole_step(True, xla.gpu_visible())


def broadcast_callback() -> Any:
    return BroadcastInitialState()


class MetricAverage(keras.callbacks.Callback):
    """Averages every number in the epoch's logs over the workers (one all-reduce, float64, on
    `device`), so each worker's EarlyStopping, checkpoint, History and console see the same
    values: the trainer's, `hvd_train.keras3.MetricAverage()` and
    `hvd_train.horovod.callbacks.MetricAverageCallback(device)`. Put it after
    `BroadcastInitialState` and before the callbacks that read metrics. When all workers run
    the same number of equal batches, the mean of the workers' means is exact."""

    def __init__(self, device: str = ""):
        super().__init__()
        self.device = device

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is None or hvd_tf.size() == 1:
            return
        keys = sorted(k for k, v in logs.items() if _is_number(v))
        values = tf.constant([float(logs[k]) for k in keys], tf.float64)
        with tf.device(self.device):
            summed = hvd_tf.allreduce(values, op=hvd_tf.Sum, name="hvd_train.metric_average")
        for key, value in zip(keys, (summed / hvd_tf.size()).numpy(), strict=True):
            logs[key] = float(value)


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool)


def metric_average_callback() -> Any:
    return MetricAverage()


class CallbackList(keras.callbacks.CallbackList):
    """Keras 3's CallbackList, but the callbacks that take tensor logs (`_supports_tf_logs`,
    Keras 2's flag: hvd_train's own, train/callbacks/base.py) get each step's logs as they are.

    Keras 3 turns every step's logs into Python numbers for its callbacks, which waits for the
    step to finish: on a GPU, a host round-trip a step. (It would call `async_safe` callbacks'
    batch hooks in a thread instead, but only on a thread-safe backend, which TensorFlow's is
    not: `keras.src.backend.IS_THREAD_SAFE`.) hvd_train's hooks act at the step boundary (an
    agreed stop, a checkpoint, a collective at the same step on every rank) and read the logs
    only where they act. So every callback is called at once, in list order: those that take
    tensor logs with the logs as they are, the others as Keras calls them, with numbers,
    converted once a step and only when one of them has a batch-end hook.
    """

    def __init__(self, callbacks: list[Any], **kwargs: Any) -> None:
        super().__init__(callbacks, **kwargs)
        # Once, not at every step: each callback called at a batch's end, and how.
        self._at_batch_end = [
            (cb, tensors)
            for cb in self.callbacks
            if (tensors := _takes_tensor_logs(cb)) or _has_batch_end(cb)
        ]

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        numbers = None
        flat = _flat(logs or {})  # as pythonify_logs flattens them, without reading them
        for callback, tensors in self._at_batch_end:
            if not tensors and numbers is None:
                numbers = python_utils.pythonify_logs(logs)
            callback.on_train_batch_end(batch, flat if tensors else numbers)


def _flat(logs: dict) -> dict:
    """`logs` with a nested dict's items in its place: a `train_step` written as keras.io's
    guide writes it returns `{m.name: m.result() for m in self.metrics}`, whose compiled
    metrics' result is a dict."""
    if not any(isinstance(v, dict) for v in logs.values()):
        return logs
    flat: dict = {}
    for key, value in logs.items():
        flat.update(_flat(value) if isinstance(value, dict) else {key: value})
    return flat


def _takes_tensor_logs(callback: Any) -> bool:
    return bool(getattr(callback, "_supports_tf_logs", False))


def _has_batch_end(callback: Any) -> bool:
    """Whether Keras' default of a batch-end hook was replaced (the default of
    `on_train_batch_end` calls `on_batch_end`)."""
    default = python_utils.is_default
    return not (default(callback.on_train_batch_end) and default(callback.on_batch_end))


def fit_callbacks(callbacks: list[Any], model: Any, verbose: int, epochs: int, steps: int) -> Any:
    """What `fit` takes as `callbacks=`: `CallbackList` (Keras' History added, and its bar when
    `verbose` and none is in `callbacks`), made for `epochs` and `steps` as `fit` makes its own."""
    return CallbackList(
        callbacks, add_history=True, add_progbar=verbose != 0, model=model, verbose=verbose,
        epochs=epochs, steps=steps,
    )  # fmt: skip


# --------------------------------------------------------------------------- the learning rate

# The decays `warmup` offers: the others need arguments it does not take (the trainer's config
# gives them: schedules.learning_rate_schedule).
WARMUP_DECAYS = ("constant", "cosine", "warmup_decay")


def warmup(
    base_lr: float, *, warmup_steps: int = 0, workers: int | None = None,
    decay: str = "constant", total_steps: int = 0,
) -> Any:  # fmt: skip
    """A learning-rate schedule for your optimizer: `base_lr` (the rate for one worker's batch)
    scaled linearly by the worker count, reached by a linear warm-up over `warmup_steps`, then
    `decay`. Stepped per batch by the optimizer itself (`optimizer.learning_rate` reads the
    rate of its next step), so a resumed optimizer continues it.

    Args (all but `base_lr` by keyword):
        base_lr: the rate for one worker.
        warmup_steps: batches over which the rate ramps from `base_lr` to the scaled rate.
            Defaults to 0 (the scaled rate from the first step).
        workers: the worker count. Defaults to Horovod's size (after `init()`).
        decay: what follows the warm-up: "constant", or "cosine" or "warmup_decay" (a straight
            line) down to 0 at `total_steps`. Defaults to "constant".
        total_steps: the run's batches, for the decays that end at the run's end.

    Raises:
        ValueError: another `decay`, or a decay to 0 without `total_steps` after the warm-up.
    """
    if decay not in WARMUP_DECAYS:
        raise ValueError(f"warmup: decay must be one of {WARMUP_DECAYS}; received: decay={decay!r}")
    if decay != "constant" and total_steps <= warmup_steps:
        raise ValueError(
            f"warmup: decay={decay!r} ends at total_steps, which must come after the warm-up; "
            f"received: total_steps={total_steps}, warmup_steps={warmup_steps}"
        )
    n = hvd_tf.size() if workers is None else workers
    return warmup_scaled(keras, base_lr, base_lr * n, warmup_steps, decay, total_steps)


# --------------------------------------------------------------------------- the rest


def last_learning_rate(optimizer: Any) -> float:
    """The rate the optimizer's last step used: Keras 3's `learning_rate` is its schedule at
    the step counter, which is the next step's rate."""
    inner = inner_optimizer(optimizer)
    schedule = schedule_of(inner)
    if schedule is not None:
        return float(schedule(max(int(inner.iterations.numpy()) - 1, 0)))
    return float(inner.learning_rate)


def schedule_of(optimizer: Any) -> Any:
    """The optimizer's learning-rate schedule (its inner optimizer's under mixed_float16's loss
    scaler); None where its rate is a number (a variable)."""
    rate = inner_optimizer(optimizer)._learning_rate
    return rate if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule) else None


def per_example_loss(from_logits: bool) -> Any:
    """The sparse categorical cross-entropy of each example (no reduction)."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits, reduction=None)


def checkpoint(model: Any) -> tf.train.Checkpoint:
    """What a resumable checkpoint holds: the model's and the optimizer's variables (weights,
    slots, the step counter that drives the learning-rate schedule). Each rank's seed states are
    kept beside it (`random_states`)."""
    return tf.train.Checkpoint(model=model, optimizer=model.optimizer)


def random_states(model: Any) -> list[Any]:
    """The model's variables that are not weights: its layers' seed generator states, which
    advance at every draw (dropout). Each rank keeps its own."""
    weights = {id(v) for v in model.weights}
    return [v for v in model.variables if id(v) not in weights]


def rank_random_state(state: np.ndarray, rank: int) -> np.ndarray:
    """A seed generator's state [seed, counter] moved to `rank`'s own stream (rank 0's kept)."""
    moved = state.copy()
    moved[0] = (int(state[0]) + rank * _STREAM_STRIDE) % 2**32
    return moved


# Far apart seeds for the ranks' streams (the golden ratio's 32 bits, as hash mixers use).
_STREAM_STRIDE = 0x9E3779B9


def save_plain(model: Any, path: str) -> None:
    """Writes `model` (a plain clone: uncompiled, no optimizer) to `path` (.keras)."""
    model.save(path)


# A subclassed model (no clone): Keras 3 saves it as .keras; Keras 2 as a SavedModel folder.
SUBCLASSED_AS_KERAS = True


def save_subclassed(model: Any, path: str) -> None:
    """A subclassed model: Keras 3 saves it as .keras too (its class must be importable where
    it is loaded, as for any subclassed Keras 3 model)."""
    model.save(path if path.endswith(".keras") else f"{path}.keras")


def load_model(path: str) -> Any:
    """A saved model (model.keras, best.keras), uncompiled."""
    return keras.models.load_model(path, compile=False)


# hvd-train export's formats, as `model.export` names them.
_EXPORT_FORMATS = {"saved_model": "tf_saved_model", "onnx": "onnx", "litert": "litert"}


def export(model: Any, path: str, fmt: str, spec: tf.TensorSpec) -> None:
    """Keras 3's own `model.export`, taking `spec` (a SavedModel's `serving_default`)."""
    with warnings.catch_warnings():  # Keras' numpy 2 patch of tf2onnx sets `np.object`
        warnings.simplefilter("ignore", FutureWarning)
        model.export(path, format=_EXPORT_FORMATS[fmt], input_signature=[spec], verbose=False)


@keras.saving.register_keras_serializable(package="hvd_train")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """BatchNormalization whose batch statistics are the global batch's under Horovod: each
    worker's mean and mean of squares are averaged over the workers with one all-reduce (every
    worker's batch has the same size, so the average is the global batch's), inside the traced
    step. Keras' own `synchronized=True` synchronises only under tf.distribute: under Horovod it
    would be silently local.

    Exported models get plain BatchNormalization back (`train.models.plain_clone`, which
    `hvd_train.keras3.plain_model` is).
    """

    def _moments(self, inputs: Any, mask: Any) -> Any:
        mean, variance = super()._moments(inputs, mask)
        if hvd_tf.size() == 1:
            return mean, variance
        # Summed in float32 at least: under mixed_float16 the moments are float16.
        dtype = tf.as_dtype(mean.dtype)
        wide = tf.float64 if dtype == tf.float64 else tf.float32
        mean, variance = tf.cast(mean, wide), tf.cast(variance, wide)
        stacked = tf.stack([mean, variance + tf.square(mean)])
        total = hvd_tf.allreduce(stacked, op=hvd_tf.Sum) / hvd_tf.size()
        global_mean, mean_of_square = tf.unstack(total)
        global_variance = mean_of_square - tf.square(global_mean)
        return tf.cast(global_mean, dtype), tf.cast(global_variance, dtype)


# --------------------------------------------------------------------------- Horovod Elastic


def elastic_state(model: Any, **position: Any) -> replicas.ElasticState:
    return replicas.ElasticState(model, **position)
