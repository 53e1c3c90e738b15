"""The replicated state: what every rank holds alike, in one definition, and the check that it
does.

Synchronous data parallelism promises one thing above all: every rank holds the same model and
the same optimizer, so that N workers train as one worker on the global batch. Which variables
that is, is taken from what the resumable checkpoint saves (the binding's `checkpoint(model)`,
walked as TensorFlow walks it to save it), less each rank's own random state (its dropout
generators: `random_states`). So what is saved and what is shared cannot drift apart: whatever
a Keras, an optimizer or a loss scaler adds to the checkpoint (a step counter, a window
counter, a dynamic loss scale) is broadcast and checked with the weights.

Each rank's own, and not in that list:
- its random states (each rank draws its own dropout masks; train/random_states.py);
- the running sums of a gradient-accumulation window (each rank sums its own batches' gradients
  until the window's all-reduce; kept per rank in a checkpoint: train/random_states.py);
- the moving statistics of BatchNormalization without sync (each rank's from its own batches):
  `average_moving_statistics` averages them over the ranks before each validation, each check
  and each checkpoint, as timm's `distribute_bn` does, so that the model validated is the
  model saved, and at those points they are replicated state too.

`broadcast` gives every rank rank 0's values (the first broadcast, after a resume, Horovod
Elastic's sync); `disagreement` compares every rank's with one small all-reduce
(`runtime.check_replicas`: docs/faults.md).
"""

from __future__ import annotations

import zlib
from typing import Any

import horovod.tensorflow as hvd_tf
import numpy as np
import tensorflow as tf
from horovod.common.elastic import ObjectState

from hvd_train.runtime import binding

Model = Any  # a Keras model of the active Keras


def replicated_variables(model: Model) -> list[tuple[str, tf.Variable]]:
    """(name, variable) of every variable the checkpoint saves, less each rank's own random
    states: the same names in the same order on every rank. A variable is named by its Keras
    path ("dense/kernel", "adam/dense_kernel_momentum") or TensorFlow name; Keras 3's are given
    as the TensorFlow variables under them (Horovod's broadcast assigns to those)."""
    active = binding.of(model)
    own = {id(tf_variable(v)) for v in active.random_states(model)}
    found: list[tuple[str, tf.Variable]] = []
    seen: set[int] = set()
    for _path, obj in _walk(active.checkpoint(model)):
        variable = tf_variable(obj)
        if variable is None or id(variable) in seen or id(variable) in own:
            continue
        seen.add(id(variable))
        found.append((getattr(obj, "path", None) or variable.name.split(":")[0], variable))
    return found


def _walk(root: Any) -> list[tuple[str, Any]]:
    """Every object of `root`'s checkpoint graph with its path ("model/layer-1/kernel"),
    breadth first, children in name order: the same order on every rank."""
    found, queue, seen = [], [("", root)], {id(root)}
    while queue:
        path, obj = queue.pop(0)
        found.append((path, obj))
        children = obj._trackable_children(save_type="checkpoint")  # noqa: SLF001
        for name in sorted(children):
            child = children[name]
            if id(child) not in seen:
                seen.add(id(child))
                queue.append((f"{path}/{name}" if path else name, child))
    return found


def tf_variable(obj: Any) -> tf.Variable | None:
    """The TensorFlow variable `obj` is or holds (Keras 3's Variable holds one as `.value`);
    None for anything else."""
    if isinstance(obj, tf.Variable):
        return obj
    value = getattr(obj, "value", None) if hasattr(type(obj), "value") else None
    return value if isinstance(value, tf.Variable) else None


def broadcast(model: Model) -> None:
    """Rank 0's replicated state on every rank (a collective)."""
    if hvd_tf.size() > 1:
        hvd_tf.broadcast_variables([v for _, v in replicated_variables(model)], root_rank=0)


def average_moving_statistics(model: Model) -> None:
    """Averages the moving mean and variance of BatchNormalization without sync over the ranks
    (one grouped all-reduce; a collective). With sync batch norm, or at one worker, they are
    every rank's alike already: nothing is sent."""
    variables = [tf_variable(v) for v in binding.of(model).moving_statistics(model)]
    if hvd_tf.size() == 1 or not variables:
        return
    averaged = hvd_tf.grouped_allreduce(
        [tf.convert_to_tensor(v) for v in variables], op=hvd_tf.Average,
        name="hvd_train.moving_statistics",
    )  # fmt: skip
    for variable, value in zip(variables, averaged, strict=True):
        variable.assign(value)


def fingerprint(variable: tf.Variable) -> int:
    """56 bits from two checksums of the variable's bytes (CRC-32, and 24 bits of Adler-32):
    equal values give equal fingerprints on every rank; one flipped bit always changes the
    CRC, and other differences go unseen with a chance of about 2^-56. Checksums, not a
    cryptographic hash: 4 times faster (docs/benchmarks.md#the-replica-check)."""
    data = np.ascontiguousarray(variable.numpy()).data  # read in place, not copied to bytes
    return zlib.crc32(data) << 24 | zlib.adler32(data) & 0xFFFFFF


def disagreement(model: Model, named: list[tuple[str, tf.Variable]] | None = None) -> str | None:
    """None when every rank holds the same replicated state; else which variable differs
    first and which ranks differ from rank 0 (the same text on every rank). A collective: one
    all-reduce of the fingerprints, then, only on a mismatch, one gather of one of them.

    `named`: `replicated_variables(model)`, when the caller keeps it. Defaults to None (found
    anew)."""
    named = replicated_variables(model) if named is None else named
    mine = np.array([fingerprint(v) for _, v in named], np.int64)
    if hvd_tf.size() == 1 or not len(mine):
        return None
    # The largest and the smallest fingerprint of each variable, in one all-reduce.
    both = hvd_tf.allreduce(
        tf.constant(np.concatenate([mine, -mine])), op=hvd_tf.Max, name="hvd_train.replicas"
    ).numpy()
    differ = np.nonzero(both[: len(mine)] != -both[len(mine) :])[0]
    if not differ.size:
        return None
    first = int(differ[0])
    every = hvd_tf.allgather_object(int(mine[first]), name="hvd_train.replicas_first")
    ranks = [r for r, f in enumerate(every) if f != every[0]]
    others = f" and {differ.size - 1} more of {len(mine)} variables" if differ.size > 1 else ""
    return (
        f"{named[first][0]}{others}: rank(s) {', '.join(map(str, ranks))} hold other values "
        f"than rank 0"
    )


class ElasticState(ObjectState):
    """Horovod Elastic's state of a model and its optimizer (either Keras), and the run's
    position (`epoch`, `batch`, ... as keyword arguments, exposed as attributes).

    The replicated state above, all of it: Horovod's own KerasState keeps the model's and the
    optimizer's `variables`, which leave out tf_keras' dynamic loss scale, and reads them with
    Keras 2's API. Committed in memory; a reset rolls back to the last commit, then rank 0's
    copy goes to every worker (new ones included). After a reset, a part-done accumulation
    window starts again at its first batch: its sums were each rank's own, and the ranks have
    changed (the first sync, as training starts, keeps what a resume gave).
    """

    def __init__(self, model: Model, **position: Any):
        self.model = model
        self._saved: list[tf.Tensor] = []
        self._synced = False
        self._save_model()
        super().__init__(bcast_object=hvd_tf.broadcast_object, get_rank=hvd_tf.rank, **position)

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        for (_, v), saved in zip(replicated_variables(self.model), self._saved, strict=True):
            v.assign(saved)
        super().restore()

    def sync(self) -> None:
        broadcast(self.model)
        if self._synced:  # after a reset
            binding.of(self.model).start_window(self.model, restart=True)
        self._synced = True
        self._save_model()
        super().sync()

    def _save_model(self) -> None:
        self._saved = [tf.identity(v) for _, v in replicated_variables(self.model)]
