"""The CPU one gradient all-reduce costs, and what Horovod's background thread costs when idle.

    horovodrun -np 2 -H localhost:2 --gloo lab/pin_to_core.sh \
        .venv/bin/python lab/two-workers-on-two-cores/allreduce_cost.py [--floats 1100000]
    horovodrun -np 2 -H localhost:2 --mpi lab/pin_to_core.sh \
        .venv/bin/python lab/two-workers-on-two-cores/allreduce_cost.py [--model light|heavy]

Each worker (bound to a core of its own by pin_to_core.sh) all-reduces, --iters times, either
one float32 tensor of --floats elements (1.1 M: the light benchmark model's 4.4 MB of
gradients), or with --model the gradients of a benchmark model (compare_peers.py's light or
heavy convnet: 12 or 14 tensors, 4.4 or 49.6 MB) as the trainer does, in one grouped
all-reduce; inside a tf.function, as in a training step. It prints the wall time and this
process's CPU time per all-reduce, and which path Horovod took: shared memory (every rank on
this host; `HOROVOD_SHM_ALLREDUCE=0` turns it off) or the controller's transport. Then it
sleeps a second and prints the CPU Horovod's threads used meanwhile: its background thread,
which sleeps while nothing is queued (`HOROVOD_IDLE_CYCLE_TIME=0`: it wakes every 1 ms cycle, as
upstream Horovod's does). With no compute to share the core with, this is the all-reduce's own
cost, which a CPU worker pays on its compute core. Last, both workers at once copy an array of
the gradients' size into another (NumPy, one core each): the all-reduce's CPU time over that
copy's says how many copies of its gradients it costs. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if "OMPI_COMM_WORLD_SIZE" in os.environ:  # as hvd_train does on a CPU host
    os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")

import horovod.tensorflow as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402

CONVS = [(3, 3, 3, 32), (32,), (3, 3, 32, 32), (32,), (3, 3, 32, 64), (64,), (3, 3, 64, 64), (64,)]
# The benchmark convnet's gradients (peer_worker.py's WORKLOADS on 32x32x3 images, 10 classes).
MODELS = {
    "light": [*CONVS, (4096, 256), (256,), (256, 10), (10,)],
    "heavy": [*CONVS, (4096, 2816), (2816,), (2816, 256), (256,), (256, 10), (10,)],
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--floats", type=int, default=1_100_000)
    p.add_argument("--model", choices=sorted(MODELS), help="a model's gradients, grouped")
    p.add_argument("--iters", type=int, default=40)
    args = p.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd.init()
    shapes = MODELS[args.model] if args.model else [(args.floats,)]
    xs = [tf.random.uniform(s) for s in shapes]
    floats = sum(x.shape.num_elements() for x in xs)

    @tf.function
    def allreduce(xs):
        ys = (
            hvd.grouped_allreduce(xs, op=hvd.Average)
            if len(xs) > 1
            else [hvd.allreduce(xs[0], op=hvd.Average)]
        )
        return tf.add_n([tf.reshape(y, [-1])[0] for y in ys])  # a scalar: no copy to NumPy

    for _ in range(5):
        allreduce(xs).numpy()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.iters):
        allreduce(xs).numpy()
    wall = (time.perf_counter() - wall) / args.iters
    cpu = (time.process_time() - cpu) / args.iters
    idle = time.process_time()
    time.sleep(1.0)
    idle = time.process_time() - idle
    copy = copy_time(floats, args.iters, lambda: allreduce([tf.zeros([1])]).numpy())
    controller = "gloo" if hvd.gloo_enabled() else "mpi"
    path = "shared memory" if hvd.shm_allreduce_enabled() else controller
    what = f"{args.model} model's {len(xs)} gradients" if args.model else "one tensor"
    print(f"rank {hvd.rank()}/{hvd.size()} {controller}: {what}, {4 * floats / 1e6:.1f} MB, "
          f"all-reduce through {path}: {1000 * wall:.2f} ms wall, {1000 * cpu:.2f} ms CPU; idle "
          f"Horovod {1000 * idle:.0f} ms CPU per s; one copy of the gradients "
          f"{1000 * copy:.2f} ms (the all-reduce's CPU = {cpu / copy:.1f} copies)", flush=True)  # fmt: skip


def copy_time(floats: int, iters: int, barrier) -> float:
    """Seconds one copy of `floats` float32 takes, the other worker copying at the same time."""
    import numpy as np

    src, dst = np.random.rand(floats).astype(np.float32), np.empty(floats, np.float32)
    np.copyto(dst, src)  # both pages faulted in before timing
    barrier()
    began = time.perf_counter()
    for _ in range(iters):
        np.copyto(dst, src)
    return (time.perf_counter() - began) / iters


if __name__ == "__main__":
    main()
