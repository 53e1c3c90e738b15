"""The CPU one gradient all-reduce costs, and what Horovod's background thread costs when idle.

    horovodrun -np 2 -H localhost:2 --gloo benchmarks/pin_to_core.sh \
        .venv/bin/python benchmarks/allreduce_cost.py [--floats 1100000]
    horovodrun -np 2 -H localhost:2 --mpi benchmarks/pin_to_core.sh \
        .venv/bin/python benchmarks/allreduce_cost.py

Each worker (bound to a core of its own by pin_to_core.sh) all-reduces one float32 tensor of
--floats elements (1.1 M: the light benchmark model's 4.4 MB of gradients) --iters times and
prints the wall time and this process's CPU time per all-reduce; then it sleeps a second and
prints the CPU Horovod's threads used meanwhile (its background thread's cycle, every
HOROVOD_CYCLE_TIME ms, with a collective call each cycle). With no compute to share the core
with, this is the all-reduce's own cost, which a CPU worker pays on its compute core. Last,
both workers at once copy an array of the tensor's size into another (NumPy, one core each):
the all-reduce's CPU time over that copy's says how many copies of its tensor it costs.
Not part of the test suite.
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--floats", type=int, default=1_100_000)
    p.add_argument("--iters", type=int, default=40)
    args = p.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd.init()
    x = tf.random.uniform([args.floats])
    allreduce = tf.function(lambda t: hvd.allreduce(t, op=hvd.Average))
    for _ in range(5):
        allreduce(x).numpy()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.iters):
        allreduce(x).numpy()
    wall = (time.perf_counter() - wall) / args.iters
    cpu = (time.process_time() - cpu) / args.iters
    idle = time.process_time()
    time.sleep(1.0)
    idle = time.process_time() - idle
    copy = copy_time(args.floats, args.iters, lambda: allreduce(tf.zeros([1])).numpy())
    controller = "gloo" if hvd.gloo_enabled() else "mpi"
    print(f"rank {hvd.rank()}/{hvd.size()} {controller}: {4 * args.floats / 1e6:.1f} MB "
          f"all-reduce {1000 * wall:.2f} ms wall, {1000 * cpu:.2f} ms CPU; idle Horovod "
          f"{1000 * idle:.0f} ms CPU per s; one copy of the tensor {1000 * copy:.2f} ms "
          f"(the all-reduce's CPU = {cpu / copy:.1f} copies)", flush=True)  # fmt: skip


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
