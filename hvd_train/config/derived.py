"""The run's plan: batch sizes, learning rate and steps, computed in one place (`derive`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hvd_train.base.errors import ConfigError, DataError
from hvd_train.config.rules import check
from hvd_train.config.schema import Config


@dataclass(frozen=True)
class Derived:
    """The run's plan: values computed from the config and the job (the only place they are
    computed), passed around as `plan`."""

    world_size: int
    per_worker_batch: int
    global_batch: int
    lr_factor: float  # how much larger an update's batch is than the batch the rate is set for
    base_lr: float
    scaled_lr: float
    steps_per_epoch: int
    warmup_steps: int
    examples_per_epoch: int  # examples that take part in an epoch (after drop or pad)
    accumulation_steps: int = 1  # batches per all-reduce and update (a divisor of the steps)
    effective_batch: int = 0  # examples per update, all workers: global_batch x accumulation


def derive(cfg: Config, world_size: int, num_train: int) -> Derived:
    """Batch sizes, learning rate and steps for `world_size` workers and `num_train` examples.

    The learning rate is defined for the batch one worker would take. With
    `batch_size_mode: per_worker` the global batch grows with the workers, so the rate is scaled
    by the worker count (`linear`: x N, `sqrt`: x sqrt(N)). With `global` the batch, and so the
    rate, do not change with the worker count. Gradient accumulation over A batches makes each
    update's batch A times larger, so the rate is scaled by A too (by sqrt(A) for `sqrt`), and
    the steps of an epoch are rounded down to a multiple of A so every epoch ends with an update.
    """
    check(cfg, world_size)
    t = cfg.train
    if t.batch_size_mode == "per_worker":
        per_worker, global_batch, k = t.batch_size, t.batch_size * world_size, world_size
    else:
        per_worker, global_batch, k = t.batch_size // world_size, t.batch_size, 1
    acc = t.gradient_accumulation_steps
    k *= acc  # an update averages `acc` batches: the learning rate follows the effective batch
    factor = {"linear": float(k), "sqrt": math.sqrt(k), "none": 1.0}[cfg.optimizer.lr_scaling]
    if num_train < global_batch:
        raise DataError(
            f"data: {num_train} training examples are fewer than one global batch of "
            f"{global_batch} ({world_size} workers x {per_worker}); lower train.batch_size"
        )
    full, rest = divmod(num_train, global_batch)
    steps = full + (1 if rest and cfg.data.remainder == "pad_by_repeat" else 0)
    if t.steps_per_epoch is not None:
        steps = min(steps, t.steps_per_epoch)
    if steps < acc:
        raise DataError(
            f"train.gradient_accumulation_steps: {acc} batches per update but an epoch has only "
            f"{steps} steps; lower gradient_accumulation_steps or train.batch_size"
        )
    steps -= steps % acc  # every epoch ends with an update: no gradients carried across epochs
    _check_steps_per_execution(t.steps_per_execution, steps, acc, world_size)
    return Derived(
        world_size=world_size,
        per_worker_batch=per_worker,
        global_batch=global_batch,
        lr_factor=factor,
        base_lr=cfg.optimizer.learning_rate,
        scaled_lr=cfg.optimizer.learning_rate * factor,
        steps_per_epoch=steps,
        warmup_steps=round(cfg.optimizer.warmup_epochs * steps),
        examples_per_epoch=steps * global_batch,
        accumulation_steps=acc,
        effective_batch=global_batch * acc,
    )


def _check_steps_per_execution(k: int, steps: int, acc: int, world_size: int) -> None:
    """Keras 3 runs every call into TensorFlow to its full `k` steps, and the batches of all
    epochs are one stream (data/pipeline.py): an epoch's last call would run on into the next
    epoch's batches. So `k` must divide the epoch's steps (the same rule on Keras 2, so a run
    means the same on either Keras)."""
    if steps % k == 0:
        return
    divisors = [d for d in range(1, steps + 1) if steps % d == 0]
    near = sorted(divisors, key=lambda d: (abs(d - k), d))[:4]
    whole = math.lcm(k, acc)  # a cap must keep whole accumulation windows too
    cap = f", or set train.steps_per_epoch to {steps - steps % whole}" if steps > whole else ""
    raise ConfigError(
        f"train.steps_per_execution: {k} does not divide an epoch's {steps} steps at "
        f"{world_size} worker(s) (the epoch's last call would run into the next epoch's "
        f"batches); use a divisor of {steps} ({', '.join(map(str, sorted(near)))}){cap}"
    )
