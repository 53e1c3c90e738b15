"""The speed knobs: core binding, mixed precision, and the Horovod optimizer with its gradient
compression, accumulation and loss scaling. Each is applied at the one point of the run where
it must be: binding before Horovod and TensorFlow start threads, the precision policy before
the model is built, the optimizer wrapping at compile.
"""

from __future__ import annotations

import os
from typing import Any

import tensorflow as tf

from hvd_train.base import xla_env
from hvd_train.config import Config, Derived, RuntimeConfig
from hvd_train.runtime import cores, distributed, xla
from hvd_train.runtime.keras import binding


def before_init(runtime: RuntimeConfig) -> None:
    """What must happen before `hvd.init()` and before TensorFlow creates its thread pools."""
    if cores.wanted(runtime.bind_cores):
        cores.bind()
    # The commands made this decision before Horovod's library loaded (xla.py); a caller that
    # imported the trainer first gets auto-clustering here.
    xla.prepare(runtime.jit_compile)


def jit_compile(runtime: RuntimeConfig, device: str) -> bool:
    """Keras' `jit_compile` for model.compile: the whole train step where XLA can compile the
    all-reduce (xla_env.whole_step)."""
    return xla_env.whole_step(runtime.jit_compile, device == "gpu")


def precision_policy(runtime: RuntimeConfig) -> str:
    """The Keras precision policy `runtime.mixed_precision` asks for."""
    return "float32" if runtime.mixed_precision == "none" else runtime.mixed_precision


def distributed_optimizer(optimizer: Any, cfg: Config) -> Any:
    """Wraps `optimizer` in the active Keras' distributed optimizer with the configured knobs,
    and in a LossScaleOptimizer under mixed_float16, in the order that keeps every rank's
    decision to skip a step on inf/NaN the same (see each binding's `distributed_optimizer`)."""
    return binding.active().distributed_optimizer(
        optimizer,
        # Horovod: float16 on the wire halves the bytes; values are cast back after the sum.
        fp16=cfg.horovod.compression == "fp16",
        # Horovod: sum this many batches locally, all-reduce once, divide: the update is the
        # mean gradient over the effective batch, as one step of that batch would give.
        accumulation=cfg.train.gradient_accumulation_steps,
        loss_scale=cfg.runtime.mixed_precision == "mixed_float16",
    )


def log_knobs(cfg: Config, plan: Derived) -> None:
    """One line on rank 0 for the speed knobs that are on; each rank's cores when bound."""
    parts = []
    if plan.accumulation_steps > 1:
        parts.append(
            f"gradient accumulation: {plan.accumulation_steps} batches per update, effective "
            f"batch {plan.effective_batch}"
        )
    if cfg.runtime.mixed_precision != "none":
        parts.append(f"precision {cfg.runtime.mixed_precision}")
    if cfg.horovod.compression != "none":
        parts.append(f"gradients sent as {cfg.horovod.compression}")
    if cfg.runtime.jit_compile:
        auto = tf.config.optimizer.get_jit() == "autoclustering"
        parts.append(
            "XLA auto-clustering (the all-reduce outside)"
            if auto
            else "XLA: the whole train step, Horovod's all-reduce tensor by tensor"
        )
    if cfg.horovod.timeline:
        parts.append("Horovod timeline on (its writer thread polls on rank 0: slower steps)")
    shared = distributed.shared_memory_allreduce()
    if distributed.controller() == "mpi":
        if os.environ.get("OMPI_MCA_mpi_yield_when_idle"):
            parts.append("Open MPI polling yields the core (OMPI_MCA_mpi_yield_when_idle=1)")
        if not shared and distributed.ONE_HOST_RING.items() <= os.environ.items():
            parts.append("Open MPI's ring all-reduce (one CPU host)")
    if shared:
        parts.append("gradients all-reduced through shared memory (one host)")
    if parts:
        distributed.log(" | ".join(parts))
    if cores.bound():
        distributed.log(
            f"bound to cores {cores.bound()}, Horovod thread on core "
            f"{os.environ['HOROVOD_THREAD_AFFINITY'].split(',')[distributed.local_rank()]}, "
            f"{tf.config.threading.get_intra_op_parallelism_threads()} intra-op threads",
            all_ranks=True,
        )
