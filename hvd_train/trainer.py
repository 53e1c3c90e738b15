"""The training run: Horovod init, data, model, DistributedOptimizer, fit, summary."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import tensorflow as tf

from hvd_train import distributed, perf, tuning
from hvd_train.callbacks import build_callbacks
from hvd_train.checkpoint import export_plain_model
from hvd_train.config import Config, Derived, derive, dump_yaml
from hvd_train.data import Source, load_source, train_dataset
from hvd_train.evaluation import Evaluator
from hvd_train.models import build_model
from hvd_train.schedules import learning_rate_schedule


def train(cfg: Config) -> tuple[tf.keras.Model, dict[str, Any]]:
    """Trains as one worker of the job horovodrun started (or alone); returns model and summary."""
    started = time.perf_counter()
    tuning.before_init(cfg)  # core binding: before Horovod and TensorFlow start threads
    distributed.init(cfg.horovod, cfg.run.dir)
    device = distributed.configure_devices(
        cfg.runtime.intra_op_threads, cfg.runtime.inter_op_threads
    )
    tuning.apply_precision(cfg)  # before the model is built
    # Same seed on every rank: identical initial weights, so the broadcast below is a no-op for
    # built-in models and a guarantee for user factories that draw from other generators.
    tf.keras.utils.set_random_seed(cfg.runtime.seed)
    source = load_source(cfg)
    d = derive(cfg, distributed.size(), source.num_train)
    _prepare_run_dir(cfg)
    _log_plan(cfg, d, source, device)
    tuning.log_knobs(cfg, d)

    model = build_model(cfg, source.input_shape, source.num_classes)
    model.compile(
        # Horovod: average gradients across workers with ring-allreduce (compression,
        # accumulation and loss scaling as configured: see tuning.distributed_optimizer).
        optimizer=tuning.distributed_optimizer(make_optimizer(cfg, d), cfg),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=cfg.model.from_logits),
        metrics=["accuracy"],
        jit_compile=tuning.jit_compile(cfg, device),
    )
    # Horovod: every rank starts from rank 0's weights.
    distributed.broadcast_variables(model.variables)
    evaluator = Evaluator(model, source, d.per_worker_batch, cfg.model.from_logits)
    callbacks = build_callbacks(cfg, d, evaluator, cfg.run.dir)

    summary = _summary_base(cfg, d, device)
    try:
        history = model.fit(
            train_dataset(source, cfg, d, distributed.rank()),
            epochs=cfg.train.epochs,
            steps_per_epoch=d.steps_per_epoch,
            callbacks=callbacks,
            verbose=1 if distributed.is_chief() and cfg.train.verbose else 0,
        )
    except BaseException:
        summary.update(status="failed", wall_time_s=time.perf_counter() - started)
        _write_summary(cfg, summary)
        raise
    summary.update(_results(history.history, d), wall_time_s=time.perf_counter() - started)
    timer = next(c for c in callbacks if isinstance(c, perf.StepTimer))
    summary.update(perf.throughput_summary(timer, cfg))
    perf.log_throughput(summary)
    _finish(cfg, model, summary)
    return model, summary


def make_optimizer(cfg: Config, d: Derived) -> tf.keras.optimizers.Optimizer:
    """The configured optimizer, its rate following the warm-up-and-scale schedule."""
    o, lr = cfg.optimizer, learning_rate_schedule(d)
    if o.name == "sgd":
        return tf.keras.optimizers.SGD(lr, momentum=o.momentum)
    if o.name == "adam":
        return tf.keras.optimizers.Adam(lr)
    if o.name == "adamw":
        return tf.keras.optimizers.AdamW(lr, weight_decay=o.weight_decay)
    return tf.keras.optimizers.RMSprop(lr, momentum=o.momentum)


@distributed.rank_zero_only
def _prepare_run_dir(cfg: Config) -> None:
    os.makedirs(cfg.run.dir, exist_ok=True)
    with open(os.path.join(cfg.run.dir, "config.yaml"), "w") as f:
        f.write(dump_yaml(cfg))


def _log_plan(cfg: Config, d: Derived, source: Source, device: str) -> None:
    used = d.examples_per_epoch
    n = source.num_train
    rest = f"{n - used} unused per epoch" if used <= n else f"{used - n} repeated per epoch"
    warm = f", warm-up {cfg.optimizer.warmup_epochs:g} epochs" if d.warmup_steps else ""
    distributed.log(
        f"{d.world_size} worker(s), {distributed.controller()}, {device} | batch "
        f"{d.per_worker_batch}/worker, {d.global_batch} global | learning rate {d.base_lr:g} -> "
        f"{d.scaled_lr:g} ({cfg.optimizer.lr_scaling}{warm}) | {d.steps_per_epoch} steps/epoch "
        f"over {n} training examples ({rest}) | {len(source.x_val)} validation examples"
    )


def _summary_base(cfg: Config, d: Derived, device: str) -> dict[str, Any]:
    return {
        "status": "running",
        "world_size": d.world_size,
        "controller": distributed.controller(),
        "device": device,
        "per_worker_batch_size": d.per_worker_batch,
        "global_batch_size": d.global_batch,
        "batch_size_mode": cfg.train.batch_size_mode,
        "steps_per_epoch": d.steps_per_epoch,
        "base_learning_rate": d.base_lr,
        "scaled_learning_rate": d.scaled_lr,
        "epochs_completed": 0,
        "versions": distributed.versions(),
    }


def _results(history: dict[str, list[float]], d: Derived) -> dict[str, Any]:
    times = history.get("epoch_time_s", [])
    measured = times[1:] if len(times) > 1 else times  # the first epoch is warm-up (tracing)
    rate = len(measured) * d.steps_per_epoch * d.global_batch / sum(measured) if measured else 0
    final = {k: float(v[-1]) for k, v in history.items() if v}
    return {
        "status": "completed",
        "epochs_completed": len(times),
        "train_examples_per_sec": rate,
        "final_metrics": final,
    }


@distributed.rank_zero_only
def _finish(cfg: Config, model: tf.keras.Model, summary: dict[str, Any]) -> None:
    summary["model_path"] = export_plain_model(model, os.path.join(cfg.run.dir, "model.keras"))
    _write_summary(cfg, summary)
    m = summary["final_metrics"]
    distributed.log(
        f"done in {summary['wall_time_s']:.1f} s: val_accuracy {m.get('val_accuracy', 0):.4f}, "
        f"{summary['train_examples_per_sec']:.0f} examples/s; results in {cfg.run.dir}"
    )


@distributed.rank_zero_only
def _write_summary(cfg: Config, summary: dict[str, Any]) -> None:
    os.makedirs(cfg.run.dir, exist_ok=True)
    path = os.path.join(cfg.run.dir, "summary.json")
    with open(path + ".tmp", "w") as f:
        json.dump(summary, f, indent=2)
    os.replace(path + ".tmp", path)
