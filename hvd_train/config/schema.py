"""The config's schema: one frozen dataclass per section, every field typed, defaulted and
commented (each comment is the key's entry in docs/config.md), and a `callbacks:` item's class
check. The order of precedence (defaults, then `--config FILE`, then each `--set a.b=value`)
and the type checks live in the loader (typed_yaml.py); rules across keys in rules.py.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from hvd_train.base.errors import ConfigError
from hvd_train.config.typed_yaml import SHORT_REPR, FrozenMapping


def _positive(default: Any, **meta: Any) -> Any:
    return field(default=default, metadata={"min": 1, **meta})


# Each field's comment is its entry in docs/config.md (`hvd-train config --reference`): the
# comment lines right above a field and the one at the end of its line are what a user reads.


@dataclass(frozen=True)
class RunConfig:
    """Where the run writes its results, one job at a time (docs/faults.md)."""

    # The run's folder: config.yaml, metrics.csv, summary.json, the models, checkpoints and
    # logs. One job at a time: a second job is refused with exit code 2.
    dir: str = "runs/default"
    # A run.dir holding files that are not a run's is refused; true writes the run's files
    # beside them (replacing only the run's own). Never lets two jobs share a run.dir.
    overwrite: bool = False


@dataclass(frozen=True)
class TrainConfig:
    """The training loop: epochs, batches, resume."""

    epochs: int = _positive(10)  # Epochs to train; raise it and run again to continue a run.
    batch_size: int = _positive(32)  # Examples a step: per worker or in all (batch_size_mode).
    # per_worker: each worker takes batch_size examples a step (global = batch_size x workers).
    # global: batch_size is split across the workers (it must divide by the worker count), so
    # the step is the same at any worker count.
    batch_size_mode: Literal["per_worker", "global"] = "per_worker"
    steps_per_epoch: int | None = _positive(None)  # A cap; null: one pass over the data.
    # What rank 0 prints while training: 0 nothing; 1 one line per epoch (loss, accuracy,
    # val_loss, val_accuracy, lr, examples/s, median step, seconds); 2 Keras' live progress bar
    # when its stdout is a terminal, else (always under horovodrun or mpirun) as 1. Old
    # configs' true/false mean 1/0.
    verbose: Literal[0, 1, 2] = field(default=2, metadata={"bool_as_int": True})
    # With verbose 1 or 2: a progress line every this many seconds inside a long epoch (step,
    # rank 0's running loss and accuracy, examples/s); 0: none.
    log_every_s: float = field(default=60.0, metadata={"min": 0.0})
    # auto: continue from the newest valid checkpoint in run.dir if there is one; never: start
    # afresh (the checkpoints and best model an earlier run left are moved, not deleted, to
    # run.dir/checkpoints/earlier-N); or a checkpoint folder (run.dir/checkpoints/ckpt-NNNNNNNN)
    # to continue from.
    resume: str = "auto"
    # Batches each worker runs before one all-reduce and update (Horovod's
    # backward_passes_per_step, averaged): the effective batch is global batch x this, the
    # learning rate is scaled for it as for more workers, and an epoch's steps are rounded down
    # to a multiple of it.
    gradient_accumulation_steps: int = _positive(1)
    # Training steps each call into TensorFlow runs (Keras' steps_per_execution): the callbacks
    # run after each call, not each step, so a GPU waits less on Python between short steps.
    # The training is the same at any value. It must divide an epoch's steps at the run's
    # worker count (checked when the run starts); the checkpoints, agreements and replica
    # checks asked for every N steps come at the first call's end at or after each Nth step.
    steps_per_execution: int = _positive(1)


@dataclass(frozen=True)
class OptimizerConfig:
    """The optimizer (wrapped in Horovod's DistributedOptimizer) and its learning rate: scaled
    for the worker count, warmed up, then scheduled (docs/models.md)."""

    name: Literal["sgd", "adam", "adamw", "rmsprop"] = "sgd"  # Keras' optimizer of that name
    # The rate for one worker's batch; scaled by lr_scaling for the batch an update takes.
    learning_rate: float = field(default=0.01, metadata={"min_exclusive": 0.0})
    momentum: float = field(default=0.9, metadata={"min": 0.0, "max": 1.0})  # sgd's and rmsprop's
    weight_decay: float = field(default=0.0, metadata={"min": 0.0})  # adamw's weight decay
    # linear: x workers; sqrt: x sqrt(workers); none. It applies in per_worker mode, where the
    # global batch grows with the workers; in global mode the batch and the rate do not change
    # with the worker count (gradient accumulation scales them in both).
    lr_scaling: Literal["linear", "sqrt", "none"] = "linear"
    # Linear ramp, per batch, from learning_rate to the scaled rate (Goyal et al. 2017).
    warmup_epochs: float = field(default=0.0, metadata={"min": 0.0})
    # After the warm-up, on the scaled rate, per batch: constant; step: x step_factor at each
    # of step_boundaries_epochs; cosine: to min_lr_fraction at the end; exponential: x
    # decay_rate every decay_epochs; warmup_decay: linear to min_lr_fraction at the end (a ramp
    # up, then decay; needs warmup_epochs > 0).
    schedule: Literal["constant", "step", "cosine", "exponential", "warmup_decay"] = "constant"
    # step: epochs, counted from the start and after the warm-up, at which the rate is
    # multiplied by step_factor.
    step_boundaries_epochs: tuple[int, ...] = ()
    step_factor: float = field(default=0.1, metadata={"min_exclusive": 0.0})  # step: x this each
    # exponential: the multiplier every decay_epochs.
    decay_rate: float = field(default=0.9, metadata={"min_exclusive": 0.0, "max": 1.0})
    # exponential: the epochs over which the rate is multiplied by decay_rate once.
    decay_epochs: float = field(default=1.0, metadata={"min_exclusive": 0.0})
    # The lowest rate, as a fraction of the scaled rate: where cosine and warmup_decay end,
    # and a floor for exponential (Keras' CosineDecay calls it alpha).
    min_lr_fraction: float = field(default=0.0, metadata={"min": 0.0, "max": 1.0})


@dataclass(frozen=True)
class DataConfig:
    """Where the examples come from and how each worker reads them (docs/data.md)."""

    # synthetic: random inputs with learnable labels, made once in memory (speed runs measure
    # the model, not the data). digits: the UCI 8x8 handwritten digits, shipped inside
    # hvd_train (no download). image_folder: one sub-folder of JPEG/PNG files per class; tfrecord:
    # *.tfrecord files from hvd-train convert-tfrecord.
    source: Literal["synthetic", "digits", "image_folder", "tfrecord"] = "synthetic"
    # [height, width] (or [features] for synthetic): synthetic's size; images are resized to it.
    image_size: tuple[int, ...] = (32, 32)
    channels: int = _positive(3)  # synthetic's; images are converted to it (1 grey or 3 RGB)
    num_classes: int = field(default=10, metadata={"min": 2})  # synthetic's classes
    train_examples: int = _positive(4096)  # synthetic's training examples
    val_examples: int = field(default=1024, metadata={"min": 0})  # synthetic's validation examples
    # digits, and images without val_dir: the share of each class held out for validation,
    # chosen by runtime.seed.
    validation_fraction: float = field(default=0.2, metadata={"min": 0.0, "max": 0.9})
    # The examples past the last full global batch of an epoch: drop (a different few each
    # epoch when shuffled), or pad_by_repeat (the last batch is filled from the epoch's first).
    remainder: Literal["drop", "pad_by_repeat"] = "drop"
    shuffle: bool = True  # Reshuffled every epoch from runtime.seed.
    # image_folder: a folder with one sub-folder of images per class; tfrecord: a folder of
    # *.tfrecord files. A local path, or a gs:// or s3:// URL.
    train_dir: str = ""
    # The same for validation; "" holds out validation_fraction of each class, split by seed.
    val_dir: str = ""
    # Class-balanced caps: a sample of each class chosen by runtime.seed; null: every image.
    max_train_per_class: int | None = _positive(None)
    max_val_per_class: int | None = _positive(None)  # The same for validation.
    # memory: decode every image once, before training, and keep it (uint8) on every worker.
    cache: Literal["none", "memory"] = "none"
    # A file that is not a readable JPEG/PNG: error (exit 2, naming every such file) or skip
    # (left out, counted, listed in summary.json's skipped_files).
    on_corrupt: Literal["error", "skip"] = "error"
    # GPU only: batches copied to the GPU ahead (not run on a GPU by this project).
    prefetch_to_device: bool = False
    # Image sources: exact (each example exactly once per epoch, a global shuffle, read by
    # index) or stream (each worker streams its own files through a shuffle buffer: about once
    # per epoch; for network storage).
    read: Literal["exact", "stream"] = "exact"
    shuffle_buffer: int = _positive(10000)  # read: stream: examples in each worker's buffer
    # Rank 0 warns when an epoch's input_wait_fraction passes this. Not for synthetic and
    # digits: already in memory, their wait is the step's own start-up, which no setting removes.
    input_wait_warning: float = field(default=0.1, metadata={"min": 0.0, "max": 1.0})


# The Keras Applications bases, a part of model.name's choices.
ApplicationName = Literal["mobilenet_v2", "resnet50", "efficientnet_b0"]


@dataclass(frozen=True)
class ModelConfig:
    """The model: a built-in one or your own (docs/models.md)."""

    # convnet: a small convnet for small images (convnet7 is its old name, still accepted);
    # mlp: dense layers; mobilenet_v2, resnet50, efficientnet_b0: Keras Applications bases.
    name: Literal["convnet", "mlp", ApplicationName] = field(
        default="convnet", metadata={"aliases": {"convnet7": "convnet"}}
    )
    # "module:function" or "path/to/file.py:function": called with the config, returns an
    # uncompiled Keras model. Wins over name. Imports and runs your code in every worker
    # (docs/security.md).
    factory: str = ""
    from_logits: bool = False  # true when the model's last layer has no softmax
    # convnet: the convolutions' widths (a max-pool after every second).
    filters: tuple[int, ...] = (32, 32, 64, 64)
    dense_units: tuple[int, ...] = (256,)  # hidden dense layers (convnet, mlp, Applications head)
    dropout: float = field(default=0.25, metadata={"min": 0.0, "max": 0.95})  # dropout rate
    # Keras Applications models: the base without its ImageNet classifier, then this head:
    # global avg or max pooling, dense_units, dropout, the classes.
    pooling: Literal["avg", "max"] = "avg"
    # Applications models: "none" (random init) or a local weights file for the base (.h5 or
    # .keras); nothing is ever downloaded. Read on every worker, then rank 0's values are
    # broadcast.
    weights: str = "none"
    trainable_base: bool = True  # Applications models: false freezes the base, trains the head
    # Swap every BatchNormalization for hvd_train's SyncBatchNormalization (statistics over the
    # global batch: for small per-worker batches); the exported model.keras has plain
    # BatchNormalization again.
    sync_batch_norm: bool = False


@dataclass(frozen=True)
class RuntimeConfig:
    """Each worker's threads, seed and numerics (docs/performance.md)."""

    # TensorFlow compute threads per worker; 0: the cores this process may use / the workers
    # on its host (at least 1), on a GPU as on CPU.
    intra_op_threads: int = field(default=0, metadata={"min": 0})
    # TensorFlow's inter-op threads per worker; 0: on CPU 2, or 1 for a worker of one core
    # (a second would only time-slice it); on a GPU the same share as intra_op_threads.
    inter_op_threads: int = field(default=0, metadata={"min": 0})
    seed: int = 42  # Data order, validation split, augmentation and initial weights.
    # XLA: the whole step on GPU; on CPU, auto-clustering of the ops around the all-reduce.
    jit_compile: bool = False
    # Keras mixed precision: compute in 16 bits, variables and the output layer in float32;
    # mixed_float16 adds dynamic loss scaling. bfloat16 is fast only on CPUs/GPUs that have it.
    mixed_precision: Literal["none", "mixed_float16", "mixed_bfloat16"] = "none"
    # Each worker binds itself (and Horovod's background thread) to its own share of the
    # cores, by local rank, before TensorFlow starts its threads: on a GPU host the cores
    # nearest its GPU (nvidia-smi topo -m), else a block of the host's. null: bound on a host
    # without a GPU where the launcher started several workers, else unbound.
    bind_cores: bool | None = None
    # Which Keras builds and trains the model: auto (a factory's model with the Keras it was
    # built with; the built-in models with Keras 3 on TensorFlow 2.16+, Keras 2 on 2.15);
    # keras (Keras 3, `import keras`); tf_keras (Keras 2: the tf_keras package on 2.16+,
    # tf.keras on 2.15; a factory's tf.keras is then Keras 2 too). docs/models.md.
    keras: Literal["auto", "keras", "tf_keras"] = "auto"
    # Every rank compares a fingerprint of every replicated variable (weights, optimizer state,
    # loss scale), carried in the all-gather an epoch's end does anyway: epoch (at each epoch's
    # end and before each checkpoint), or off (YAML's false). A mismatch ends the run with exit
    # code 3 (docs/faults.md).
    check_replicas: Literal["epoch", "off"] = field(
        default="epoch", metadata={"bool_as": {False: "off", True: "epoch"}}
    )
    # Also every N steps (null: only where check_replicas says).
    check_replicas_every_steps: int | None = _positive(None)
    # Where each worker trains. auto: on a GPU where nvidia-smi lists one, and then TensorFlow
    # must see it: if it cannot (a CPU wheel, CUDA libraries that do not load) the run fails
    # in one line saying why, instead of training on the CPU; gpu: the same, also without
    # nvidia-smi; cpu: the GPUs hidden from TensorFlow, to train on the CPU on purpose (the
    # opening line says so).
    device: Literal["auto", "gpu", "cpu"] = "auto"


@dataclass(frozen=True)
class HorovodConfig:
    """Horovod's runtime knobs, applied by the trainer before hvd.init() (and passed as
    horovodrun flags by the launchers). null keeps Horovod's own default."""

    # What the launchers start (launch/*.sh, hvd-train launch, hvd-train sweep): auto, gloo or
    # mpi. auto: Open MPI for a job on this host alone without a GPU, where mpirun is found
    # (there its all-reduce costs less CPU than Gloo's: docs/performance.md, "One CPU host"),
    # else Gloo. Horovod Elastic always uses Gloo.
    controller: Literal["auto", "gloo", "mpi"] = "auto"
    # Tensor fusion buffer in MB (Horovod's default: 128); horovodrun --fusion-threshold-mb.
    fusion_threshold_mb: int | None = field(default=None, metadata={"min": 0})
    # Horovod's background cycle while a tensor waits (idle, its thread sleeps until one is
    # queued); null: Horovod's 1 ms, or 10 ms for a job of one worker that is not elastic;
    # horovodrun --cycle-time-ms.
    cycle_time_ms: float | None = field(default=None, metadata={"min_exclusive": 0.0})
    # <run.dir>/timeline.json (Chrome trace), written by rank 0; it costs rank 0 CPU: keep it
    # off to measure speed.
    timeline: bool = False
    autotune: bool = False  # Horovod's Bayesian tuning of fusion and cycle time
    # A collective that some ranks reached and others did not for this long is a hang (a rank
    # stuck or its graph different): Horovod warns, then shuts down so the job ends with an error.
    stall_warning_s: int = _positive(60)
    # Must exceed stall_warning_s; 0: never shut down.
    stall_shutdown_s: int = field(default=300, metadata={"min": 0})
    compression: Literal["none", "fp16"] = (
        "none"  # fp16: gradients sent as float16 (half the bytes)
    )


@dataclass(frozen=True)
class LaunchConfig:
    """What the launchers start on a machine without a GPU (docs/launching.md)."""

    cpu_workers: int = _positive(2)  # workers per node the launch scripts start without a GPU


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoints for exact resume: weights, optimizer state, epoch and step (rank 0 writes;
    docs/faults.md)."""

    # A checkpoint every N epochs, and always after the last; 0: only at stops and the end.
    every_epochs: int = field(default=1, metadata={"min": 0})
    every_steps: int | None = _positive(None)  # also every N global steps, mid-epoch
    keep_last: int = _positive(3)  # newest checkpoints kept; the best is kept besides
    # The epoch metric that picks the best checkpoint (and best.keras).
    monitor: Literal["val_loss", "val_accuracy", "loss", "accuracy"] = "val_loss"
    mode: Literal["auto", "min", "max"] = "auto"  # auto: max for accuracy, min for loss
    # How often (in steps) the workers agree on stopping (SIGTERM/SIGINT, a non-finite loss):
    # one tiny synchronous all-reduce each time, and before every checkpoint. 0: about once a
    # second (the interval agreed from the workers' step times) and at each epoch's first step.
    # Agreeing at every step costs throughput (docs/benchmarks.md, "Findings").
    check_every_steps: int = field(default=0, metadata={"min": 0})


@dataclass(frozen=True)
class ElasticConfig:
    """Horovod Elastic: the job goes on when workers leave or join (start it with hvd-train
    launch; docs/faults.md)."""

    enabled: bool = False  # true: the job runs under Horovod Elastic
    min_workers: int = _positive(1)  # the fewest workers the job goes on with
    max_workers: int | None = _positive(None)  # null: as many as the discovery script offers
    # The path of one executable that prints `host:slots` lines; required when enabled. No
    # arguments or shell syntax: horovodrun runs it through a shell every second, so `hvd-train
    # launch` checks it on the launching host and passes it as one quoted word. With
    # model.factory, one of the two places where a config runs your code.
    discovery_script: str = field(default="", metadata={"executable": True})
    # In-memory commit of the state every N steps, besides every epoch's end: what the workers
    # roll back to when one fails.
    commit_every_steps: int = _positive(50)


@dataclass(frozen=True)
class LoggingConfig:
    """What rank 0 writes besides metrics.csv and summary.json (docs/performance.md), and what
    it logs to MLflow and to Weights & Biases (docs/tracking.md)."""

    # <run.dir>/tensorboard, rank 0 only: Keras' epoch_loss, epoch_accuracy and
    # epoch_learning_rate (and validation/), plus throughput/examples_per_sec,
    # throughput/examples_per_sec_per_worker, throughput/step_time_ms_median,
    # throughput/epoch_time_s, throughput/epoch_examples and input/wait_fraction.
    tensorboard: bool = True
    # [first, last] training step (1-based, counted over the run) to trace with TensorFlow's
    # profiler on rank 0, into <run.dir>/tensorboard/plugins/profile; [] is off.
    profile_steps: tuple[int, ...] = ()
    # Rank 0 logs the run to MLflow (pip install 'hvd_train[mlflow]'): parameters, a point per
    # epoch, the final metrics, summary.json, config.yaml and the model; one MLflow run per
    # run.dir, which every later job continues (but train.resume: never; docs/tracking.md).
    mlflow: bool = False
    # The tracking server (http://host:5000) or store; "": the MLFLOW_TRACKING_URI variable,
    # else MLflow's local default (sqlite:///mlflow.db in the working directory). A value here
    # wins over the variable.
    mlflow_tracking_uri: str = ""
    # The experiment (created if missing); "": the MLFLOW_EXPERIMENT_NAME variable, else
    # MLflow's Default. A value here wins over the variable.
    mlflow_experiment_name: str = ""
    # Upload the exported model (model.keras, or its SavedModel folder) as an artifact of a
    # completed run; false: summary.json and config.yaml only.
    mlflow_log_model: bool = True
    # Rank 0 logs the run to Weights & Biases (pip install 'hvd_train[wandb]'): the resolved
    # config, a point per epoch, summary.json's status and figures at the end, and the model;
    # one W&B run per run.dir, which every later job continues (but train.resume: never;
    # docs/tracking.md).
    wandb: bool = False
    # The W&B project; "": the WANDB_PROJECT variable, else W&B's own default. A value here
    # wins over the variable.
    wandb_project: str = ""
    # The W&B entity (a user or a team); "": the WANDB_ENTITY variable, else the API key's
    # default entity. A value here wins over the variable.
    wandb_entity: str = ""
    # online: sent to the W&B server while training; offline: written under WANDB_DIR only,
    # no network (`wandb sync` sends it later). "": the WANDB_MODE variable, else online.
    wandb_mode: Literal["", "online", "offline"] = ""
    # Log the exported model (model.keras, or its SavedModel folder) as an artifact of a
    # completed run; false: no artifact.
    wandb_log_model: bool = True


@dataclass(frozen=True)
class AugmentConfig:
    """Random augmentation of training batches (images in [0, 1]) on every worker; validation
    data is never augmented (docs/models.md)."""

    # horizontal, vertical or horizontal_and_vertical; none: off.
    flip: Literal["none", "horizontal", "vertical", "horizontal_and_vertical"] = "none"
    # The chance that each image is flipped, per direction.
    flip_probability: float = field(default=0.5, metadata={"min": 0.0, "max": 1.0})
    # Pad each side with this many zero pixels, then crop back to the size at a random offset.
    random_crop: int = field(default=0, metadata={"min": 0})
    # The largest brightness change: each image gets a delta drawn from +- this; 0: off.
    brightness: float = field(default=0.0, metadata={"min": 0.0, "max": 1.0})
    # Each image's contrast is scaled by a factor drawn from 1 +- this; 0: off.
    contrast: float = field(default=0.0, metadata={"min": 0.0, "max": 1.0})


# `callbacks[i].class` as docs/config.schema.json checks it for editors: `_check_spec`'s rule
# (module:Name, or a bare Name), names in ASCII. The loader's check below is the word.
CALLBACK_CLASS_PATTERN = r"^(?:.+:)?[A-Za-z_][A-Za-z0-9_]*$"
# Keras callbacks that cannot work here, and what to use instead (refused at load and, for
# subclasses, when built). ReduceLROnPlateau is replaced, not refused: see
# train/callbacks/user_callbacks.py.
REFUSED_CALLBACKS = {
    "BackupAndRestore": (
        "hvd_train already checkpoints and resumes exactly (checkpoint.*, train.resume); "
        "remove it"
    ),
}


def _callback_class_problem(cls: str) -> str | None:
    """What is wrong with a `callbacks[i].class` (the loader adds the file and the key)."""
    problem = _spec_problem(cls, "Name", bare_ok=True)
    name = cls.rpartition(":")[2]
    if problem is None and name in REFUSED_CALLBACKS:
        problem = f"{name}: {REFUSED_CALLBACKS[name]}"
    return problem


@dataclass(frozen=True)
class CallbackConfig:
    """One item of `callbacks:`: a Keras callback the trainer builds at training start.

    `cls` is the YAML key `class`: "module:Name", or a bare name from tf.keras.callbacks.
    `args` are its constructor's keyword arguments (a FrozenMapping: the tree is frozen).
    `ranks`: all or chief; None picks by class (see train/callbacks/user_callbacks.py).
    """

    # "module:Name" or "path/to/file.py:Name", or a bare tf.keras.callbacks name such as
    # EarlyStopping.
    cls: str = field(
        metadata={
            "key": "class",
            "pattern": CALLBACK_CLASS_PATTERN,
            "check": _callback_class_problem,
            "expected": "'module:Name'",
            "required": "the callback, as 'module:Name' or a tf.keras.callbacks name such as "
            "EarlyStopping",
        }
    )
    args: Mapping[str, Any] = field(  # the constructor's keyword arguments (a mapping)
        default=FrozenMapping(),
        metadata={"expected": "a mapping of the constructor's keyword arguments"},
    )
    # all, or chief (rank 0 only); null: chief for Keras' file writers (ModelCheckpoint,
    # CSVLogger, TensorBoard, RemoteMonitor), all for the rest.
    ranks: Literal["all", "chief"] | None = field(
        default=None, metadata={"expected": "'all' or 'chief' (rank 0 only)"}
    )

    def kwargs(self) -> dict[str, Any]:
        """`args` as a fresh dict, so a callback that changes its arguments changes no config."""
        return copy.deepcopy(dict(self.args))

    def as_dict(self) -> dict[str, Any]:
        """The item as it is written in YAML."""
        ranks = {"ranks": self.ranks} if self.ranks else {}
        return {"class": self.cls, "args": self.kwargs(), **ranks}


@dataclass(frozen=True)
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    horovod: HorovodConfig = field(default_factory=HorovodConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    # Your own Keras callbacks, in order: [{class: "module:Name", args: {...}, ranks: ...}].
    # Imports and runs your code in every worker (docs/security.md; docs/models.md).
    callbacks: tuple[CallbackConfig, ...] = field(
        default=(),
        metadata={"expected": "a list of {class: 'module:Name', args: {...}} mappings"},
    )


def _check_spec(spec: str, where: str, what: str, bare_ok: bool = False) -> None:
    """`module:Name` (or, with `bare_ok`, a bare Name): what `model.factory` and `callbacks`
    import. The module may be `path/to/file.py`."""
    problem = _spec_problem(spec, what, bare_ok)
    if problem is not None:
        raise ConfigError(f"{where}: {problem}")


def _spec_problem(spec: str, what: str, bare_ok: bool) -> str | None:
    module, sep, name = spec.rpartition(":")
    if (sep and module and name.isidentifier()) or (bare_ok and not sep and name.isidentifier()):
        return None
    return f"expected 'module:{what}', got {SHORT_REPR.repr(spec)}"
