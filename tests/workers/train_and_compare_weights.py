"""Runs on every rank: trains from a config, then asserts all ranks hold identical weights.

Usage: train_and_compare_weights.py CONFIG [KEY=VALUE ...]
"""

import hashlib
import sys

import numpy as np

from hvd_train.config import load_config
from hvd_train.runtime import distributed
from hvd_train.train.trainer import train

model, summary = train(load_config(sys.argv[1], sys.argv[2:]))
flat = np.concatenate([w.ravel() for w in model.get_weights()])
digest = hashlib.sha256(flat.tobytes()).hexdigest()
digests = distributed.allgather_object(digest, name="weights_digest")
assert len(set(digests)) == 1, f"rank {distributed.rank()}: weights differ across ranks: {digests}"
assert summary["status"] == "completed", summary
print(f"rank {distributed.rank()}: weights identical on {len(digests)} ranks: {digest[:16]}")
