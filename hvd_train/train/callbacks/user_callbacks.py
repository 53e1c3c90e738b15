"""Users' own Keras callbacks (`callbacks:` in the config): built, placed on ranks, and their
stops agreed by every worker.

A callback that decides (EarlyStopping, TerminateOnNaN, the user's own) runs on every rank, so
each rank keeps its own state; one that writes files (ModelCheckpoint, CSVLogger, TensorBoard)
runs on rank 0 only. A stop is a decision every worker must take together: a worker that
leaves `fit` alone leaves the others waiting in the next all-reduce. So `AgreedStop`, after
the users' callbacks, turns every rank's `model.stop_training` into one decision at each
epoch's end, with one small all-reduce.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any

from hvd_train.base.errors import ConfigError
from hvd_train.config import REFUSED_CALLBACKS, CallbackConfig
from hvd_train.runtime import distributed
from hvd_train.runtime.keras import binding
from hvd_train.runtime.schedules import lr_multiplier
from hvd_train.train.callbacks.base import Callback
from hvd_train.train.callbacks.stop import AgreedStop, RunControl
from hvd_train.train.models import import_user_module

# Keras callbacks that write files: rank 0 only unless `ranks: all` says otherwise.
_WRITERS = ("ModelCheckpoint", "CSVLogger", "TensorBoard", "RemoteMonitor")


@dataclass
class UserCallbacks:
    """This rank's user callbacks, in config order, each followed by what watches its stops;
    `stop` last (every rank). `stop.stopped_early` says whether and why they ended the run."""

    callbacks: list[Any] = field(default_factory=list)
    stop: AgreedStop | None = None


def build_user_callbacks(specs: tuple[CallbackConfig, ...], control: RunControl) -> UserCallbacks:
    """Imports and constructs every `callbacks:` item on every rank (so a bad one fails on
    every rank alike), and keeps those that run on this rank.

    Raises:
        ConfigError: an item that cannot be imported or constructed (exit code 2).
    """
    if not specs:
        return UserCallbacks()
    stop = AgreedStop([_name(s) for s in specs], control)
    kept: list[Any] = []
    for i, spec in enumerate(specs):
        callback = construct(spec, i)
        if isinstance(callback, _reduce_lr_class(binding.keras())) and spec.ranks == "chief":
            raise ConfigError(
                f"callbacks[{i}].ranks: ReduceLROnPlateau changes every worker's learning rate, "
                "so it runs on every rank; remove ranks: chief"
            )
        if runs_here(spec, callback):
            kept += [callback, _Watch(stop, i, control)]
    return UserCallbacks([*kept, stop], stop)


def construct(spec: CallbackConfig, i: int) -> Any:
    """The Keras callback `callbacks[i]` names, built with its args."""
    cls = _resolve(spec.cls, i)
    try:
        return cls(**spec.kwargs())
    except (TypeError, ValueError) as e:
        params = ", ".join(p for p in inspect.signature(cls).parameters if p != "self")
        raise ConfigError(
            f"callbacks[{i}].args: {cls.__name__} rejected {sorted(spec.kwargs())}: "
            f"{' '.join(str(e).split())}; its arguments are: {params or 'none'}"
        ) from None


def runs_here(spec: CallbackConfig, callback: Any) -> bool:
    """`ranks`, else rank 0 only for the Keras callbacks that write files, else every rank."""
    writers = tuple(getattr(binding.keras().callbacks, name) for name in _WRITERS)
    ranks = spec.ranks or ("chief" if isinstance(callback, writers) else "all")
    return ranks == "all" or distributed.is_chief()


def _resolve(spec: str, i: int) -> type:
    where = f"callbacks[{i}].class"
    keras = binding.keras()
    callbacks = f"{_spelled(keras)}.callbacks"  # as users import it: keras, tf.keras
    module_name, _, name = spec.rpartition(":")
    if module_name:
        module = import_user_module(module_name, where)
    else:  # the shorthand: a bare name from keras.callbacks
        module, module_name = keras.callbacks, callbacks
    cls = getattr(module, name, None)
    if not (inspect.isclass(cls) and issubclass(cls, keras.callbacks.Callback)):
        found = "has no" if cls is None else "has no Keras callback class"
        raise ConfigError(
            f"{where}: {module_name} {found} {name!r}; name a subclass of "
            f"{callbacks}.Callback as 'module:Name' (or a {callbacks} name)"
        )
    if cls is keras.callbacks.ReduceLROnPlateau:
        return _reduce_lr_class(keras)  # ours: scales the schedule, not optimizer.lr
    if issubclass(cls, keras.callbacks.ReduceLROnPlateau):
        raise ConfigError(
            f"{where}: {cls.__name__} is a subclass of Keras' ReduceLROnPlateau, which sets "
            "optimizer.lr, and our rate is a schedule; use ReduceLROnPlateau itself (hvd_train "
            "runs its own version, which scales the schedule)"
        )
    for refused, why in REFUSED_CALLBACKS.items():
        if issubclass(cls, getattr(keras.callbacks, refused)):
            raise ConfigError(f"{where}: {cls.__name__} is a {refused}: {why}")
    return cls


def _spelled(keras: Any) -> str:
    """How users name the active Keras: `keras` (3), `tf_keras`, or `tf.keras` (2.15)."""
    return "tf.keras" if keras.__name__.startswith("tensorflow") else keras.__name__


def _name(spec: CallbackConfig) -> str:
    return spec.cls.rpartition(":")[2]


class _Watch(Callback):
    """Right after user callback `index`: notes that it asked to stop. A stop asked within an
    epoch is held until the epoch's end (see AgreedStop)."""

    def __init__(self, stop: AgreedStop, index: int, control: RunControl):
        super().__init__()
        self.stop, self.index, self.control = stop, index, control

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self._notice()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._notice()

    def _notice(self) -> None:
        # RunControl's own stops (signals) set stop_training too; those are not the user's.
        if self.model.stop_training and not self.control.stopping:
            self.stop.asked.add(self.index)  # (or an earlier callback did: the lowest wins)


def ReduceLROnPlateau(**kwargs: Any) -> Any:  # noqa: N802 - a callback class to its callers
    """Keras' ReduceLROnPlateau for a rate that is a schedule (see `_reduce_lr_class`)."""
    return _reduce_lr_class(binding.keras())(**kwargs)


@functools.cache
def _reduce_lr_class(keras: Any) -> type:
    """Keras' ReduceLROnPlateau for a rate that is a schedule: what `ReduceLROnPlateau` in
    `callbacks:` runs, with Keras' arguments and decisions.

    Keras' version sets `optimizer.lr`, which a LearningRateSchedule does not allow. This one
    multiplies the schedule's multiplier instead (schedules.WarmupScaled), so the warm-up and
    the decay go on, times the factor; checkpoints keep the multiplier (state.json). It runs on
    every rank: each worker's optimizer has its own rate, and all see the same averaged metrics.
    """

    class ReduceLROnPlateau(keras.callbacks.ReduceLROnPlateau):
        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            current = (logs or {}).get(self.monitor)
            if current is None:
                distributed.log(f"ReduceLROnPlateau: no {self.monitor!r} in this epoch's metrics")
                return
            if self.in_cooldown():
                self.cooldown_counter -= 1
                self.wait = 0
            if self._improved(current):
                self.best, self.wait = current, 0
            elif not self.in_cooldown():
                self.wait += 1
                if self.wait >= self.patience:
                    self._reduce(epoch)

        def _improved(self, current: float) -> bool:
            """Keras' decision: Keras 2's monitor_op holds min_delta; Keras 3 sets monitor_op
            at the first epoch's end, and `_is_improvement` adds min_delta."""
            if not hasattr(self, "_is_improvement"):
                return bool(self.monitor_op(current, self.best))
            if self.monitor_op is None:
                self._set_monitor_op()
            return bool(self._is_improvement(current, self.best))

        def _reduce(self, epoch: int) -> None:
            multiplier = lr_multiplier(self.model.optimizer)
            rate = binding.active().last_learning_rate(self.model.optimizer)
            if multiplier is None or rate <= self.min_lr:
                return
            new = max(rate * self.factor, self.min_lr)
            multiplier.assign(float(multiplier.numpy()) * new / rate)
            self.cooldown_counter, self.wait = self.cooldown, 0
            distributed.log(
                f"ReduceLROnPlateau: learning rate {rate:g} -> {new:g} after epoch {epoch + 1} "
                f"(the schedule x {float(multiplier.numpy()):g} from here on)"
            )

    return ReduceLROnPlateau
