"""Runs on every rank: trains from a config, then asserts all ranks hold identical replicated
state (weights, optimizer slots and step counter, loss scale, the accumulation window's
counter: runtime/replicas.py), and prints its digest.

Usage: train_and_compare_weights.py CONFIG [KEY=VALUE ...]
"""

import hashlib
import sys

import numpy as np

from hvd_train.config import load_config
from hvd_train.runtime.keras import binding

cfg = load_config(sys.argv[1], sys.argv[2:])
binding.prepare(cfg.runtime.keras)  # before TensorFlow is imported, as `hvd-train train` does
binding.import_tensorflow()
from hvd_train.runtime import distributed, replicas  # TensorFlow from here on
from hvd_train.train.run.trainer import train

model, summary = train(cfg)
digest = hashlib.sha256()
for name, variable in replicas.replicated_variables(model):
    digest.update(name.encode())
    digest.update(np.ascontiguousarray(variable.numpy()).tobytes())
digest = digest.hexdigest()
digests = distributed.allgather_object(digest, name="weights_digest")
assert len(set(digests)) == 1, f"rank {distributed.rank()}: weights differ across ranks: {digests}"
assert summary["status"] == "completed", summary
print(f"rank {distributed.rank()}: weights identical on {len(digests)} ranks: {digest[:16]}")
# The updates the optimizer made (a step the loss scaler skipped makes none), and the scale.
optimizer = model.optimizer
scale = getattr(optimizer, "dynamic_scale", getattr(optimizer, "loss_scale", None))
print(
    f"rank {distributed.rank()}: iterations {int(optimizer.iterations.numpy())}, "
    f"loss scale {None if scale is None else float(np.asarray(scale))}"
)
