"""summary.json: every field it may hold, how it is read and written, and what a rerun makes
of it.

`Summary` declares each field, with its type and what it means; scripts outside the project
read them, so a name or a meaning never changes (docs/faults.md, "What a run writes"). Rank 0
writes the record through `RunRecord` (run_record.py); its keeper (keeper.py), rank 0 in its
start-up (run_record.end_before_start) and `hvd-train launch` end it when rank 0 could not.
`problems` checks a record against the declaration (the tests run it on real runs).

Standard library only.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypedDict

from hvd_train.base import startup
from hvd_train.base.files import atomic_write

ENDINGS = ("completed", "failed", "interrupted")
# What an ending says of its cause: replaced, not mixed, when a later job ends the record.
EARLIER_ENDING = ("error", "error_type", "stopped_by", "stop_detail", "stop_signal",
                  "failed_rank", "failure", "recorded_by")  # fmt: skip


class Versions(TypedDict):
    """The stack the run trained on (runtime/distributed.py versions)."""

    python: str
    tensorflow: str
    keras: str  # "tf_keras 2.21.0", or "tf.keras 2.15.0"
    horovod: str


class Position(TypedDict):
    """A place in training, as the log shows it."""

    epoch: int  # 1-based
    step: int  # steps of that epoch already done (0: not begun)


class StoppedEarly(TypedDict):
    epoch: int  # 1-based: the last epoch trained
    by: str  # the class name of the user's callback that stopped the run


class Elastic(TypedDict):
    """Horovod Elastic's report (train/run/elastic.py)."""

    resets: int  # how often the workers' membership changed
    world_sizes: list[int]  # the worker count of each membership, in order


class LaunchFailure(TypedDict, total=False):
    """One failed attempt of `hvd-train launch` (launcher/launch.py first_failure)."""

    rank: int | None  # the rank that failed first; None when horovodrun named none
    rank_exit_code: int | None  # its exit code (128 + N: killed by signal N)
    error: str | None  # its own one-line failure, when it printed one
    attempt: int  # 1-based
    exit_code: int  # horovodrun's (or mpirun's)
    time: float  # when the attempt ended (time.time())


class Launch(TypedDict):
    """What `hvd-train launch` adds at the end of its job."""

    restarts: int
    failures: list[LaunchFailure]


class EarlierJob(TypedDict, total=False):
    """What `earlier_jobs` keeps of a job that trained the run before (`earlier_job`)."""

    started_at: float
    status: str
    world_size: int
    controller: str
    global_batch_size: int
    trained_from: Position
    epochs_completed: int
    stopped_at: Position
    train_examples_per_sec: float
    wall_time_s: float


class MetricPoint(TypedDict):
    """One metric point, as MLflow keeps it."""

    key: str
    value: float
    step: int  # the epoch, 1-based
    timestamp: int  # milliseconds since 1970, when rank 0 had it


class Mlflow(TypedDict, total=False):
    """The run's MLflow run, with `logging.mlflow: true` (record/mlflow_run.py)."""

    run_id: str  # one per run.dir: every job that continues the run continues it
    experiment_id: str
    tracking_uri: str  # where it is kept (without a password a URI may hold)
    parent_run_id: str  # hvd-train sweep's run of the whole grid
    lost: str  # the tracking server stopped answering in this job: when and why, once
    unsent_metrics: list[MetricPoint]  # the points not sent; a job that continues sends them


class Wandb(TypedDict, total=False):
    """The run's Weights & Biases run, with `logging.wandb: true` (record/wandb_run.py)."""

    run_id: str  # one per run.dir: every job that continues the run continues it
    project: str
    entity: str  # "" offline, where W&B knows none
    mode: Literal["online", "offline"]
    dir: str  # this job's W&B folder (under WANDB_DIR), which `wandb sync` sends
    lost: str  # W&B failed in this job: when and why, once


class Summary(TypedDict, total=False):
    """summary.json: every field any writer puts in it. A record holds a subset: the opening
    fields from the start, the results at the end, the cause for an ending but `completed`."""

    # The run as rank 0 started it (train/run/trainer.py).
    status: Literal["running", "completed", "interrupted", "failed"]
    started_at: float  # time.time() when this job's rank 0 started (or its process was made)
    world_size: int  # workers (the last membership's, under Horovod Elastic)
    controller: Literal["gloo", "mpi", "none"]  # none: one process without a launcher
    device: Literal["gpu", "cpu"]
    per_worker_batch_size: int
    global_batch_size: int
    steps_per_epoch: int
    base_learning_rate: float  # optimizer.learning_rate as configured
    scaled_learning_rate: float  # after optimizer.lr_scaling for the worker count
    batch_size_mode: Literal["per_worker", "global"]  # train.batch_size_mode
    epochs: int  # train.epochs: the epochs asked for
    epochs_completed: int
    resumed_from: str | None  # the checkpoint folder this job resumed from
    last_checkpoint: str | None  # the newest checkpoint folder, from which a rerun resumes
    model_path: str | None  # model.keras (or the SavedModel folder), once written
    versions: Versions
    # What each step all-reduces, for `hvd-train plan` (set once the model is built).
    trainable_parameters: int
    gradient_dtype: Literal["float32", "float16"]  # float16 with horovod.compression: fp16
    gradient_bytes: int  # trainable_parameters x 4 (float32) or x 2 (float16)
    trained_from: Position  # where this job began training
    earlier_jobs: list[EarlierJob]  # the jobs that trained this run before, oldest first
    elastic: Elastic  # under Horovod Elastic
    mlflow: Mlflow  # with logging.mlflow: true
    wandb: Wandb  # with logging.wandb: true
    # The results (train/run/trainer.py, data/diagnostics.py, train/callbacks/perf.py).
    stopped_at: Position | None  # where a stop left training: where the next run continues
    stopped_early: StoppedEarly  # a user's callback ended the run (still `completed`)
    train_examples_per_sec: float  # all workers, warm-up left out (train/callbacks/perf.py)
    final_metrics: dict[str, float]  # the last epoch's row of metrics.csv, by column
    input_wait_fraction: float  # the training time spent waiting for input, after epoch 1
    skipped_files: list[str]  # corrupt files left out (data.on_corrupt: skip)
    train_examples_per_sec_per_worker: float
    step_time_ms: float | None  # the median step, warm-up left out; None: no step measured
    warmup_excluded: str  # what the figures leave out: "first epoch", "first N steps", ...
    accumulation_steps: int  # train.accumulation_steps
    effective_batch_size: int  # global batch x accumulation steps
    allreduce_time_share: float | None  # from the timeline (horovod.timeline: true), rank 0
    negotiation_time_share: float | None  # likewise; None without a timeline
    startup_s: dict[str, float]  # rank 0's seconds from its process's start to each phase's end
    # The network NCCL's all-reduce took between hosts, from its log (base/nccl_log.py): "IB"
    # (InfiniBand or RoCE), "Socket" (TCP), a plugin's name; None: no NCCL (a CPU run), or
    # the user's own NCCL_DEBUG.
    nccl_network: str | None
    wall_time_s: float  # this job's, from rank 0's start to its end
    best_model_path: str | None  # best.keras (or its SavedModel folder), once written
    # An ending other than `completed`: its cause.
    stopped_by: str  # the stop's signal: SIGTERM, SIGINT or SIGUSR1
    stop_detail: str  # why a stop saved nothing (it came before any step, or outran its grace)
    stop_signal: str  # the keeper's: the signal rank 0 was stopping for when it died
    error: str  # the first cause, in one line
    error_type: str  # the class of rank 0's error (base/errors.py): what launch restarts on
    failed_rank: int | None  # the rank that failed first, when known
    failure: str  # hvd-train launch's description of the first failure
    recorded_by: Literal["keeper", "start-up", "launcher"]  # who wrote an ending not rank 0's
    launch: Launch  # hvd-train launch's attempts


def write_summary(path: str, summary: Summary) -> None:
    """Writes `summary` to `path` atomically (base/files.py: a reader sees the old or the new).

    Raises:
        OSError: it could not be written; `path` is as it was.
    """
    with atomic_write(path) as f:
        json.dump(summary, f, indent=2)


def read_summary(path: str) -> Summary:
    """The record at `path`; {} when there is none or it cannot be read (not JSON, not an
    object)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def problems(summary: Mapping[str, Any]) -> list[str]:
    """What in `summary` is not as `Summary` declares it, one line each: a field that is not
    declared (`launch.tries: not a declared field`) or a value of another type
    (`world_size: expected int, got '2'`); [] when all is declared."""
    return _problems(summary, Summary, "")


def _problems(value: Any, kind: Any, where: str) -> list[str]:
    if typing.is_typeddict(kind):
        if not isinstance(value, dict):
            return [f"{where or 'summary'}: expected an object, got {value!r}"]
        hints = typing.get_type_hints(kind)
        found = []
        for key, item in value.items():
            at = f"{where}.{key}" if where else key
            if key not in hints:
                found.append(f"{at}: not a declared field")
            else:
                found += _problems(item, hints[key], at)
        return found
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        fits = any(not _problems(value, a, where) for a in args)
    elif origin is Literal:
        return [] if value in args else [f"{where}: expected one of {args}, got {value!r}"]
    elif origin is list:
        if not isinstance(value, list):
            return [f"{where}: expected a list, got {value!r}"]
        return [p for i, v in enumerate(value) for p in _problems(v, args[0], f"{where}[{i}]")]
    elif origin is dict:
        if not isinstance(value, dict):
            return [f"{where}: expected an object, got {value!r}"]
        return [p for k, v in value.items() for p in _problems(v, args[1], f"{where}.{k}")]
    else:
        fits = _is(value, kind)
    return [] if fits else [f"{where}: expected {_name(kind)}, got {value!r}"]


def _is(value: Any, kind: Any) -> bool:
    if kind is Any:
        return True
    if kind is None or kind is type(None):
        return value is None
    if isinstance(value, bool):  # JSON's true is not a number
        return kind is bool
    if kind is float:  # JSON has one number type: 2 is a float too
        return isinstance(value, (int, float))
    return isinstance(value, kind)


def _name(kind: Any) -> str:
    """`int`, `Position | None`: a type as the declaration spells it."""
    if typing.get_args(kind):
        return " | ".join(_name(a) for a in typing.get_args(kind))
    return "None" if kind is type(None) else getattr(kind, "__name__", str(kind))


def nothing_to_train(summary: Mapping[str, Any], epochs: int, run_dir: str) -> str | None:
    """Why a rerun with `train.epochs: epochs` of the run whose record is `summary` has nothing
    to train (one line), or None when it has.

    Nothing to train: the run completed with `epochs` or more epochs done, or its users'
    callbacks ended it early and `epochs` is no more than it was asked for. A rerun then
    changes nothing in run.dir, whatever its worker count. A run that failed or was
    interrupted past its last step (writing model.keras, say) has its end still to do: a rerun
    resumes and does it.
    """
    done = summary.get("epochs_completed")
    if summary.get("status") != "completed" or not isinstance(done, int):
        return None
    asked = summary.get("epochs", done)
    early = summary.get("stopped_early")
    if early and epochs <= asked:
        return (
            f"{run_dir} already completed: its callbacks stopped it early at epoch "
            f"{early.get('epoch')} of {asked} ({early.get('by')}); nothing to train (raise "
            f"train.epochs above {asked} to continue)"
        )
    if epochs > done:
        return None
    more = (
        "raise train.epochs to continue"
        if epochs == done
        else f"train.epochs is {epochs}: raise it above {done} to continue"
    )
    return f"{run_dir} already completed {done} of {asked} epochs; nothing to train ({more})"


def earlier_job(summary: Mapping[str, Any]) -> EarlierJob:
    """What summary.json's `earlier_jobs` keeps of a job that trained the run before."""
    keys = ("started_at", "status", "world_size", "controller", "global_batch_size",
            "trained_from", "epochs_completed", "stopped_at", "train_examples_per_sec",
            "wall_time_s")  # fmt: skip
    return _present(summary, keys)


def run_so_far(summary: Mapping[str, Any]) -> Summary:
    """What the record of a job that continues a run says until the job's own start is known
    (and after, when it fails first): the epochs, checkpoint, metrics and models the earlier
    jobs left in run.dir, which a job that fails before it resumes has not touched."""
    keys = ("epochs_completed", "last_checkpoint", "final_metrics", "model_path",
            "best_model_path")  # fmt: skip
    return _present(summary, keys)


def _present(summary: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    """The fields of `keys` that `summary` holds, with a value (an EarlierJob or a Summary,
    as the keys make it)."""
    return {k: summary[k] for k in keys if summary.get(k) is not None}


def early_summary(world_size: int, epochs: int, recorded_by: str) -> Summary:
    """summary.json of a job that ended before rank 0 started its record (in its first
    seconds), written by `recorded_by`: "start-up" (rank 0 itself) or "launcher"."""
    return {
        "status": "failed",
        "started_at": startup.process_created(),
        "world_size": world_size,
        "epochs": epochs,
        "epochs_completed": 0,
        "resumed_from": None,
        "last_checkpoint": None,
        "recorded_by": recorded_by,
    }
