"""The run's opening lines: the workers, batches, learning rate and steps it will train with."""

from __future__ import annotations

from hvd_train.base import device_choice
from hvd_train.data.job import Job
from hvd_train.runtime import distributed


def log_plan(job: Job, device: str) -> None:
    """The run's opening line (rank 0): workers, device, batches, learning rate, steps, data."""
    cfg, plan, source = job.cfg, job.plan, job.source
    used = plan.examples_per_epoch
    n = source.num_train
    rest = f"{n - used} unused per epoch" if used <= n else f"{used - n} repeated per epoch"
    rest += f", data.remainder: {cfg.data.remainder}"
    if source.description:
        distributed.log(source.description)
    warm = f", warm-up {cfg.optimizer.warmup_epochs:g} epochs" if plan.warmup_steps else ""
    k = cfg.train.steps_per_execution
    calls = f" ({k} a call into TensorFlow)" if k > 1 else ""
    shown = device_choice.label(cfg.runtime.device, device)  # "cpu (runtime.device: cpu)" if chosen
    distributed.log(
        f"{workers_label(plan.world_size)}, {shown} | batch {plan.per_worker_batch}/worker, "
        f"{plan.global_batch} global | learning rate {plan.base_lr:g} -> {plan.scaled_lr:g} "
        f"({lr_label(job)}{warm}) | {plan.steps_per_epoch} steps/epoch{calls} over {n} "
        f"training examples ({rest}) | {len(source.x_val)} validation examples"
    )


def workers_label(world_size: int) -> str:
    """'2 worker(s), gloo'; '1 worker (no launcher)' for a process started on its own."""
    c = distributed.controller()
    return "1 worker (no launcher)" if c == "none" else f"{world_size} worker(s), {c}"


def lr_label(job: Job) -> str:
    """How `derive` scaled the learning rate: 'linear x2 for 2 workers', or why it did not."""
    cfg, plan = job.cfg, job.plan
    if plan.lr_factor == 1.0:
        if cfg.optimizer.lr_scaling == "none":
            return "not scaled: optimizer.lr_scaling none"
        if cfg.train.batch_size_mode == "global" and plan.accumulation_steps == 1:
            return "not scaled: the global batch is fixed"
        return "not scaled: one worker"
    why = [f"{plan.world_size} workers"] if cfg.train.batch_size_mode == "per_worker" else []
    if plan.accumulation_steps > 1:
        why.append(f"{plan.accumulation_steps} accumulated batches")
    return f"{cfg.optimizer.lr_scaling} x{plan.lr_factor:.3g} for {' x '.join(why)}"
