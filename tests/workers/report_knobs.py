"""Runs on every rank: trains from a config, then prints one JSON line of what the speed knobs
did in this process (precision of each layer, optimizer wrapping, thread binding, XLA).

Usage: report_knobs.py CONFIG [KEY=VALUE ...]
"""

import json
import os
import sys

from hvd_train.config import load_config
from hvd_train.runtime.keras import binding

cfg = load_config(sys.argv[1], sys.argv[2:])
binding.prepare(cfg.runtime.keras)  # before TensorFlow is imported, as `hvd-train train` does
binding.import_tensorflow()

# isort: split
import numpy as np
import tensorflow as tf

from hvd_train.runtime import distributed
from hvd_train.train.run.trainer import train


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


model, summary = train(cfg)
keras = binding.keras()  # the Keras that trained it
opt = model.optimizer
inner = getattr(opt, "inner_optimizer", opt)
if binding.active().NAME == "keras":  # hvd_train's averaging optimizer, the loss scaler inside
    averaging = type(opt).__mro__[1].__name__ == "Averaging"
    accumulation = opt._hvd_accumulation
else:  # Horovod's DistributedOptimizer inside the loss scaler
    averaging = type(inner).__module__ == "horovod._keras"
    helper = getattr(inner, "_agg_helper", None)
    accumulation = helper.backward_passes_per_step if helper else 1
threads = thread_affinities()
report = {
    "rank": distributed.rank(),
    "local_rank": distributed.local_rank(),
    "keras": binding.active().NAME,
    "policy": keras.mixed_precision.global_policy().name,
    "layers": [(layer.compute_dtype, layer.dtype) for layer in model.layers if layer.weights],
    "output_dtype": tf.as_dtype(model.output.dtype).name,  # Keras 3 names it as a string
    "loss_scale_optimizer": isinstance(opt, keras.mixed_precision.LossScaleOptimizer),
    "averaging_optimizer": averaging,
    "accumulation": accumulation,
    "thread_affinities": sorted({tuple(a) for a in threads}),
    "num_threads": len(threads),
    "horovod_thread_affinity": os.environ.get("HOROVOD_THREAD_AFFINITY"),
    "horovod_cycle_time": os.environ.get("HOROVOD_CYCLE_TIME"),
    "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
    "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
    "jit": tf.config.optimizer.get_jit(),
    "final_loss": summary["final_metrics"]["loss"],
    "weights_finite": bool(all(np.isfinite(w).all() for w in model.get_weights())),
}
print("KNOBS " + json.dumps(report), flush=True)
