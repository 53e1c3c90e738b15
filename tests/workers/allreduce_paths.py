"""Run by tests/test_allreduce_paths.py on every rank of a job: what Horovod's all-reduce gives,
and what its background thread does while nothing is queued.

    allreduce_paths.py exact OUT       # the sums and averages, exact, alike on every rank
    allreduce_paths.py idle OUT        # the background thread's sleeps while idle
    allreduce_paths.py victim OUT      # large all-reduces until the test kills rank 1
    allreduce_paths.py stalled OUT     # rank 0 all-reduces, rank 1 never does

Each rank writes OUT/rank-<r>.json.
"""

from __future__ import annotations

import json
import os
import sys
import time

from hvd_train.runtime.keras import binding

binding.import_tensorflow()  # as hvd_train's workers import it: base/deferred.py

# isort: split
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

# Not a multiple of anything: sizes below, at and across the chunk and a rank's part of it.
SIZES = [0, 1, 7, 16, 17, 1000, 4095, 1 << 20, (1 << 20) + 3, 3_000_001]


def contribution(base: np.ndarray, rank: int) -> np.ndarray:
    """Rank `rank`'s tensor: known to every rank, different on each."""
    return (base * (rank + 1) + rank).astype(base.dtype)


def expected(base: np.ndarray, size: int, average: bool) -> np.ndarray:
    """The sum over the ranks in rank order, in the tensor's dtype, then the average's scaling
    as Horovod does it (multiplied by 1/size in that dtype)."""
    total = contribution(base, 0)
    for k in range(1, size):
        total = (total + contribution(base, k)).astype(base.dtype)
    return (total * base.dtype.type(1.0 / size)).astype(base.dtype) if average else total


def exact(rank: int, size: int) -> dict:
    rng = np.random.default_rng(1234)  # the same bases on every rank
    wrong = []
    for dtype in (np.float32, np.float64):
        for op, average in ((hvd.Sum, False), (hvd.Average, True)):
            bases = [rng.standard_normal(n).astype(dtype) for n in SIZES]
            # Fused: one grouped all-reduce of tensors of every size.
            outs = hvd.grouped_allreduce([tf.constant(contribution(b, rank)) for b in bases], op=op)
            # Alone: one all-reduce of one tensor.
            outs += [hvd.allreduce(tf.constant(contribution(b, rank)), op=op) for b in bases[-3:]]
            for b, out in zip(bases + bases[-3:], outs, strict=True):
                if not np.array_equal(out.numpy(), expected(b, size, average)):
                    wrong.append(f"{dtype.__name__} {'average' if average else 'sum'} of {b.size}")
    mine = hvd.allreduce(tf.constant(rng.standard_normal(999_999) * (rank + 1)), op=hvd.Average)
    digests = hvd.allgather_object(mine.numpy().tobytes())
    return {
        "wrong": wrong,
        "alike": all(d == digests[0] for d in digests),
        "shared_memory": hvd.shm_allreduce_enabled(),
    }


def switches(tid: int) -> int:
    """Thread `tid`'s voluntary context switches so far: each time it went to sleep."""
    with open(f"/proc/self/task/{tid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt"))


def background_thread(new: set[int]) -> int:
    """Horovod's background thread among the threads `hvd.init()` started: the one bound to
    the core HOROVOD_THREAD_AFFINITY names (the test sets it; the others may run anywhere)."""
    core = os.environ["HOROVOD_THREAD_AFFINITY"].split(",")[0]
    bound = []
    for tid in new:
        with open(f"/proc/self/task/{tid}/status") as f:
            if any(ln.split()[1:] == [core] for ln in f if ln.startswith("Cpus_allowed_list")):
                bound.append(tid)
    assert len(bound) == 1, f"threads bound to core {core}: {bound} of {sorted(new)}"
    return bound[0]


def idle(rank: int, size: int, before: set[int]) -> dict:
    """The background thread's sleeps over 2 s in which no tensor is queued, after one
    all-reduce."""
    thread = background_thread({int(t) for t in os.listdir("/proc/self/task")} - before)
    hvd.allreduce(tf.constant([1.0]), name="before_idle")
    start = switches(thread)
    time.sleep(2.0)
    spent = switches(thread) - start
    hvd.allreduce(tf.constant([1.0]), name="after_idle")
    return {"switches": spent}


def victim(rank: int, size: int, out: str) -> dict:
    """Both ranks all-reduce 256 MB again and again until one fails; the test stops rank 1
    inside one and kills it. Rank 0 waits out horovodrun's SIGTERM to report what it got."""
    import signal

    if rank == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(os.path.join(out, f"pid-{rank}"), "w") as f:
        f.write(str(os.getpid()))
    x = tf.ones([64 << 20])
    try:
        for _ in range(100_000):
            hvd.allreduce(x, op=hvd.Sum)
    except Exception as e:  # noqa: BLE001 - what the survivor got is the result
        return {"error": " ".join(str(e).split())[:800]}
    return {"error": None}


def stalled(rank: int) -> dict:
    """Rank 0 all-reduces a tensor that rank 1 never submits: rank 1 sleeps for longer than the
    test waits (Horovod's test/parallel/test_stall.py: there its other ranks come, late)."""
    if rank != 0:
        time.sleep(600)
        return {"error": None}
    try:
        hvd.allreduce(tf.constant([1.0]), name="only_rank_0")
    except Exception as e:  # noqa: BLE001 - what rank 0 got is the result
        return {"error": " ".join(str(e).split())[:800]}
    return {"error": None}


def main() -> None:
    what, out = sys.argv[1], sys.argv[2]
    before = {int(t) for t in os.listdir("/proc/self/task")}
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if what == "exact":
        result = exact(rank, size)
    elif what == "idle":
        result = idle(rank, size, before)
    elif what == "stalled":
        result = stalled(rank)
    else:
        result = victim(rank, size, out)
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(result, f)
    if what in ("victim", "stalled"):
        os._exit(1 if result["error"] else 0)  # Horovod's shutdown would wait for the dead rank


if __name__ == "__main__":
    main()
