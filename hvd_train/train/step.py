"""The training step, built once for both `train` and `data-bench`: the model under the
precision policy, the optimizer with its learning-rate schedule, Horovod's DistributedOptimizer
(and the loss scaler under mixed_float16), the loss, and XLA where the step compiles whole.

`data-bench` measures what the model consumes with this same step, so its figure is the
trainer's step and not a lighter one.
"""

from __future__ import annotations

import tensorflow as tf

from hvd_train.config import Config, Derived
from hvd_train.runtime import tuning
from hvd_train.runtime.keras_stack import keras
from hvd_train.train.models import build_model
from hvd_train.train.schedules import learning_rate_schedule


def build_compiled_model(
    cfg: Config,
    plan: Derived,
    input_shape: tuple[int, ...],
    num_classes: int,
    device: str,
) -> keras.Model:
    """The configured model, compiled for distributed training on this worker.

    Args:
        cfg: the config (`model`, `optimizer`, `runtime`, `horovod`, `train`).
        plan: the derived sizes: the schedule's rates and steps.
        input_shape: one example's shape.
        num_classes: the classes the head predicts.
        device: "gpu" or "cpu", from `distributed.configure_devices`: XLA compiles the whole
            step only on GPU (on CPU, Horovod's all-reduce has no XLA kernel).
    """
    tuning.apply_precision(cfg)  # before the model is built: layers take the policy in force
    model = build_model(cfg, input_shape, num_classes)
    model.compile(
        # Horovod: average gradients across workers with ring-allreduce (compression,
        # accumulation and loss scaling as configured: see tuning.distributed_optimizer).
        optimizer=tuning.distributed_optimizer(make_optimizer(cfg, plan), cfg),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=cfg.model.from_logits),
        metrics=["accuracy"],
        jit_compile=tuning.jit_compile(cfg, device),
    )
    _build_loss_and_metrics(model, num_classes)
    return model


def _build_loss_and_metrics(model: keras.Model, num_classes: int) -> None:
    """Creates the loss's and the metrics' variables now, as the optimizer's are before the
    resume. Keras would create them inside the first traced step, and a tf.function that creates
    variables is traced twice (once to create them, once more without): with Horovod's
    all-reduce in it, each trace costs seconds of every job's start-up (2.4 s of the quickstart's
    first step here). Built from the shapes `compile` was given for: one output of
    `num_classes` scores and sparse integer labels, as `fit` then sees them."""
    y_pred = tf.zeros((1, num_classes))
    model.compiled_loss.build(y_pred)
    model.compiled_metrics.build(y_pred, tf.zeros((1,), tf.int64))


def make_optimizer(cfg: Config, plan: Derived) -> keras.optimizers.Optimizer:
    """The configured optimizer, its rate following `optimizer.schedule` after the warm-up."""
    o, lr = cfg.optimizer, learning_rate_schedule(cfg, plan)
    if o.name == "sgd":
        return keras.optimizers.SGD(lr, momentum=o.momentum)
    if o.name == "adam":
        return keras.optimizers.Adam(lr)
    if o.name == "adamw":
        return keras.optimizers.AdamW(lr, weight_decay=o.weight_decay)
    return keras.optimizers.RMSprop(lr, momentum=o.momentum)
