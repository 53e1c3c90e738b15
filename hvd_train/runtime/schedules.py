"""Learning-rate schedules, stepped per batch inside the optimizer.

The schedule reads the optimizer's own step counter, so its position is part of the optimizer
state: a resumed run continues it exactly, and no callback has to set the rate each batch.

Every schedule has the same two phases. The warm-up ramps linearly from `base_lr` (the rate
for one worker's batch) to `scaled_lr` (scaled by the worker count) over `warmup_steps`. Then
the decay runs on `scaled_lr`:

- `constant`: `scaled_lr`.
- `step`: `scaled_lr x step_factor^k`, k = boundaries passed; boundaries count from step 0.
- `cosine`: half a cosine from `scaled_lr` to `min_lr_fraction x scaled_lr`, from the end of
  the warm-up to the run's last step, which trains at `min_lr_fraction x scaled_lr`.
- `exponential`: `scaled_lr x decay_rate^(t / decay_steps)`, t counted from the end of the
  warm-up, never below `min_lr_fraction x scaled_lr`.
- `warmup_decay`: a straight line from `scaled_lr` to `min_lr_fraction x scaled_lr`, from the
  end of the warm-up to the run's last step, which trains at `min_lr_fraction x scaled_lr`.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import tensorflow as tf

from hvd_train.config import Config, Derived, OptimizerConfig
from hvd_train.config.typed_yaml import choices
from hvd_train.runtime import binding

DECAYS = choices(OptimizerConfig, "schedule")  # constant, step, cosine, ...


class WarmupScaledMath:
    """The schedule's rates, for either Keras: `warmup_scaled` makes it a LearningRateSchedule
    of the Keras that trains.

    Linear ramp from `base_lr` to `scaled_lr` over `warmup_steps`, then `decay` on
    `scaled_lr` (see the module docstring). With the defaults: the ramp, then `scaled_lr`.

    Goyal et al. (2017), "Accurate, Large Minibatch SGD": with k times the batch, use k times
    the rate, reached gradually so the first steps do not diverge.

    Args:
        total_steps: the run's last step + 1 (epochs x steps per epoch); cosine and
            warmup_decay reach the floor at its last step, `total_steps - 1`.
        boundaries: steps at which `step` multiplies the rate by `factor`.
        decay_steps: steps over which `exponential` multiplies the rate by `decay_rate`.
        min_fraction: the lowest rate, as a fraction of `scaled_lr`.
    """

    def __init__(
        self,
        base_lr: float,
        scaled_lr: float,
        warmup_steps: int,
        decay: str = "constant",
        total_steps: int = 0,
        boundaries: Sequence[int] = (),
        factor: float = 0.1,
        decay_rate: float = 1.0,
        decay_steps: float = 1.0,
        min_fraction: float = 0.0,
    ):
        if decay not in DECAYS:
            raise ValueError(f"decay: expected one of {DECAYS}, got {decay!r}")
        self.base_lr = float(base_lr)
        self.scaled_lr = float(scaled_lr)
        self.warmup_steps = int(warmup_steps)
        self.decay = decay
        self.total_steps = int(total_steps)
        self.boundaries = [int(b) for b in boundaries]
        self.factor = float(factor)
        self.decay_rate = float(decay_rate)
        self.decay_steps = float(decay_steps)
        self.min_fraction = float(min_fraction)
        # Scales the whole schedule (warm-up and decay alike): ReduceLROnPlateau's lever (see
        # user_callbacks.py), kept in each checkpoint's state.json. Not in get_config: a fresh
        # schedule starts at 1, and x 1.0 leaves every rate bit for bit as it was.
        self.multiplier = tf.Variable(1.0, trainable=False, dtype=tf.float32, name="lr_multiplier")

    def __call__(self, step: tf.Tensor) -> tf.Tensor:
        """The rate at `step` (a scalar or a vector of steps)."""
        return self._unscaled(step) * self.multiplier

    def _unscaled(self, step: tf.Tensor) -> tf.Tensor:
        step = tf.cast(step, tf.float32)
        after = self._decayed(step)
        if self.warmup_steps <= 0:
            return after
        ramp = self.base_lr + (self.scaled_lr - self.base_lr) * step / self.warmup_steps
        return tf.where(step < self.warmup_steps, ramp, after)

    def _decayed(self, step: tf.Tensor) -> tf.Tensor:
        peak, floor = self.scaled_lr, self.scaled_lr * self.min_fraction
        t = tf.maximum(step - self.warmup_steps, 0.0)  # steps since the warm-up ended
        # the decays end at the run's last step (total_steps - 1): that step trains at the floor
        span = float(max(self.total_steps - 1 - self.warmup_steps, 1))
        done = tf.minimum(t / span, 1.0)
        if self.decay == "step":
            bounds = tf.constant(self.boundaries, tf.float32)
            passed = tf.reduce_sum(tf.cast(tf.expand_dims(step, -1) >= bounds, tf.float32), -1)
            return peak * tf.pow(self.factor, passed)
        if self.decay == "cosine":
            return floor + (peak - floor) * 0.5 * (1.0 + tf.cos(math.pi * done))
        if self.decay == "warmup_decay":
            return floor + (peak - floor) * (1.0 - done)
        if self.decay == "exponential":
            return tf.maximum(peak * tf.pow(self.decay_rate, t / self.decay_steps), floor)
        return peak + 0.0 * step  # constant, shaped like `step`

    def get_config(self) -> dict:
        return {
            "base_lr": self.base_lr,
            "scaled_lr": self.scaled_lr,
            "warmup_steps": self.warmup_steps,
            "decay": self.decay,
            "total_steps": self.total_steps,
            "boundaries": list(self.boundaries),
            "factor": self.factor,
            "decay_rate": self.decay_rate,
            "decay_steps": self.decay_steps,
            "min_fraction": self.min_fraction,
        }


@functools.cache
def schedule_class(keras: ModuleType) -> type:
    """WarmupScaled as `keras`'s LearningRateSchedule, registered for (de)serialization: a
    saved optimizer that holds one loads once this has run (runtime/keras3.py runs it at
    import)."""
    cls = type(
        "WarmupScaled",
        (WarmupScaledMath, keras.optimizers.schedules.LearningRateSchedule),
        {"__module__": __name__, "__doc__": WarmupScaledMath.__doc__},
    )
    return keras.utils.register_keras_serializable(package="hvd_train")(cls)


def warmup_scaled(keras: ModuleType | None, *args: Any, **kwargs: Any) -> WarmupScaledMath:
    """A WarmupScaled schedule (arguments: WarmupScaledMath) for `keras` (the active Keras when
    None)."""
    return schedule_class(keras or binding.keras())(*args, **kwargs)


def lr_multiplier(optimizer: Any) -> tf.Variable | None:
    """The multiplier of the optimizer's WarmupScaled schedule; None for another rate."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # under mixed_float16's loss scale
    schedule = getattr(inner, "_learning_rate", None)
    return schedule.multiplier if isinstance(schedule, WarmupScaledMath) else None


def learning_rate_schedule(cfg: Config, plan: Derived) -> WarmupScaledMath:
    """The schedule the run follows: `optimizer.schedule` after the warm-up, both on the rates
    and steps `derive` computed for this worker count, for the active Keras."""
    return warmup_scaled(None, **schedule_arguments(cfg, plan))


def schedule_arguments(cfg: Config, plan: Derived) -> dict[str, Any]:
    """WarmupScaledMath's arguments for the run's schedule (see `learning_rate_schedule`)."""
    o, spe = cfg.optimizer, plan.steps_per_epoch
    return dict(
        base_lr=plan.base_lr,
        scaled_lr=plan.scaled_lr,
        warmup_steps=plan.warmup_steps,
        decay=o.schedule,
        total_steps=cfg.train.epochs * spe,
        boundaries=[b * spe for b in o.step_boundaries_epochs],
        factor=o.step_factor,
        decay_rate=o.decay_rate,
        decay_steps=o.decay_epochs * spe,
        min_fraction=o.min_lr_fraction,
    )


def rates(schedule: WarmupScaledMath, total_steps: int) -> list[float]:
    """The rate at every step `0 .. total_steps - 1`."""
    return schedule(tf.range(total_steps)).numpy().tolist()


def plot(cfg: Config, plan: Derived, out: str) -> list[float]:
    """Draws the run's schedule (rate against epoch) to the PNG `out`; returns the rates."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    total = cfg.train.epochs * plan.steps_per_epoch
    # The schedule's rates alone: no Keras, no Horovod (lr-plot imports neither).
    values = rates(WarmupScaledMath(**schedule_arguments(cfg, plan)), total)
    epochs = [s / plan.steps_per_epoch for s in range(total)]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(epochs, values)
    if plan.warmup_steps:
        ax.axvline(
            plan.warmup_steps / plan.steps_per_epoch, color="grey", ls="--", label="warm-up end"
        )
        ax.legend()
    ax.set_xlabel("epoch")
    ax.set_ylabel("learning rate")
    ax.set_title(
        f"{cfg.optimizer.schedule}: {plan.world_size} worker(s), global batch {plan.global_batch}, "
        f"{plan.steps_per_epoch} steps/epoch"
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return values
