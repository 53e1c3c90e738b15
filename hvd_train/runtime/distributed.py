"""Everything that touches Horovod's global state: init, ranks, devices, collectives, logging.

Nothing else in hvd_train calls `hvd.rank()`: code asks `is_chief()` or uses `rank_zero_only`.
Collectives (`allreduce_sum`, `broadcast_object`) must be called on every rank.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import horovod
import horovod.tensorflow as hvd_tf
import numpy as np
import tensorflow as tf

from hvd_train.base import gpus as host_gpus
from hvd_train.base import logs
from hvd_train.base.errors import UserError
from hvd_train.config import HorovodConfig
from hvd_train.runtime import cores
from hvd_train.runtime.keras import binding

F = TypeVar("F", bound=Callable[..., Any])


def _autograph_leaves_horovod_and_hvd_train_alone() -> None:
    """Adds Horovod and hvd_train to the libraries autograph does not convert (TensorFlow,
    Keras, NumPy are).

    Keras traces the train step with autograph, which rewrites every function it calls that is
    not on that list: Horovod's all-reduce, broadcast and name helpers, a few dozen functions,
    converted again in every process's first step (docs/benchmarks.md, "Start-up").
    Horovod's graph code is written for TensorFlow 1's graph mode: its conditions are on Python
    values, so converting it changes nothing but the time. tf.data converts the functions it
    maps too: hvd_train's dataset functions (indices, decoding, augmentation, the input-wait
    stamp), each converted again at every worker's start-up (docs/benchmarks.md, "Start-up").
    They are written as graph code as well (`tf.cond`, `tf.where`; their
    Python conditions are on the config and on static shapes), as are the pieces Keras 2's
    converted step calls (the learning-rate schedule, sync batch norm, the optimizer's
    wrapper); hvd_train's own tf.functions say `autograph=False`. A user's model factory and
    callbacks are converted as before. A private TensorFlow module: where it is missing (a
    future release), autograph converts both as before.
    """
    try:
        from tensorflow.python.autograph.core import config as autograph_config
    except ImportError:
        return
    rules = getattr(autograph_config, "CONVERSION_RULES", None)
    rule = getattr(autograph_config, "DoNotConvert", None)
    if isinstance(rules, tuple) and rule is not None:
        autograph_config.CONVERSION_RULES = (rule("horovod"), rule("hvd_train"), *rules)


_autograph_leaves_horovod_and_hvd_train_alone()


def init(knobs: HorovodConfig, timeline_path: str) -> None:
    """Starts Horovod (Gloo or MPI, whichever horovodrun or mpirun chose) with the config's knobs.

    Horovod reads its tuning from the environment at init; a value the launcher already set
    (a horovodrun flag) wins over the config. `timeline_path`: where Horovod writes its
    timeline with `horovod.timeline: true` (run.dir's timeline.json: record/layout.py).
    """
    env = {
        "HOROVOD_FUSION_THRESHOLD": knobs.fusion_threshold_mb and knobs.fusion_threshold_mb << 20,
        "HOROVOD_CYCLE_TIME": cycle_time_ms(knobs),
        "HOROVOD_AUTOTUNE": 1 if knobs.autotune else None,
        "HOROVOD_TIMELINE": os.path.abspath(timeline_path) if knobs.timeline else None,
        "HOROVOD_STALL_CHECK_TIME_SECONDS": knobs.stall_warning_s,
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": knobs.stall_shutdown_s or None,
    }
    if knobs.fusion_threshold_mb == 0:
        env["HOROVOD_FUSION_THRESHOLD"] = 0  # 0 turns fusion off
    for key, value in env.items():
        if value is not None:
            os.environ.setdefault(key, str(value))
    if knobs.timeline:  # Horovod opens the file at init, on rank 0
        os.makedirs(os.path.dirname(os.path.abspath(timeline_path)), exist_ok=True)
    if "OMPI_COMM_WORLD_SIZE" in os.environ and not tf.config.list_physical_devices("GPU"):
        # Open MPI busy-polls in blocking calls, and Horovod's background thread makes one every
        # cycle, on the core its worker computes on: let it yield (see docs/benchmarks.md).
        os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
        one_host = (
            os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") == os.environ["OMPI_COMM_WORLD_SIZE"]
        )
        # Unless somebody (mpirun --mca, the environment) chose the algorithm already.
        if one_host and not any(key in os.environ for key in ONE_HOST_RING):
            os.environ.update(ONE_HOST_RING)
    hvd_tf.init()
    if cores.bound() and _launcher_local_rank() != (hvd_tf.local_rank(), hvd_tf.local_size()):
        raise UserError(
            "runtime.bind_cores: the launcher did not give this worker its local rank before "
            "start (HOROVOD_LOCAL_RANK or OMPI_COMM_WORLD_LOCAL_RANK); launch with horovodrun "
            "or mpirun, or set runtime.bind_cores: false"
        )


# Open MPI's ring all-reduce for a job on one CPU host, read at MPI_Init: it costs less CPU than
# Open MPI's own choice for a model's gradients between 2 ranks, and on a CPU host that time is
# taken from the workers' compute (docs/benchmarks.md, "Throughput against peers, and 2-worker
# scaling on 2 cores").
ONE_HOST_RING = {
    "OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
    "OMPI_MCA_coll_tuned_allreduce_algorithm": "4",
}


# A lone worker's Horovod cycle: its background thread wakes every cycle even with no peer to
# agree with, which at Horovod's default cycle takes a share of a core for nothing
# (docs/benchmarks.md, "Findings").
ALONE_CYCLE_TIME_MS = 10.0


def cycle_time_ms(knobs: HorovodConfig) -> float | None:
    """`horovod.cycle_time_ms`; unset, 10 ms for a job of one worker (not elastic, which may
    grow), else Horovod's own default. At one worker only the epoch-end collectives wait for
    a cycle: gradients skip the all-reduce."""
    if knobs.cycle_time_ms is not None:
        return knobs.cycle_time_ms
    alone = logs.launcher_size() == 1 and not os.environ.get("HOROVOD_ELASTIC")
    return ALONE_CYCLE_TIME_MS if alone else None


def _launcher_local_rank() -> tuple[int, int]:
    """(local rank, local size) from the launcher's environment, readable before hvd.init()."""
    return host_gpus.launcher_local_rank()


def rank() -> int:
    return hvd_tf.rank()


def size() -> int:
    return hvd_tf.size()


def local_rank() -> int:
    return hvd_tf.local_rank()


def local_size() -> int:
    return hvd_tf.local_size()


def hosts() -> int:
    """The hosts the job spans (Horovod's cross size: the workers of one local rank)."""
    return hvd_tf.cross_size()


def is_chief() -> bool:
    """True on the one worker that writes files and prints progress (rank 0)."""
    return hvd_tf.rank() == 0


# Variables an MPI launcher (Open MPI's mpirun, horovodrun --mpi; MPICH/PMIx) sets in each worker.
_MPI_LAUNCHER_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")


def controller() -> str:
    """'gloo' or 'mpi': the controller this job runs on; 'none' for one process started
    without horovodrun or mpirun (Horovod then starts MPI for itself alone: no job to control).
    """
    if hvd_tf.gloo_enabled():
        return "gloo"
    return "mpi" if any(k in os.environ for k in _MPI_LAUNCHER_ENV) else "none"


def shared_memory_allreduce() -> bool:
    """Whether Horovod sums this job's CPU tensors through shared memory (every rank on this
    host: patches/horovod-0.28.1, 0013) rather than through its controller's transport."""
    enabled = getattr(hvd_tf, "shm_allreduce_enabled", None)  # a Horovod without the series
    return bool(enabled and enabled())


def rank_zero_only(fn: F) -> F:
    """Runs `fn` on rank 0 only; elsewhere it returns None. Never wrap a collective in it."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs) if is_chief() else None

    return wrapper  # type: ignore[return-value]


def log(message: str, *, all_ranks: bool = False) -> None:
    """Prints on rank 0; with `all_ranks=True` every rank prints, prefixed `[rank N]`.

    Rank 0's lines also go to its log file (logs.py); other ranks' stderr is their log file.
    A log nobody reads any more (the launcher that held the pipe died) does not stop the run:
    its stop or its failure still has to be recorded.
    """
    try:
        if all_ranks:
            logs.print_line(f"[rank {rank()}] {message}", sys.stderr)
        elif is_chief():
            logs.print_line(f"[hvd_train] {message}")
            logs.copy(f"[hvd_train] {message}")
    except OSError:  # a pipe nobody reads
        pass


def configure_devices(intra_op_threads: int, inter_op_threads: int, use_gpus: bool = True) -> str:
    """Pins this process to its device and sizes TensorFlow's thread pools; returns 'gpu'|'cpu'.

    Must run before TensorFlow executes any op. `list_physical_devices` only enumerates GPUs; it
    does not create a context on each of them (as `device_lib.list_local_devices()` would, the
    trap that makes every worker allocate memory on every GPU). `use_gpus=False`
    (`runtime.device: cpu`): the GPUs are hidden from TensorFlow, which trains on the CPU.
    """
    gpus = tf.config.list_physical_devices("GPU")
    if gpus and not use_gpus:  # TensorFlow was imported before CUDA_VISIBLE_DEVICES hid them
        tf.config.set_visible_devices([], "GPU")
        gpus = []
    ordinal = None  # this worker's GPU, as CUDA numbers it
    if gpus:
        # Horovod: one GPU per process, chosen by local rank. A launcher that already narrowed
        # CUDA_VISIBLE_DEVICES to one GPU per process leaves exactly one visible.
        if len(gpus) > 1 and local_rank() >= len(gpus):
            raise UserError(
                f"worker with local rank {local_rank()} found only {len(gpus)} GPUs on "
                f"this host; start at most {len(gpus)} workers per host"
            )
        gpu = gpus[local_rank() if len(gpus) > 1 else 0]
        tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpu, "GPU")
        ordinal = int(gpu.name.rsplit(":", 1)[1])
    # After cores.bind() the affinity mask already is this worker's share.
    share = core_share(len(os.sched_getaffinity(0)), local_size(), bound=bool(cores.bound()))
    intra, inter = thread_counts(intra_op_threads, inter_op_threads, share, gpu=bool(gpus))
    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)
    # After the pools are sized: a collective runs TensorFlow, which then fixes them.
    refuse_shared_gpu(ordinal)  # on every rank, a GPU or not: a collective
    return "gpu" if gpus else "cpu"


def refuse_shared_gpu(ordinal: int | None) -> None:
    """Raises UserError on every rank when two ranks train on one GPU: the ranks all-gather
    their GPU's identity (base/gpus.py `identity`, of CUDA device `ordinal`; None for a rank
    on the CPU) before any collective that could reach NCCL.

    The launchers never place two workers on one GPU, but a scheduler that sets each rank's
    CUDA_VISIBLE_DEVICES can, as can a plain horovodrun on a GPU split into MIG instances;
    NCCL would then end the job in "Duplicate GPU detected" at the first all-reduce. Every rank
    sees the same list, so every rank raises the same error: none is left waiting.

    Not in a Horovod Elastic job: a worker that joins it later starts alone, while the others
    go on from their reset, so a gather at its start would have no partner.
    """
    if not hvd_tf.is_initialized() or size() == 1 or os.environ.get("HOROVOD_ELASTIC"):
        return
    with tf.device("/cpu:0"):  # the gather itself must not go through NCCL
        mine = None if ordinal is None else host_gpus.identity(ordinal)
        every = allgather_object(mine, name="hvd_train.gpu_identity")
    holder: dict[tuple[str, str], int] = {}
    for r, held in enumerate(every):
        if held is None:
            continue
        machine, bus, host = held
        if (machine, bus) in holder:
            raise UserError(
                f"rank {holder[machine, bus]} and rank {r} both train on the GPU at PCI "
                f"{bus} on {host}: one GPU per rank, never two ranks on one (NCCL would end "
                'the job in "Duplicate GPU detected"; MIG instances of one GPU are one GPU to '
                "it); give each rank its own GPU (CUDA_VISIBLE_DEVICES), or let hvd-train "
                "launch start one worker per GPU"
            )
        holder[machine, bus] = r


def core_share(cores: int, local_workers: int, *, bound: bool) -> int:
    """One worker's share of the `cores` this process may use: split between the
    `local_workers` of its host, or all of them once `bound` to its own; at least 1."""
    return cores if bound else max(1, cores // local_workers)


def thread_counts(intra_op: int, inter_op: int, share: int, *, gpu: bool) -> tuple[int, int]:
    """TensorFlow's (intra-op, inter-op) threads for one worker: the config's where set (not 0),
    else sized to the worker's `share` of the cores (`core_share`).

    Left to TensorFlow, each pool takes every core of the host in each worker: eight GPU
    workers would each start two threads per core for their host-side ops.
    """
    # On CPU, two ops at once where the worker has two cores or more; on one core a second
    # thread only time-slices the core with the first, each evicting the other's cache. On a
    # GPU the inter-op pool launches the kernels and runs the host's ops: the worker's share.
    inter_default = share if gpu else min(2, share)
    return intra_op or share, inter_op or inter_default


def allreduce_sum(values: np.ndarray | list[float], name: str) -> np.ndarray:
    """Sums a float64 vector over all ranks (exact counts and sums, not a mean of means)."""
    tensor = tf.constant(np.asarray(values, dtype=np.float64))
    return hvd_tf.allreduce(tensor, op=hvd_tf.Sum, name=name).numpy()


def barrier(name: str) -> None:
    """Returns once every rank has called it (a one-number all-reduce)."""
    if size() > 1:
        allreduce_sum([0.0], name)


def barrier_if_alive(name: str) -> None:
    """A barrier that gives up quietly when another worker has already gone."""
    try:
        barrier(name)
    except Exception:  # noqa: BLE001 - the caller's work is done; a gone peer changes nothing
        pass


def broadcast_object(obj: Any, name: str) -> Any:
    """Rank 0's `obj` on every rank."""
    return hvd_tf.broadcast_object(obj, root_rank=0, name=name)


def allgather_object(obj: Any, name: str) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank."""
    return hvd_tf.allgather_object(obj, name=name)


def stop_timeline() -> None:
    """Stops Horovod's timeline; rank 0's writer then flushes and closes timeline.json."""
    hvd_tf.stop_timeline()


def broadcast_variables(variables: list[tf.Variable]) -> None:
    """Copies rank 0's values into `variables` on every rank."""
    hvd_tf.broadcast_variables(variables, root_rank=0)


def versions() -> dict[str, str]:
    """summary.json's `versions`: the stack this run trained on (`keras`: "tf_keras 2.18.0")."""
    return {
        "python": sys.version.split()[0],
        "tensorflow": tf.__version__,
        "keras": binding.active().describe(),
        "horovod": horovod.__version__,
    }


def chief_computes(fn: Callable[[], Any], name: str) -> Any:
    """Runs `fn` on rank 0 alone and gives every rank its result, or its error.

    For work whose answer every rank must share, done once (listing and checking a data
    folder). A UserError on rank 0 is raised on every rank, so none is left waiting in the
    broadcast; another error on rank 0 ends the other ranks with a RuntimeError. Without
    Horovod started (a tool run outside a job), it just calls `fn`.
    """
    if not hvd_tf.is_initialized() or size() == 1:
        return fn()
    result: Any = None
    error: Exception | None = None
    if is_chief():
        try:
            result = fn()
        except Exception as e:  # shared below, then raised on rank 0 too
            error = e
    shared = error if isinstance(error, UserError) or error is None else RuntimeError(repr(error))
    result, shared = broadcast_object((result, shared), name=name)
    if error is not None:
        raise error
    if shared is not None:
        raise shared
    return result
