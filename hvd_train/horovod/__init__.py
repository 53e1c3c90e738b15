"""Horovod's Keras API, under Horovod's own names, on Keras 3: change one line of a Horovod
Keras script,

    import horovod.tensorflow.keras as hvd      # Keras 2 (tf.keras) only
    import hvd_train.horovod as hvd             # the same script on Keras 3

and the rest runs as written: `hvd.init()`, `hvd.DistributedOptimizer(opt, ...)` with Horovod's
arguments and defaults, `hvd.callbacks.BroadcastGlobalVariablesCallback(0)`,
`hvd.callbacks.MetricAverageCallback()`, `hvd.callbacks.LearningRateWarmupCallback(...)`,
`hvd.load_model(path)`, `hvd.elastic.run`, the collectives, `hvd.SyncBatchNormalization`.

A custom loop written for `import horovod.tensorflow as hvd` changes the same line and keeps
`hvd.DistributedGradientTape(tape)`, `hvd.broadcast_variables(model.variables, 0)` and the
object collectives (hvd_train/horovod/tape.py; docs/horovod.md, "Custom training loops").

Horovod's own `horovod.tensorflow.keras` cannot train Keras 3: its optimizer all-reduces in
methods Keras 3 no longer calls (`get_gradients`, `_compute_gradients`), so it would not even
average, and its callbacks call `.ref()` and `optimizer.lr`, which Keras 3 removed. This module
is one implementation over `horovod.tensorflow`'s collectives (hvd_train.runtime.keras.v3, which
hvd_train's trainer uses too). Where Keras 3 makes one of Horovod's semantics impossible it
raises one error naming the argument (the warm-up's `momentum_correction` with an optimizer
that has momentum, for one); it is never silently different. docs/horovod.md has the table of
names and what differs.

Importing this module imports TensorFlow, Keras 3 and Horovod. On TensorFlow 2.15 (no Keras 3)
it fails with one ImportError line: use `horovod.tensorflow.keras` there.
"""

from __future__ import annotations

from typing import Any

from hvd_train.runtime.keras import binding

binding.require_keras3("hvd_train.horovod")

import horovod.tensorflow as _hvd  # noqa: E402
import tensorflow as tf  # noqa: E402
from horovod.tensorflow import (  # noqa: E402
    Adasum,
    Average,
    Compression,
    Sum,
    alltoall,
    cross_rank,
    cross_size,
    gloo_built,
    gloo_enabled,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from horovod.tensorflow.mpi_ops import global_process_set  # noqa: E402

from hvd_train.horovod import tape as _tape  # noqa: E402
from hvd_train.horovod.tape import (  # noqa: E402
    DistributedGradientTape,
    PartialDistributedGradientTape,
)
from hvd_train.runtime import distributed, replicas  # noqa: E402
from hvd_train.runtime.keras import v3 as _core  # noqa: E402
from hvd_train.runtime.keras.v3 import SyncBatchNormalization, keras  # noqa: E402

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_rank", "local_size",
    "cross_rank", "cross_size", "mpi_built", "mpi_enabled", "mpi_threads_supported",
    "gloo_built", "gloo_enabled", "nccl_built", "start_timeline", "stop_timeline",
    "allreduce", "allgather", "broadcast", "reducescatter", "alltoall",
    "broadcast_global_variables", "broadcast_variables", "broadcast_object",
    "broadcast_object_fn", "allgather_object", "Average", "Sum", "Adasum",
    "Compression", "DistributedOptimizer", "DistributedGradientTape",
    "PartialDistributedGradientTape", "load_model", "SyncBatchNormalization",
    "callbacks", "elastic",
]  # fmt: skip


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Horovod's `init`; then, as Horovod's examples do next, this worker's device: on a host
    with GPUs the one its local rank names (memory growth on), without GPUs TensorFlow's thread
    pools sized to this worker's share of the cores. A script that pins its GPU itself after
    this pins the same one. Where TensorFlow has run something already, the device is left as
    it is (Horovod's `init` alone)."""
    _hvd.init(comm=comm, process_sets=process_sets)
    try:
        distributed.configure_devices(0, 0)
    except RuntimeError:  # TensorFlow initialized already: its devices cannot change now
        pass


# --------------------------------------------------------------------------- collectives


def allreduce(
    value: Any, name: str | None = None, average: bool | None = None,
    prescale_factor: float = 1.0, postscale_factor: float = 1.0, op: Any = None,
    compression: Any = Compression.none,
) -> tf.Tensor:  # fmt: skip
    """Horovod's `allreduce` of a tensor-compatible value (Average unless `op` says)."""
    if average is not None:
        if op is not None:
            raise ValueError("allreduce: give op or average, not both")
        op = Average if average else Sum
    return _hvd.allreduce(
        tf.constant(value) if not tf.is_tensor(value) else value, name=name,
        op=Average if op is None else op, prescale_factor=prescale_factor,
        postscale_factor=postscale_factor, compression=compression,
    )  # fmt: skip


def allgather(value: Any, name: str | None = None) -> tf.Tensor:
    """Horovod's `allgather`: the ranks' values concatenated on the first dimension."""
    return _hvd.allgather(tf.constant(value) if not tf.is_tensor(value) else value, name=name)


def broadcast(value: Any, root_rank: int, name: str | None = None) -> tf.Tensor:
    """Horovod's `broadcast`: `root_rank`'s value on every rank."""
    return _hvd.broadcast(
        tf.constant(value) if not tf.is_tensor(value) else value, root_rank, name=name
    )


def reducescatter(value: Any, name: str | None = None, op: Any = Average) -> tf.Tensor:
    """Horovod's `reducescatter`: the ranks' values reduced, each rank given its slice of the
    first dimension."""
    return _hvd.reducescatter(
        tf.constant(value) if not tf.is_tensor(value) else value, name=name, op=op
    )


def broadcast_variables(
    variables: Any, root_rank: int, process_set: Any = global_process_set, inplace: bool = False
) -> Any:
    """Horovod's `broadcast_variables` for Keras 3 variables (a model's, an optimizer's
    `.variables`) as well as TensorFlow's: `root_rank`'s values assigned on every rank, eagerly
    or inside a `tf.function`. The dropout layers' seed states (Keras 3 puts them in
    `model.variables`) are left each rank's own, as Keras 2 had none: every rank draws its own
    masks.

    Raises:
        ValueError: another process set than the global one; something that is not a variable.
    """
    if process_set is not global_process_set:
        raise ValueError("broadcast_variables: only the global process_set is supported")
    chosen = []
    for v in variables:
        found = replicas.tf_variable(v)
        if found is None:
            raise ValueError(
                f"broadcast_variables: expected variables; received: {type(v).__name__}"
            )
        if getattr(v, "name", "") != "seed_generator_state":
            chosen.append(found)
    if not chosen or size() == 1:
        return None
    return _hvd.broadcast_variables(chosen, root_rank, inplace=inplace)


def broadcast_object(
    obj: Any, root_rank: int = 0, session: Any = None, name: str | None = None,
    process_set: Any = global_process_set,
) -> Any:  # fmt: skip
    """Horovod's `broadcast_object`: `root_rank`'s picklable object on every rank (eager).

    Raises:
        ValueError: a `session` (TensorFlow 1), another process set than the global one.
    """
    _eager_only("broadcast_object", session, process_set)
    return _hvd.broadcast_object(obj, root_rank=root_rank, name=name)


def broadcast_object_fn(
    root_rank: int = 0, session: Any = None, name: str | None = None,
    process_set: Any = global_process_set,
) -> Any:  # fmt: skip
    """Horovod's `broadcast_object_fn`: a function that broadcasts the object it is given from
    `root_rank`. Horovod's builds TensorFlow 1 placeholders (it has none in TensorFlow 2); this
    one calls `broadcast_object` eagerly.

    Raises:
        ValueError: a `session` (TensorFlow 1), another process set than the global one.
    """
    _eager_only("broadcast_object_fn", session, process_set)
    name = name or "broadcast_object_fn"
    return lambda obj: _hvd.broadcast_object(obj, root_rank=root_rank, name=name)


def allgather_object(
    obj: Any, session: Any = None, name: str | None = None, process_set: Any = global_process_set
) -> list[Any]:
    """Horovod's `allgather_object`: every rank's picklable object, in rank order (eager).

    Raises:
        ValueError: a `session` (TensorFlow 1), another process set than the global one.
    """
    _eager_only("allgather_object", session, process_set)
    return _hvd.allgather_object(obj, name=name)


def _eager_only(api: str, session: Any, process_set: Any) -> None:
    if session is not None:
        raise ValueError(f"{api}: session= is TensorFlow 1's; TensorFlow 2 runs it eagerly")
    if process_set is not global_process_set:
        raise ValueError(f"{api}: only the global process_set is supported")


def broadcast_global_variables(root_rank: int) -> None:
    """Horovod's TensorFlow 1 call, which has no global variables to find in TensorFlow 2."""
    raise ValueError(
        "broadcast_global_variables: TensorFlow 2 has no global variables; use "
        "callbacks.BroadcastGlobalVariablesCallback(root_rank) in fit, or "
        "hvd_train.horovod.broadcast_variables(model.variables, root_rank)"
    )


# --------------------------------------------------------------------------- the optimizer


def DistributedOptimizer(  # noqa: N802 - a class to its caller, as Horovod's
    optimizer: keras.optimizers.Optimizer, name: str | None = None, device_dense: str = "",
    device_sparse: str = "", compression: Any = Compression.none, sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0, op: Any = Average, backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False, num_groups: int = 0, groups: Any = None,
    process_set: Any = global_process_set, scale_local_gradients: bool = True,
) -> keras.optimizers.Optimizer:  # fmt: skip
    """Horovod's DistributedOptimizer on Keras 3, with its arguments and defaults: a copy of
    `optimizer` (not built yet) whose every update uses the gradients all-reduced over the
    workers (averaged by default).

    - `backward_passes_per_step` N > 1: N batches' gradients are summed locally, all-reduced
      once and applied once; `average_aggregated_gradients` False (Horovod's default) applies
      that sum, True its mean over the N batches.
    - `gradient_predivide_factor` f: each rank's gradients are scaled by 1/f before the sum and
      by f/size after it (an average; `op` must be Average).
    - `groups` (or the older `num_groups`): a number of all-reduce groups, or lists of
      variables each all-reduced as one group.
    - `sparse_as_dense`: a sparse gradient (an Embedding's) is all-reduced dense whatever it
      says; the sums are the same.
    - `register_local_var(var)` on the returned optimizer: that variable's gradient is each
      rank's own, not all-reduced, scaled by 1/size unless `scale_local_gradients=False`.
    - mixed_float16: the optimizer goes into a LossScaleOptimizer first, and the average comes
      before the loss scaler's finiteness check, so every rank skips the same steps.

    Raises:
        ValueError: an `op` other than Average or Sum, a predivide factor with Sum, another
            process set than the global one, or `groups` that is neither a positive number
            nor a list of lists of variables.
    """
    how = _tape.reduction(
        "DistributedOptimizer", name, device_dense, compression, op, gradient_predivide_factor,
        groups if groups is not None else num_groups or None, process_set, scale_local_gradients,
    )  # fmt: skip
    copy = _core.DistributedOptimizer(
        optimizer, accumulation=int(backward_passes_per_step), reduction=how,
        window_mean=bool(average_aggregated_gradients),
    )  # fmt: skip
    return copy


def load_model(
    filepath: str, custom_optimizers: list[type] | None = None,
    custom_objects: dict[str, Any] | None = None, compression: Any = Compression.none,
    legacy_opts: bool = False,
) -> keras.Model:  # fmt: skip
    """Horovod's `load_model`: a saved model whose optimizer comes back distributed, with its
    state (slots, step count). Every optimizer of `keras.optimizers` is wrapped, and those in
    `custom_optimizers`.

    Raises:
        ValueError: `legacy_opts=True` (Keras 3 has no legacy optimizers).
    """
    if legacy_opts:
        raise ValueError("load_model: legacy_opts=True: Keras 3 has no legacy optimizers")
    classes = [
        c for c in vars(keras.optimizers).values()
        if isinstance(c, type) and issubclass(c, keras.optimizers.Optimizer)
    ] + list(custom_optimizers or [])  # fmt: skip
    # Horovod's defaults: the window (backward_passes_per_step) applies its sum.
    how = _core.Reduction(compression=compression)
    wrapped = {c.__name__: _core.loading_class(c, how, window_mean=False) for c in classes}
    model = keras.models.load_model(filepath, custom_objects={**wrapped, **(custom_objects or {})})
    return model


from hvd_train.horovod import callbacks, elastic  # noqa: E402
