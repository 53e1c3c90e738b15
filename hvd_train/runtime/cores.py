"""Core binding: which cores each worker of a host takes, and binding its threads to them.

`wanted(setting)` decides, `bind()` binds (before Horovod and TensorFlow start threads),
`for_worker(local, count)` says which cores, `bound()` which this worker was given.
"""

from __future__ import annotations

import os

import tensorflow as tf

from hvd_train.base import gpus as host_gpus

# This worker's cores when bind() gave it a share of the host, else empty.
_BOUND: list[int] = []


def bind() -> list[int]:
    """Binds this worker's threads to its own share of the cores, by local rank; returns them.

    Call before `distributed.init()` and before TensorFlow runs anything: threads started later
    (TensorFlow's pools, tf.data's, Horovod's background thread) inherit the binding. On a GPU
    host, the cores nearest this worker's GPU (`nvidia-smi topo -m`: base/gpus.py
    `nearest_cores`), so its copies to and from the GPU cross no socket. Else the cores this
    process may use (its affinity mask, which honours taskset and container limits) are cut
    into one contiguous block per local worker; with more workers than cores, workers share
    cores round robin. Horovod's background thread is pinned to the first core of the block
    through HOROVOD_THREAD_AFFINITY (a launcher's value wins).
    """
    local, count = host_gpus.launcher_local_rank()
    mine = for_worker(local, count)
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), mine)
        except ProcessLookupError:  # a thread that has just exited
            pass
    # Horovod indexes this list by local rank; only this process reads its copy.
    os.environ.setdefault("HOROVOD_THREAD_AFFINITY", ",".join([str(mine[0])] * count))
    _BOUND[:] = mine
    return mine


def for_worker(local: int, count: int) -> list[int]:
    """The cores `bind` gives local worker `local` of `count`: those nearest its GPU on a GPU
    host where nvidia-smi says which they are, else its block of this process's."""
    found = host_gpus.devices()
    topo = host_gpus.nvidia_smi("topo", "-m") if found else ""
    near = host_gpus.nearest_cores(local, count, found, topo)
    if near:
        return near
    cores = sorted(os.sched_getaffinity(0))
    per = len(cores) // count
    return cores[local * per : (local + 1) * per] if per else [cores[local % len(cores)]]


def wanted(setting: bool | None) -> bool:
    """Whether this worker binds itself to its share of the cores (`runtime.bind_cores`).

    Unset (None): yes on a host without a GPU where the launcher started several workers, which
    then share its cores: unbound, the scheduler moves their threads between cores and puts
    two workers' threads on one core while the other waits (docs/benchmarks.md, "Findings").
    Not with GPUs (the launcher's placement is kept), nor for a lone worker
    or one whose launcher did not say its local rank.
    """
    if setting is not None:
        return setting
    return host_gpus.launcher_local_rank()[1] > 1 and not tf.config.list_physical_devices("GPU")


def bound() -> list[int]:
    """The cores `bind` gave this worker ([] when it was not called)."""
    return list(_BOUND)
