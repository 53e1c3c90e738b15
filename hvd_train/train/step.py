"""The training step, built once for both `train` and `data-bench`: the model under the
precision policy, the optimizer with its learning-rate schedule, Horovod's DistributedOptimizer
(and the loss scaler under mixed_float16), the loss, and XLA where the step compiles whole.

`data-bench` measures what the model consumes with this same step, so its figure is the
trainer's step and not a lighter one.
"""

from __future__ import annotations

from typing import Any

from hvd_train.config.rules import refuse_keras2_loss_scale_with_accumulation
from hvd_train.data.job import Job
from hvd_train.runtime import tuning
from hvd_train.runtime.keras import binding
from hvd_train.runtime.schedules import learning_rate_schedule
from hvd_train.train.models import build_model


def build_compiled_model(job: Job, device: str) -> Any:
    """The configured model, compiled for distributed training on this worker, with the
    Keras it was built with (runtime/keras/binding.py: the active binding afterwards).

    Args:
        job: the config (`model`, `optimizer`, `runtime`, `horovod`, `train`), the derived
            sizes (the schedule's rates and steps) and the data (one example's shape, the
            classes the head predicts).
        device: "gpu" or "cpu", from `distributed.configure_devices`: XLA compiles the whole
            step only on GPU (on CPU, Horovod's all-reduce has no XLA kernel).
    """
    cfg, input_shape, num_classes = job.cfg, job.source.input_shape, job.source.num_classes
    model = build_model(cfg, input_shape, num_classes)  # the active binding is the model's now
    active = binding.active()
    if active.NAME == binding.KERAS2:  # runtime.keras: auto, and the model is Keras 2's
        refuse_keras2_loss_scale_with_accumulation(cfg)
    keras = active.keras
    model.compile(
        # Horovod: average gradients across workers with ring-allreduce (compression,
        # accumulation and loss scaling as configured: see tuning.distributed_optimizer).
        optimizer=tuning.distributed_optimizer(make_optimizer(job), cfg),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=cfg.model.from_logits),
        metrics=["accuracy"],
        # Always explicit: Keras 3's "auto" is XLA on a GPU, all-reduce included, which XLA
        # cannot compile here (tuning.jit_compile says when it can).
        jit_compile=tuning.jit_compile(cfg.runtime, device),
        # Steps per call into TensorFlow; the callbacks run between calls (train/callbacks/stop.py
        # counts the steps from the batch index Keras gives them).
        steps_per_execution=cfg.train.steps_per_execution,
    )
    active.build_for_training(model, input_shape, num_classes)
    return model


def make_optimizer(job: Job) -> Any:
    """The configured optimizer of the active Keras, its rate following `optimizer.schedule`
    after the warm-up (scaled for `job`'s worker count)."""
    keras = binding.keras()
    o, lr = job.cfg.optimizer, learning_rate_schedule(job.cfg, job.plan)
    if o.name == "sgd":
        return keras.optimizers.SGD(lr, momentum=o.momentum)
    if o.name == "adam":
        return keras.optimizers.Adam(lr)
    if o.name == "adamw":
        return keras.optimizers.AdamW(lr, weight_decay=o.weight_decay)
    return keras.optimizers.RMSprop(lr, momentum=o.momentum)
