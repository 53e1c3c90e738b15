"""Horovod's Keras callbacks (`horovod.tensorflow.keras.callbacks`), under its names, on Keras 3."""

from __future__ import annotations

from collections.abc import Callable

import horovod.tensorflow as _hvd

from hvd_train.runtime.keras import v3 as _core
from hvd_train.runtime.keras.v3 import keras  # the binding's Keras 3


class BroadcastGlobalVariablesCallback(_core.BroadcastInitialState):
    """`root_rank`'s model and optimizer variables to every rank, so that every replica trains
    from the same state: put it first in `fit`'s callbacks. Horovod's name and arguments for
    the trainer's broadcast (hvd_train.runtime.keras.v3.BroadcastInitialState, which says what
    is broadcast and when), and `register_local_var(var)`: a variable each rank keeps its own.
    """

    def __init__(self, root_rank: int, device: str = "", local_variables: list | None = None):
        super().__init__(root_rank, device, local_variables)


# Every number in the epoch's logs averaged over the workers, so that each worker's
# EarlyStopping, checkpoint, History and console see the same values: Horovod's name for the
# trainer's (`MetricAverageCallback(device="")`; put it after the broadcast and before the
# callbacks that read metrics).
MetricAverageCallback = _core.MetricAverage


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Horovod's: the optimizer's learning rate set to `initial_lr * multiplier(epoch)` between
    `start_epoch` and `end_epoch`, at each epoch's first batch (`staircase`) or at every batch
    with a fractional epoch. `multiplier`: a function of the epoch, or a number m for m to the
    power of (epoch - start_epoch).

    Keras 3 compiles the optimizer's momentum into the step, so Horovod's momentum correction
    (scaling the momentum with each change of rate, for the batch it changes in) cannot be
    done: with an optimizer that has momentum, `momentum_correction=True` (Horovod's default)
    raises when training begins; pass False. Adam and the others without it are unaffected.
    The optimizer's learning rate must be a number (a variable), not a schedule.
    """

    def __init__(
        self, initial_lr: float, multiplier: float | Callable[[float], float], start_epoch: int = 0,
        end_epoch: int | None = None, staircase: bool = True, momentum_correction: bool = True,
        steps_per_epoch: int | None = None, verbose: int = 0,
    ):  # fmt: skip
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr = initial_lr
        self.start_epoch, self.end_epoch, self.staircase = start_epoch, end_epoch, staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = 0
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.multiplier = lambda epoch: multiplier ** (epoch - start_epoch)

    def on_train_begin(self, logs: dict | None = None) -> None:
        optimizer = _core.inner_optimizer(self.model.optimizer)
        if self.momentum_correction and getattr(optimizer, "momentum", 0):
            raise ValueError(
                f"{type(self).__name__}: momentum_correction=True cannot be done on Keras 3, "
                "which compiles the optimizer's momentum into the step; pass "
                "momentum_correction=False"
            )
        if _core.schedule_of(optimizer) is not None:
            raise ValueError(
                f"{type(self).__name__}: the optimizer's learning rate is a schedule, which "
                "this callback cannot set; give the optimizer a number"
            )
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self.params.get("steps")
            if not self.steps_per_epoch:
                raise ValueError(
                    "Could not autodetect the number of steps per epoch. Please specify the "
                    f"steps_per_epoch parameter to the {type(self).__name__}()"
                )

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        epoch = self.current_epoch
        if epoch < self.start_epoch or (self.end_epoch is not None and epoch >= self.end_epoch):
            return
        if self.staircase and batch == 0:
            self._set(epoch)
        elif not self.staircase:
            self._set(epoch + float(batch) / self.steps_per_epoch)

    def _set(self, epoch: float) -> None:
        optimizer = _core.inner_optimizer(self.model.optimizer)
        optimizer.learning_rate.assign(self.initial_lr * self.multiplier(epoch))

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None:
            logs["lr"] = float(_core.inner_optimizer(self.model.optimizer).learning_rate.numpy())


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Horovod's warm-up: the rate rises from `initial_lr / size` to `initial_lr` over
    `warmup_epochs`, batch by batch (Goyal et al., 2017). `initial_lr` is the scaled rate, as in
    Horovod's examples (`0.001 * hvd.size()`). `momentum_correction` as in
    LearningRateScheduleCallback."""

    def __init__(
        self, initial_lr: float, warmup_epochs: int = 5, momentum_correction: bool = True,
        steps_per_epoch: int | None = None, verbose: int = 0,
    ):  # fmt: skip
        def multiplier(epoch: float) -> float:
            # As Horovod's: round numbers at each epoch's end.
            epoch += 1.0 / self.steps_per_epoch
            return 1.0 / _hvd.size() * (epoch * (_hvd.size() - 1) / warmup_epochs + 1)

        super().__init__(
            initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
            momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch,
            verbose=verbose,
        )  # fmt: skip

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and _hvd.rank() == 0:
            rate = float(_core.inner_optimizer(self.model.optimizer).learning_rate.numpy())
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {rate:g}.")


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Horovod's: a ModelCheckpoint that keeps only the best model. Horovod's Spark estimator
    sets its file; elsewhere give `filepath` (Keras 3: ending `.keras`, or `.weights.h5` with
    `save_weights_only`). Like Horovod's, it saves on every rank that has it: add it on rank 0
    alone to write one file."""

    def __init__(
        self, monitor: str = "val_loss", verbose: int = 0, save_weights_only: bool = False,
        mode: str = "auto", save_freq: str | int = "epoch", filepath: str | None = None,
    ):  # fmt: skip
        if filepath is None:
            raise ValueError(
                "BestModelCheckpoint: give filepath= (Horovod's Spark estimator sets it; Keras "
                "3 needs it to end .keras, or .weights.h5 with save_weights_only=True)"
            )
        super().__init__(
            filepath, monitor=monitor, verbose=verbose, save_best_only=True,
            save_weights_only=save_weights_only, mode=mode, save_freq=save_freq,
        )  # fmt: skip
