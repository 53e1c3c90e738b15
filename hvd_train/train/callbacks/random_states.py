"""Each rank's random state: the dropout layers' generators, which advance at every draw.

Every rank builds the model from the same seed, so its generators start alike; each rank then
moves its own to a stream of its own (`start`), so that the workers' dropout masks differ, as
one worker's masks differ across a large batch. A checkpoint keeps every rank's states
(gathered on rank 0 wherever a checkpoint may be written, `RandomStates`), and a resumed run at
the same worker count gives each rank its own back: it then draws the masks the uninterrupted
run drew, and ends with the same metrics, dropout included (as accelerate's `save_state` keeps
each process's random states).

Which variables are random states is the binding's to say (`random_states`): Keras 3's seed
generators, Keras 2's tf.random.Generator states (its dropout draws from one: v2.py `seed`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hvd_train.runtime import distributed
from hvd_train.runtime.keras import binding
from hvd_train.train.callbacks.base import Callback

State = list[list[int]]  # one rank's: each generator's state, as JSON keeps it


def read(model: Any) -> State:
    """This rank's random states."""
    return [np.asarray(v.numpy()).tolist() for v in binding.active().random_states(model)]


def start(model: Any, saved: list[State] | None, world_size: int) -> str:
    """Gives this rank its random states: its own from a checkpoint written at this worker
    count (`saved`, one per rank), else its own stream (rank 0's unchanged, so one worker trains
    as before). Call after the model's weights were broadcast. Returns what it did, for the log.
    """
    variables = binding.active().random_states(model)
    rank = distributed.rank()
    if not variables:
        return "no random state"
    if saved and len(saved) == world_size and len(saved[rank]) == len(variables):
        for v, value in zip(variables, saved[rank], strict=True):
            v.assign(np.asarray(value, dtype=np.asarray(v.numpy()).dtype))
        return "each rank's random state restored"
    for v in variables:
        v.assign(binding.active().rank_random_state(np.asarray(v.numpy()), rank))
    return "each rank's random state its own"


def window_sums(model: Any) -> list[np.ndarray] | None:
    """This rank's running gradient sums when its accumulation window is part-way (each
    rank's own: runtime/replicas.py); None at a window's start, where they are zeros."""
    active = binding.active()
    if not active.mid_window(model):
        return None
    return [np.asarray(v.numpy()) for v in active.accumulation_sums(model)]


def start_window(model: Any, saved: list[list[np.ndarray]] | None, world_size: int) -> None:
    """After the resume's broadcast: the accumulation window where the checkpoint left it,
    with this rank's own running sums (`saved`, one list per rank). At another worker count
    each rank starts from the ranks' mean sums: the window's mean gradient is kept, not its
    exact examples. Call on every rank."""
    active = binding.active()
    active.start_window(model)
    sums = active.accumulation_sums(model)
    if not saved or not sums:
        return
    if len(saved) == world_size:
        mine = saved[distributed.rank()]
    else:
        mine = [np.mean(parts, axis=0) for parts in zip(*saved, strict=True)]
    for v, value in zip(sums, mine, strict=True):
        v.assign(value.astype(np.asarray(v.numpy()).dtype))


class RandomStates(Callback):
    """Gathers every rank's own state on rank 0 wherever the Checkpointer may write a
    checkpoint: at every epoch's end, and after every `checkpoint.every_steps` steps (a
    collective, on every rank alike). `gathered` is the latest random states, one State per
    rank; `sums` the ranks' running gradient sums when an accumulation window is part-way,
    else None."""

    def __init__(self, due: Callable[[], bool], mid_epoch: bool = True):
        """`due`: whether a checkpoint may be written after this call into TensorFlow (the run's
        `RunControl.passed(checkpoint.every_steps)`); `mid_epoch`: whether it can hold in this
        run (`checkpoint.every_steps` is set). Defaults to True."""
        super().__init__()
        self.due, self.mid_epoch = due, mid_epoch
        self.gathered: list[State] | None = None
        self.sums: list[list[np.ndarray]] | None = None
        # What else each rank sends in the same all-gather (the replica check's fingerprints,
        # set by sync_points.CheckReplicas), and every rank's of it, gathered at the last point.
        self.also: Callable[[], Any] | None = None
        self.also_gathered: list[Any] | None = None

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self.due():
            self._gather()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._gather()

    def _gather(self) -> None:
        if distributed.size() == 1:
            every = [(read(self.model), window_sums(self.model), None)]
        else:
            mine = (read(self.model), window_sums(self.model), self.also and self.also())
            every = distributed.allgather_object(mine, name="hvd_train.random_states")
            self.also_gathered = [also for _, _, also in every] if self.also else None
        self.gathered = [states for states, _, _ in every]
        # Part-way on one rank is part-way on all: the window's position is replicated.
        self.sums = None if every[0][1] is None else [sums for _, sums, _ in every]
