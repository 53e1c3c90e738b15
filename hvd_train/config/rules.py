"""Rules that span keys or need the worker count: run once, after the merge (`check`)."""

from __future__ import annotations

import typing

from hvd_train.base.errors import ConfigError
from hvd_train.config.schema import ApplicationName, Config, DataConfig, ModelConfig, _check_spec
from hvd_train.config.typed_yaml import SHORT_REPR


def refuse_keras2_loss_scale_with_accumulation(cfg: Config) -> None:
    """Keras 2 (tf_keras) under mixed_float16 with gradient accumulation is refused: its loss
    scaler would update the scale from each rank's own partial sums between two all-reduces,
    and an overflow on one rank would leave the ranks' scales (and so their updates) different
    for good. Called at load for runtime.keras: tf_keras, and once the model's Keras is known
    (runtime.keras: auto)."""
    if cfg.runtime.mixed_precision == "mixed_float16" and cfg.train.gradient_accumulation_steps > 1:
        raise ConfigError(
            "runtime.mixed_precision: mixed_float16 with train.gradient_accumulation_steps > 1 "
            "is refused on Keras 2 (tf_keras): its loss scale would follow each rank's own "
            "partial gradients and the ranks would drift apart; train with Keras 3 "
            "(runtime.keras: keras), mixed_bfloat16, or gradient_accumulation_steps: 1"
        )


def check(cfg: Config, world_size: int) -> None:
    """Rules that span fields or need the worker count; run once, after the merge."""
    _check_run_dir(cfg.run.dir)
    t = cfg.train
    if t.batch_size_mode == "global" and t.batch_size % world_size:
        raise ConfigError(
            f"train.batch_size: a global batch of {t.batch_size} does not divide evenly by "
            f"{world_size} workers; use a multiple of {world_size}, or batch_size_mode: per_worker"
        )
    if cfg.model.factory:
        _check_spec(cfg.model.factory, "model.factory", "function")
    h = cfg.horovod
    if h.stall_shutdown_s and h.stall_shutdown_s <= h.stall_warning_s:
        raise ConfigError(
            f"horovod.stall_shutdown_s: {h.stall_shutdown_s} must exceed "
            f"horovod.stall_warning_s ({h.stall_warning_s}), or be 0 to never shut down"
        )
    if cfg.runtime.keras == "tf_keras":
        refuse_keras2_loss_scale_with_accumulation(cfg)
    if cfg.runtime.check_replicas == "off" and cfg.runtime.check_replicas_every_steps:
        raise ConfigError(
            "runtime.check_replicas_every_steps: set, but runtime.check_replicas is off; set "
            "runtime.check_replicas: epoch, or remove check_replicas_every_steps"
        )
    e = cfg.elastic
    if e.enabled and any(c.cls.rpartition(":")[2] == "ReduceLROnPlateau" for c in cfg.callbacks):
        raise ConfigError(
            "callbacks: ReduceLROnPlateau's factor is not part of Horovod Elastic's state (a "
            "worker that joins would start at 1); use optimizer.schedule with elastic.enabled"
        )
    if e.enabled and not e.discovery_script:
        raise ConfigError("elastic.discovery_script: required when elastic.enabled is true")
    if e.max_workers is not None and e.max_workers < e.min_workers:
        raise ConfigError(
            f"elastic.max_workers: {e.max_workers} is below elastic.min_workers {e.min_workers}"
        )
    if cfg.data.source == "synthetic" and len(cfg.data.image_size) not in (1, 2):
        raise ConfigError(
            f"data.image_size: expected [height, width] or [features], got {list(cfg.data.image_size)}"
        )
    if cfg.data.source in ("image_folder", "tfrecord"):
        _check_image_source(cfg.data)
    elif cfg.data.read == "stream":
        raise ConfigError(
            f"data.read: stream reads files, but data.source {cfg.data.source} is made in "
            "memory; use data.read: exact, or data.source image_folder or tfrecord"
        )
    _check_schedule(cfg)
    _check_model(cfg.model)
    steps = list(cfg.logging.profile_steps)
    if steps and (len(steps) != 2 or steps[0] > steps[1]):
        raise ConfigError(
            f"logging.profile_steps: expected [first, last] with first <= last (for example "
            f"[20, 30]), or [] to turn the profiler off; got {steps}"
        )


def _check_run_dir(path: str) -> None:
    """What a path can be checked for before it is used (the rest: rundir.claim)."""
    if not path.strip():
        raise ConfigError(
            f"run.dir: expected the folder for the run's results, got {path!r}; set it, for "
            "example run.dir=runs/my_run"
        )
    if "\0" in path:
        raise ConfigError(
            f"run.dir: {path!r} holds a NUL byte, which no file system accepts in a path; "
            "remove it"
        )


def _check_image_source(data: DataConfig) -> None:
    if not data.train_dir:
        raise ConfigError(
            f"data.train_dir: data.source {data.source} needs the folder of training data; "
            "set data.train_dir"
        )
    if len(data.image_size) != 2:
        raise ConfigError(
            f"data.image_size: expected [height, width] for data.source {data.source}, "
            f"got {list(data.image_size)}"
        )
    if data.channels not in (1, 3):
        raise ConfigError(
            f"data.channels: expected 1 (grey) or 3 (RGB) for data.source {data.source}, "
            f"got {data.channels}"
        )
    if data.read == "stream" and data.cache == "memory":
        raise ConfigError(
            "data.read: stream reads each worker's files from disk, but data.cache: memory "
            "decodes everything into memory first; choose one (data.read: exact with the cache)"
        )


APPLICATIONS = typing.get_args(ApplicationName)  # Keras Applications bases


def _check_schedule(cfg: Config) -> None:
    o = cfg.optimizer
    bounds = o.step_boundaries_epochs
    if o.schedule == "step" and not bounds:
        raise ConfigError(
            "optimizer.step_boundaries_epochs: schedule 'step' needs at least one epoch at "
            "which to multiply the rate by step_factor, for example [30, 60]"
        )
    if list(bounds) != sorted(set(bounds)):
        raise ConfigError(
            f"optimizer.step_boundaries_epochs: expected increasing epochs, got {list(bounds)}"
        )
    if o.schedule == "step" and bounds[0] < o.warmup_epochs:
        raise ConfigError(
            f"optimizer.step_boundaries_epochs: epoch {bounds[0]} falls inside the warm-up of "
            f"{o.warmup_epochs:g} epochs; boundaries count from the start and must come after it"
        )
    if o.schedule == "warmup_decay" and not 0 < o.warmup_epochs < cfg.train.epochs:
        raise ConfigError(
            f"optimizer.warmup_epochs: schedule 'warmup_decay' ramps up over warmup_epochs, then "
            f"decays until train.epochs ({cfg.train.epochs}); expected 0 < warmup_epochs < "
            f"{cfg.train.epochs}, got {o.warmup_epochs:g}"
        )


def _check_model(m: ModelConfig) -> None:
    if m.name in APPLICATIONS and not m.factory:
        return
    which = f"model.factory {SHORT_REPR.repr(m.factory)}" if m.factory else f"model.name {m.name!r}"
    for key, set_ in (("weights", m.weights != "none"), ("trainable_base", not m.trainable_base)):
        if set_:
            raise ConfigError(
                f"model.{key}: applies to the Keras Applications bases "
                f"({', '.join(APPLICATIONS)}), not to {which}"
            )
