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
- its random states (each rank draws its own dropout masks; train/callbacks/random_states.py);
- the running sums of a gradient-accumulation window (each rank sums its own batches' gradients
  until the window's all-reduce; kept per rank in a checkpoint:
  train/callbacks/random_states.py);
- the moving statistics of BatchNormalization without sync (each rank's from its own batches):
  `average_moving_statistics` averages them over the ranks before each validation, each check
  and each checkpoint, as timm's `distribute_bn` does, so that the model validated is the
  model saved, and at those points they are replicated state too.

`broadcast` gives every rank rank 0's values (the first broadcast, after a resume, Horovod
Elastic's sync); `Fingerprints` compares every rank's (`runtime.check_replicas`:
docs/faults.md).
"""

from __future__ import annotations

import functools
import re
from typing import Any

import horovod.tensorflow as hvd_tf
import numpy as np
import tensorflow as tf
from horovod.common.elastic import ObjectState

from hvd_train.runtime.keras import binding
from hvd_train.runtime.keras.contract import Model


def replicated_variables(model: Model, optimizer: Any = None) -> list[tuple[str, tf.Variable]]:
    """(name, variable) of every variable the checkpoint saves, less each rank's own random
    states: the same names in the same order on every rank. A variable is named by its Keras
    path ("dense/kernel", "adam/dense_kernel_momentum") or TensorFlow name; Keras 3's are given
    as the TensorFlow variables under them (Horovod's broadcast assigns to those). `optimizer`:
    one given apart from the model (Horovod's KerasState takes one), its variables after the
    model's; an uncompiled model's alone otherwise."""
    active = binding.of(model)
    own = {id(tf_variable(v)) for v in active.random_states(model)}
    compiled = getattr(model, "optimizer", None)
    roots = [active.checkpoint(model) if compiled is not None else model]
    if optimizer is not None and optimizer is not compiled:
        roots.append(optimizer)
    found: list[tuple[str, tf.Variable]] = []
    seen: set[int] = set()
    for root in roots:
        for _path, obj in _walk(root):
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


def broadcast(model: Model, root_rank: int = 0, local: Any = ()) -> None:
    """`root_rank`'s replicated state on every rank (a collective), less the variables in
    `local`, which each rank keeps its own (Horovod's `local_variables`)."""
    if hvd_tf.size() == 1:
        return
    own = {id(v) for v in local} | {id(tf_variable(v)) for v in local}
    chosen = [v for _, v in replicated_variables(model) if id(v) not in own]
    hvd_tf.broadcast_variables(chosen, root_rank=root_rank)


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


def fingerprint(variable: tf.Variable) -> tuple[int, int]:
    """One variable's fingerprint, its value read in place (as `Fingerprints` reads a CPU
    worker's variables)."""
    return _sums(_host_words(variable))


def _host_words(variable: tf.Variable) -> np.ndarray:
    """The bytes of a variable's value as 64-bit words, the last zero-padded: a view of the
    value's own memory where its size is whole words (a read-only view, no copy)."""
    data = np.asarray(variable.value()).reshape(-1).view(np.uint8)
    if data.size % 8:
        data = np.pad(data, (0, -data.size % 8))
    return data.view(np.uint64)


# A longer variable is summed CHUNK words at a time, so the position weights `_sums` keeps
# (made at the first check, not at import: CHUNK words) do not grow with the model.
CHUNK = 1 << 20


@functools.cache
def _weights() -> np.ndarray:
    return np.arange(1, CHUNK + 1, dtype=np.uint64)


def _sums(words: np.ndarray) -> tuple[int, int]:
    """Two sums, modulo 2^64, of the 64-bit words a variable's bytes make: their plain sum
    (a change of any one word, a single flipped bit say, always changes it) and their sum
    weighted by position, 1, 2, 3, ... (words swapped change it). Exact integer sums, so
    every rank that holds the same bytes gets the same two numbers, in any summation order.
    A fingerprint, not a cryptographic hash: faster than CRC-32 with Adler-32
    (docs/benchmarks.md#the-replica-check), both sums one pass over memory."""
    plain = weighted = np.uint64(0)
    with np.errstate(over="ignore"):  # modulo 2^64 is the point
        for start in range(0, words.size, CHUNK):
            part = words[start : start + CHUNK]
            total = part.sum(dtype=np.uint64)
            weighted += np.dot(part, _weights()[: part.size]) + np.uint64(start) * total
            plain += total
    return int(plain), int(weighted)


def _as_words(variable: tf.Variable) -> tf.Tensor:
    """The variable's bytes, zero-padded to a whole number of 64-bit words."""
    value = tf.convert_to_tensor(variable)
    if value.dtype == tf.bool:
        value = tf.cast(value, tf.uint8)
    data = tf.reshape(tf.bitcast(value, tf.uint8), [-1])
    pad = -variable.shape.num_elements() * variable.dtype.size % 8
    return tf.pad(data, [[0, pad]]) if pad else data


class Fingerprints:
    """The fingerprints of a model's replicated variables (`replicated_variables`, found once):
    two 64-bit sums of each one's bytes (`_sums`).

    Variables in host memory (a CPU worker's) are read one at a time, as numpy views of their
    values. Variables on a device (a GPU worker's) are copied to host memory a group at a time:
    consecutive variables joined on the device by one traced function per group (one dispatch
    and one copy each, not one of each per variable), each group no larger than the largest
    variable (`groups`); `joined=True` takes that path for any variables. Either way a check
    needs at most one variable's worth of extra memory on the device and on the host, not a
    copy of the whole model. Tracing the groups' functions is the first device check's cost,
    which host memory does not need to pay.
    """

    def __init__(self, model: Model, joined: bool | None = None):
        self.named = replicated_variables(model)
        variables = [v for _, v in self.named]
        if joined is None:
            joined = not all(_in_host_memory(v) for v in variables)
        self._words = [-(-v.shape.num_elements() * v.dtype.size // 8) for v in variables]
        self._groups = (
            [
                (group, _joined([variables[i] for i in group]))
                for group in groups(self._words, max(self._words, default=0))
            ]
            if joined
            else None
        )

    def mine(self) -> np.ndarray:
        """This rank's fingerprints: two int64 per variable, in `named`'s order."""
        if self._groups is None:
            sums = [_sums(_host_words(v)) for _, v in self.named]
        else:
            sums = []
            for group, joined in self._groups:
                words = joined().numpy().view(np.uint64)
                ends = np.cumsum([self._words[i] for i in group])
                sums += [_sums(words[a:b]) for a, b in zip([0, *ends[:-1]], ends, strict=True)]
        return np.array(sums, np.uint64).reshape(-1).view(np.int64)

    def gather(self) -> list[np.ndarray]:
        """Every rank's fingerprints, in rank order, on every rank (a collective: one
        all-gather)."""
        mine = self.mine()
        if hvd_tf.size() == 1:
            return [mine]
        every = hvd_tf.allgather(tf.constant(mine[None]), name="hvd_train.replicas")
        return list(every.numpy())


def groups(sizes: list[int], limit: int) -> list[list[int]]:
    """The indices of `sizes`, in order, cut into runs whose sizes sum to at most `limit` (a
    size larger than `limit` alone in its run)."""
    found: list[list[int]] = []
    total = 0
    for i, size in enumerate(sizes):
        if not found or total + size > limit:
            found.append([])
            total = 0
        found[-1].append(i)
        total += size
    return found


def _in_host_memory(variable: tf.Variable) -> bool:
    return tf.DeviceSpec.from_string(variable.device).device_type in (None, "CPU")


def _joined(variables: list[tf.Variable]) -> Any:
    """A traced function giving `variables`' bytes end to end, each zero-padded to whole
    64-bit words (`_as_words`)."""
    return tf.function(lambda: tf.concat([_as_words(v) for v in variables], 0), autograph=False)


def disagreement(names: list[str], every: list[np.ndarray]) -> str | None:
    """None when every rank's fingerprints (`every`, in rank order, as `Fingerprints.gather`
    gives them; `names`: the variables') are rank 0's; else which variable differs first and
    which ranks differ from rank 0. The same text on every rank, which holds the same `every`.
    """
    table = np.stack(every).reshape(len(every), len(names), -1)  # rank, variable, its sums
    unlike = (table != table[0]).any(axis=2)  # rank, variable
    differ = np.nonzero(unlike.any(axis=0))[0]
    if not differ.size:
        return None
    first = int(differ[0])
    ranks = np.nonzero(unlike[:, first])[0]
    others = f" and {differ.size - 1} more of {len(names)} variables" if differ.size > 1 else ""
    return (
        f"{names[first]}{others}: rank(s) {', '.join(map(str, ranks))} hold other values than "
        "rank 0"
    )


class ElasticState(ObjectState):
    """Horovod Elastic's state of a model and its optimizer (either Keras), and the run's
    position (`epoch`, `batch`, ... as keyword arguments, exposed as attributes): the trainer's,
    and `hvd_train.horovod.elastic.KerasState` (Horovod's arguments: `optimizer`, when not the
    model's own; `backend`, TensorFlow 1's, unused).

    The replicated state above, all of it: Horovod's own KerasState keeps the model's and the
    optimizer's `variables`, which leave out tf_keras' dynamic loss scale, and reads them with
    Keras 2's API. Committed in memory; a reset rolls back to the last commit, then rank 0's
    copy goes to every worker (new ones included). After a reset, a part-done accumulation
    window starts again at its first batch: its sums were each rank's own, and the ranks have
    changed (the first sync, as training starts, keeps what a resume gave). An optimizer not
    built yet is built when the state is made, so that its slots exist on every rank before
    the first sync.

    Raises:
        ValueError: a model that is not built yet (as Horovod's).
    """

    def __init__(self, model: Model, optimizer: Any = None, backend: Any = None, **position: Any):
        if not model.built:
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        if getattr(self.optimizer, "built", True) is False:  # Keras 3's; Keras 2's build lazily
            self.optimizer.build(model.trainable_variables)
        self._saved: list[tf.Tensor] = []
        self._synced = False
        self._save_model()
        super().__init__(bcast_object=hvd_tf.broadcast_object, get_rank=hvd_tf.rank, **position)

    def _variables(self) -> list[tf.Variable]:
        return [v for _, v in replicated_variables(self.model, self.optimizer)]

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        for v, saved in zip(self._variables(), self._saved, strict=True):
            v.assign(saved)
        super().restore()

    def sync(self) -> None:
        if hvd_tf.size() > 1:
            hvd_tf.broadcast_variables(self._variables(), root_rank=0)
        if self._synced:  # after a reset
            binding.of(self.model).start_window(self.model, restart=True)
        self._synced = True
        self._save_model()
        super().sync()

    def _save_model(self) -> None:
        self._saved = [tf.identity(v) for v in self._variables()]


# A collective's failure as TensorFlow reports it: it names the op (`[Op:HorovodAllreduce]`, or
# a node, `{{node HorovodGroupedAllreduce_...}}`), or has Horovod's own words for a lost peer.
# Not a lost connection alone: a data read over the network can fail so, and would reset forever.
_COLLECTIVE = re.compile(
    r"\bHorovod(Grouped)?(Allreduce|Allgather|Broadcast|Alltoall|Reducescatter|Join|Barrier)"
    r"|Horovod has been shut down|Horovod's shared-memory all-reduce"
)


def elastic_run(fn: Any) -> Any:
    """Horovod Elastic's run decorator (either Keras), which resets on any collective's failure
    and lets every other error through.

    Horovod's own (`horovod.tensorflow.elastic.run`) resets only on an UnknownError whose text
    names HorovodAllreduce, HorovodAllgather or HorovodBroadcast, and returns None for any other:
    a lost worker seen in the gradients' grouped all-reduce (HorovodGroupedAllreduce), or an
    unreadable image, ended the fit quietly as if it had finished.
    """
    from horovod.common.elastic import run_fn
    from horovod.common.exceptions import HorovodInternalError
    from horovod.tensorflow.elastic import _reset

    @functools.wraps(fn)
    def failing_collectives_reset(state: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(state, *args, **kwargs)
        except tf.errors.OpError as e:
            if _COLLECTIVE.search(e.message):
                raise HorovodInternalError(e) from e
            raise

    return run_fn(failing_collectives_reset, _reset)
