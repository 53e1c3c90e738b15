"""Horovod's `DistributedGradientTape` and `PartialDistributedGradientTape` (`horovod.tensorflow`),
under its names and arguments, for Keras 3 variables; and the all-reduce arguments they share
with `DistributedOptimizer`, checked once (`reduction`).

Horovod's own tape keys its sources by `s.ref()`, which a Keras 3 variable lacks (horovod#4290).
This one all-reduces through the same function as hvd_train's DistributedOptimizer
(`hvd_train.runtime.keras.v3.reduce_gradients`), which knows a Keras 3 variable by itself or by
the TensorFlow variable it holds (`.value`).
"""

from __future__ import annotations

from typing import Any

import horovod.tensorflow as _hvd
import tensorflow as tf
from horovod.tensorflow import Average, Compression, Sum
from horovod.tensorflow.mpi_ops import global_process_set

from hvd_train.runtime.keras import v3 as _core
from hvd_train.runtime.keras.v3 import keras  # the binding's Keras 3


def reduction(
    api: str, name: str | None, device_dense: str, compression: Any, op: Any,
    gradient_predivide_factor: float, groups: Any, process_set: Any, scale_local_gradients: bool,
) -> _core.Reduction:  # fmt: skip
    """Horovod's all-reduce arguments, as DistributedOptimizer and DistributedGradientTape take
    them, checked and made one `Reduction`, which both use.

    Raises:
        ValueError: naming `api` and the argument: an `op` other than Average or Sum, a
            predivide factor with Sum, another process set than the global one, or `groups`
            that is neither a positive number nor a list of lists of variables.
    """
    if op not in (Average, Sum):
        raise ValueError(f"{api}: op must be Average or Sum (Adasum is not built)")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError(f"{api}: gradient_predivide_factor needs op=Average")
    if process_set is not global_process_set:
        raise ValueError(f"{api}: only the global process_set is supported")
    if groups is not None and not (
        (isinstance(groups, int) and groups > 0)
        or (isinstance(groups, list) and all(isinstance(g, (list, tuple)) for g in groups))
    ):
        raise ValueError(
            f"{api}: groups must be a positive number or a list of lists of variables; "
            f"received: groups={groups!r}"
        )
    if isinstance(groups, list):
        groups = tuple(tuple(g) for g in groups)
    scale: dict[str, Any] = {"op": op}
    if gradient_predivide_factor != 1.0:  # Horovod's split of the average around the sum
        scale = {"op": Sum, "prescale": 1.0 / gradient_predivide_factor,
                 "postscale": gradient_predivide_factor / _hvd.size()}  # fmt: skip
    return _core.Reduction(
        compression=compression, groups=groups, device=device_dense, name=name,
        scale_local=bool(scale_local_gradients), **scale,
    )  # fmt: skip


class _DistributedGradientTape(tf.GradientTape):
    """Put before the caller's tape class: `gradient` all-reduces what the tape computed."""

    def __init__(self, tape: tf.GradientTape, how: _core.Reduction) -> None:
        tf.GradientTape.__init__(
            self, persistent=tape._persistent,
            watch_accessed_variables=tape._watch_accessed_variables,
        )  # fmt: skip
        self._tape = tape._tape  # what the caller's `with` recorded, as Horovod's takes it
        self._reduction = how

    def register_local_source(self, source: Any) -> None:
        """Horovod's: `source`'s gradient is this rank's own (not all-reduced), divided by the
        worker count unless `scale_local_gradients=False`."""
        self._reduction = self._reduction.with_local(source)

    def gradient(
        self, target: Any, sources: Any, output_gradients: Any = None,
        use_generic_names: bool = False,
        unconnected_gradients: Any = tf.UnconnectedGradients.NONE,
    ) -> Any:  # fmt: skip
        """The gradients of `target` with respect to `sources` (a variable or a nest of them),
        all-reduced over the workers; in `sources`' structure. `use_generic_names` (Horovod's
        names for its all-reduces) changes no value and is accepted as it is."""
        grads = super().gradient(
            target, sources, output_gradients=output_gradients,
            unconnected_gradients=unconnected_gradients,
        )  # fmt: skip
        flat_sources = tf.nest.flatten(sources)
        reduced = _core.reduce_gradients(tf.nest.flatten(grads), flat_sources, self._reduction)
        return tf.nest.pack_sequence_as(grads, reduced)

    def get_local_and_global_gradients(
        self, target: Any, sources: Any, output_gradients: Any = None,
        use_generic_names: bool = False,
    ) -> tuple[list[tuple[Any, Any]], list[tuple[Any, Any]]]:  # fmt: skip
        """Horovod's: the (source, gradient) pairs of the registered local sources, and of the
        others, all-reduced; in `sources`' order."""
        flat = tf.nest.flatten(sources)
        grads = self.gradient(target, flat, output_gradients=output_gradients)
        local = _core.ids_of(self._reduction.local)
        mine = [(s, g) for s, g in zip(flat, grads, strict=True) if _core.ids_of([s]) & local]
        shared = [(s, g) for s, g in zip(flat, grads, strict=True) if not _core.ids_of([s]) & local]
        return mine, shared


def DistributedGradientTape(  # noqa: N802 - a class to its caller, as Horovod's
    gradtape: tf.GradientTape, device_dense: str = "", device_sparse: str = "",
    compression: Any = Compression.none, sparse_as_dense: bool = False, op: Any = Average,
    gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups: Any = None,
    process_set: Any = global_process_set, scale_local_gradients: bool = True,
) -> tf.GradientTape:  # fmt: skip
    """Horovod's DistributedGradientTape for Keras 3 variables: `gradtape` (after its `with`)
    whose `gradient` returns the gradients all-reduced over the workers (averaged by default),
    with Horovod's arguments and defaults.

    - `gradient_predivide_factor` f: each rank's gradients are scaled by 1/f before the sum and
      by f/size after it (an average; `op` must be Average).
    - `groups` (or the older `num_groups`): a number of all-reduce groups, or lists of
      variables each all-reduced as one group.
    - `sparse_as_dense`, `device_sparse`: a sparse gradient (an Embedding's) is all-reduced
      dense whatever they say, on `device_dense`; the sums are the same.
    - `register_local_source(var)`: that variable's gradient is each rank's own, scaled by
      1/size unless `scale_local_gradients=False`.

    The all-reduce is the one hvd_train's DistributedOptimizer does: give the tape's gradients
    to a plain optimizer (as Horovod's examples do), not to a DistributedOptimizer, which would
    average them again.

    Raises:
        ValueError: an `op` other than Average or Sum, a predivide factor with Sum, another
            process set than the global one, or `groups` that is neither a positive number
            nor a list of lists of variables.
    """
    how = reduction(
        "DistributedGradientTape", None, device_dense, compression, op, gradient_predivide_factor,
        groups if groups is not None else num_groups or None, process_set, scale_local_gradients,
    )  # fmt: skip
    base = type(gradtape)
    cls = base if issubclass(base, _DistributedGradientTape) else type(
        base.__name__, (_DistributedGradientTape, base), {"__module__": base.__module__}
    )  # fmt: skip
    return cls(gradtape, how)


def PartialDistributedGradientTape(  # noqa: N802 - a class to its caller, as Horovod's
    gradtape: tf.GradientTape, device_dense: str = "", device_sparse: str = "",
    compression: Any = Compression.none, sparse_as_dense: bool = False, op: Any = Average,
    gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups: Any = None,
    process_set: Any = global_process_set, local_layers: Any = None,
    scale_local_gradients: bool = True,
) -> tf.GradientTape:  # fmt: skip
    """Horovod's: DistributedGradientTape whose `local_layers` (a Keras 3 layer or a list of
    them) keep their trainable weights' gradients each rank's own, scaled by 1/size unless
    `scale_local_gradients=False`.

    Raises:
        ValueError: a local layer that is not a Keras 3 layer; and as DistributedGradientTape.
    """
    if local_layers is None:
        local_layers = []
    elif isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    elif not all(isinstance(layer, keras.layers.Layer) for layer in local_layers):
        raise ValueError(
            "PartialDistributedGradientTape: local_layers must be Keras 3 layers "
            "(keras.layers.Layer)"
        )
    tape = DistributedGradientTape(
        gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
        gradient_predivide_factor, num_groups, groups, process_set, scale_local_gradients,
    )  # fmt: skip
    for layer in local_layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape
