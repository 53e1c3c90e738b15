"""Learning-rate schedules, stepped per batch inside the optimizer.

The schedule reads the optimizer's own step counter, so its position is part of the optimizer
state: a resumed run continues it exactly, and no callback has to set the rate each batch.
"""

from __future__ import annotations

import tensorflow as tf

from hvd_train.config import Derived


@tf.keras.utils.register_keras_serializable(package="hvd_train")
class WarmupScaled(tf.keras.optimizers.schedules.LearningRateSchedule):
    """Linear ramp from `base_lr` to `scaled_lr` over `warmup_steps`, then `scaled_lr`.

    Goyal et al. (2017), "Accurate, Large Minibatch SGD": with k times the batch, use k times
    the rate, reached gradually so the first steps do not diverge.
    """

    def __init__(self, base_lr: float, scaled_lr: float, warmup_steps: int):
        self.base_lr = float(base_lr)
        self.scaled_lr = float(scaled_lr)
        self.warmup_steps = int(warmup_steps)

    def __call__(self, step: tf.Tensor) -> tf.Tensor:
        step = tf.cast(step, tf.float32)
        if self.warmup_steps <= 0:
            return tf.fill([], self.scaled_lr)
        done = tf.minimum(step / self.warmup_steps, 1.0)
        return self.base_lr + (self.scaled_lr - self.base_lr) * done

    def get_config(self) -> dict:
        return {
            "base_lr": self.base_lr,
            "scaled_lr": self.scaled_lr,
            "warmup_steps": self.warmup_steps,
        }


def learning_rate_schedule(d: Derived) -> WarmupScaled:
    """The schedule the run follows, from the derived base and scaled rates."""
    return WarmupScaled(d.base_lr, d.scaled_lr, d.warmup_steps)
