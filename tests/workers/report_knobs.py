"""Runs on every rank: trains from a config, then prints one JSON line of what the speed knobs
did in this process (precision of each layer, optimizer wrapping, thread binding, XLA).

Usage: report_knobs.py CONFIG [KEY=VALUE ...]
"""

import json
import os
import sys

import hvd_train  # noqa: F401  (before TensorFlow: on 2.16+ it makes tf.keras Keras 2)

# isort: split
import numpy as np
import tensorflow as tf

from hvd_train.config import load_config
from hvd_train.runtime import distributed
from hvd_train.train.trainer import train


def thread_affinities() -> list[list[int]]:
    """The cores of every live thread of this worker: TensorFlow's pools, tf.data, Horovod,
    Gloo. A thread that ends between the listing and the reading is passed over."""
    found = []
    for tid in os.listdir("/proc/self/task"):
        try:
            found.append(sorted(os.sched_getaffinity(int(tid))))
        except ProcessLookupError:
            continue
    return found


model, summary = train(load_config(sys.argv[1], sys.argv[2:]))
opt = model.optimizer
inner = getattr(opt, "inner_optimizer", opt)
helper = getattr(inner, "_agg_helper", None)
threads = thread_affinities()
report = {
    "rank": distributed.rank(),
    "local_rank": distributed.local_rank(),
    "policy": tf.keras.mixed_precision.global_policy().name,
    "layers": [(layer.compute_dtype, layer.dtype) for layer in model.layers if layer.weights],
    "output_dtype": model.output.dtype.name,
    "loss_scale_optimizer": isinstance(opt, tf.keras.mixed_precision.LossScaleOptimizer),
    "inner_optimizer_module": type(inner).__module__,
    "backward_passes_per_step": helper.backward_passes_per_step if helper else 1,
    "thread_affinities": sorted({tuple(a) for a in threads}),
    "num_threads": len(threads),
    "horovod_thread_affinity": os.environ.get("HOROVOD_THREAD_AFFINITY"),
    "horovod_cycle_time": os.environ.get("HOROVOD_CYCLE_TIME"),
    "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
    "jit": tf.config.optimizer.get_jit(),
    "final_loss": summary["final_metrics"]["loss"],
    "weights_finite": bool(all(np.isfinite(w).all() for w in model.get_weights())),
}
print("KNOBS " + json.dumps(report), flush=True)
