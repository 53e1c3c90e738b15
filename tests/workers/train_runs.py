"""Runs on every rank: trains several runs in one job, then reports what the ranks hold.

Usage: train_runs.py SPEC.json, where SPEC.json is a list of
`{"name": ..., "config": PATH or null, "overrides": ["k=v", ...], "predict_on": NPY or null}`.
For each run, rank 0 prints one line `RESULT {json}` with the summary status, the optimizer's
step count, whether the
trainable weights and the BatchNormalization statistics are identical on all ranks, and how
many SyncBatchNormalization layers the trained model has. With `predict_on`, rank 0 also saves
the trained model's predictions on those inputs to `<run.dir>/predictions.npy`.
"""

import hashlib
import json
import os
import sys

import numpy as np

from hvd_train.config import load_config
from hvd_train.runtime.keras import binding

binding.import_tensorflow()  # as `hvd-train train` does
from hvd_train.runtime import distributed
from hvd_train.train.run.trainer import train


def digest(arrays) -> str:
    flat = [np.asarray(a).ravel() for a in arrays]
    return hashlib.sha256(np.concatenate(flat).tobytes() if flat else b"").hexdigest()


def identical(name: str, arrays) -> bool:
    return len(set(distributed.allgather_object(digest(arrays), name=name))) == 1


def all_layers(model):
    for layer in model.layers:
        yield layer
        if hasattr(layer, "layers"):
            yield from all_layers(layer)


with open(sys.argv[1]) as f:
    spec = json.load(f)
for run in spec:
    cfg = load_config(run["config"], run["overrides"])
    model, summary = train(cfg)
    stats = [w for w in model.non_trainable_weights if "moving_" in w.name]
    result = {
        "name": run["name"],
        "status": summary["status"],
        "world_size": summary["world_size"],
        "trainable_identical": identical(f"{run['name']}_t", model.trainable_weights),
        "bn_statistics": len(stats),
        "bn_statistics_identical": identical(f"{run['name']}_bn", stats),
        "sync_layers": sum(type(x).__name__ == "SyncBatchNormalization" for x in all_layers(model)),
        "final_metrics": summary["final_metrics"],
        # the optimizer's step counter: a resume continues it from the checkpoint's
        "iterations": int(binding.active().inner_optimizer(model.optimizer).iterations.numpy()),
    }
    if distributed.is_chief():
        if run.get("predict_on"):
            x = np.load(run["predict_on"])
            np.save(os.path.join(cfg.run.dir, "predictions.npy"), model.predict(x, verbose=0))
        print("RESULT " + json.dumps(result), flush=True)
