"""Learning-rate schedules, stepped per batch inside the optimizer.

The schedule reads the optimizer's own step counter, so its position is part of the optimizer
state: a resumed run continues it exactly, and no callback has to set the rate each batch.

The schedule lives in epochs: its lengths are set in epochs (`optimizer.warmup_epochs`,
`step_boundaries_epochs`, `decay_epochs`, `train.epochs`) and counted in steps of this job's
`steps_per_epoch`. The step counter means other epochs at another worker count or batch size,
so a resume or a Horovod Elastic reset re-bases the schedule (`continue_at`): from then on its
position is the epoch it resumed at plus the steps taken since, and the run continues at the
same point of its schedule: the warm-up ends at the same epoch and the decays reach their floor
at the last epoch's last step. A fresh run's position is the step counter itself.

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
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import tensorflow as tf

from hvd_train.config import Config, Derived, OptimizerConfig
from hvd_train.config.typed_yaml import choices
from hvd_train.runtime.keras import binding

DECAYS = choices(OptimizerConfig, "schedule")  # constant, step, cosine, ...


@dataclass(frozen=True)
class Schedule:
    """What a WarmupScaled schedule follows (see the module docstring): a linear ramp from
    `base_lr` to `scaled_lr` over `warmup_steps`, then `decay` on `scaled_lr`. With the
    defaults: the ramp, then `scaled_lr`. Its fields are the schedule's Keras config.

    Attributes:
        total_steps: the run's last step + 1 (epochs x steps per epoch); cosine and
            warmup_decay reach the floor at its last step, `total_steps - 1`.
        boundaries: steps at which `step` multiplies the rate by `factor`.
        decay_steps: steps over which `exponential` multiplies the rate by `decay_rate`.
        min_fraction: the lowest rate, as a fraction of `scaled_lr`.
        steps_per_epoch: the steps of an epoch, in which the lengths above are counted; the
            position the schedule is re-based to (`continue_at`) is in epochs. Defaults to 1.
    """

    base_lr: float
    scaled_lr: float
    warmup_steps: int
    decay: str = "constant"
    total_steps: int = 0
    boundaries: Sequence[int] = ()
    factor: float = 0.1
    decay_rate: float = 1.0
    decay_steps: float = 1.0
    min_fraction: float = 0.0
    steps_per_epoch: int = 1


class WarmupScaledMath:
    """The schedule's rates, for either Keras: `warmup_scaled` makes it a LearningRateSchedule
    of the Keras that trains. It follows a `Schedule`.

    Goyal et al. (2017), "Accurate, Large Minibatch SGD": with k times the batch, use k times
    the rate, reached gradually so the first steps do not diverge.
    """

    def __init__(self, schedule: Schedule):
        s = schedule
        if s.decay not in DECAYS:
            raise ValueError(f"decay: expected one of {DECAYS}, got {s.decay!r}")
        self.base_lr = float(s.base_lr)
        self.scaled_lr = float(s.scaled_lr)
        self.warmup_steps = int(s.warmup_steps)
        self.decay = s.decay
        self.total_steps = int(s.total_steps)
        self.boundaries = [int(b) for b in s.boundaries]
        self.factor = float(s.factor)
        self.decay_rate = float(s.decay_rate)
        self.decay_steps = float(s.decay_steps)
        self.min_fraction = float(s.min_fraction)
        self.steps_per_epoch = int(s.steps_per_epoch)
        # Scales the whole schedule (warm-up and decay alike): ReduceLROnPlateau's lever (see
        # train/callbacks/user_callbacks.py), kept in each checkpoint's state.json. Not in
        # get_config: a fresh schedule starts at 1, and x 1.0 leaves every rate bit for bit as
        # it was.
        self.multiplier = tf.Variable(1.0, trainable=False, dtype=tf.float32, name="lr_multiplier")
        # The origin: the step counter `origin_step` is at `origin_epoch` of the run (see
        # `continue_at`). Not in get_config either: a fresh schedule starts at 0, 0, where the
        # position is the step counter itself, bit for bit. float64: the position is a whole
        # number of steps again after x steps_per_epoch.
        self.origin_epoch = tf.Variable(0.0, trainable=False, dtype=tf.float64, name="lr_origin")
        self.origin_step = tf.Variable(0, trainable=False, dtype=tf.int64, name="lr_origin_step")

    def __call__(self, step: tf.Tensor) -> tf.Tensor:
        """The rate at the optimizer's step counter `step` (a scalar or a vector of steps)."""
        return self._unscaled(self.position(step)) * self.multiplier

    def continue_at(self, epoch: float, iterations: int) -> None:
        """Re-bases the schedule: the optimizer's step counter `iterations` is at `epoch` of
        the run (the epochs done, a fraction for a part of one); the counter's later steps
        follow on from there, one `1 / steps_per_epoch` of an epoch each."""
        self.origin_epoch.assign(float(epoch))
        self.origin_step.assign(int(iterations))

    def position(self, step: tf.Tensor) -> tf.Tensor:
        """The run's position at the step counter `step`, in steps of this schedule's epoch
        (float32): `origin_epoch x steps_per_epoch + step - origin_step`."""
        since = tf.cast(step, tf.float64) - tf.cast(self.origin_step, tf.float64)
        return tf.cast(self.origin_epoch * self.steps_per_epoch + since, tf.float32)

    def _unscaled(self, step: tf.Tensor) -> tf.Tensor:
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

    @classmethod
    def from_config(cls, config: dict) -> WarmupScaledMath:
        """Keras rebuilds a saved schedule from `get_config`'s fields: a `Schedule`'s."""
        return cls(Schedule(**config))

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
            "steps_per_epoch": self.steps_per_epoch,
        }


@functools.cache
def schedule_class(keras: ModuleType) -> type:
    """WarmupScaled as `keras`'s LearningRateSchedule, registered for (de)serialization: a
    saved optimizer that holds one loads once this has run (runtime/keras/v3.py runs it at
    import)."""
    cls = type(
        "WarmupScaled",
        (WarmupScaledMath, keras.optimizers.schedules.LearningRateSchedule),
        {"__module__": __name__, "__doc__": WarmupScaledMath.__doc__},
    )
    return keras.utils.register_keras_serializable(package="hvd_train")(cls)


def warmup_scaled(keras: ModuleType | None, *args: Any, **kwargs: Any) -> WarmupScaledMath:
    """A WarmupScaled schedule (arguments: `Schedule`'s) for `keras` (the active Keras when
    None)."""
    return schedule_class(keras or binding.keras())(Schedule(*args, **kwargs))


def lr_multiplier(optimizer: Any) -> tf.Variable | None:
    """The multiplier of the optimizer's WarmupScaled schedule; None for another rate."""
    schedule = _schedule(optimizer)
    return schedule.multiplier if schedule is not None else None


def continue_at(optimizer: Any, epoch: float) -> None:
    """Re-bases the optimizer's WarmupScaled schedule (none: nothing to do) so that its next
    step, at the step counter as it is now, trains at `epoch` of the run: after a resume or an
    Elastic reset, whose worker count or batch size may not be the one that advanced the
    counter."""
    schedule = _schedule(optimizer)
    if schedule is not None:
        inner = getattr(optimizer, "inner_optimizer", optimizer)
        schedule.continue_at(epoch, int(inner.iterations.numpy()))


def _schedule(optimizer: Any) -> WarmupScaledMath | None:
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # under mixed_float16's loss scale
    schedule = getattr(inner, "_learning_rate", None)
    return schedule if isinstance(schedule, WarmupScaledMath) else None


def learning_rate_schedule(cfg: Config, plan: Derived) -> WarmupScaledMath:
    """The schedule the run follows: `optimizer.schedule` after the warm-up, both on the rates
    and steps `derive` computed for this worker count, for the active Keras."""
    return schedule_class(binding.keras())(run_schedule(cfg, plan))


def run_schedule(cfg: Config, plan: Derived) -> Schedule:
    """The run's `Schedule` (see `learning_rate_schedule`)."""
    o, spe = cfg.optimizer, plan.steps_per_epoch
    return Schedule(
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
        steps_per_epoch=spe,
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
    values = rates(WarmupScaledMath(run_schedule(cfg, plan)), total)
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
