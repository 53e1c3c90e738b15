"""Runs `hvd-train ARGS` (train, data-bench) alone, as a worker starts, and prints
`AT_IMPORT <TF_XLA_FLAGS>`: the variable as it was when `tensorflow` was first imported (XLA's
flags are read once, at their first use, which may be TensorFlow's import). Then it ends the
process: what comes after the import is not this check's.
"""

import importlib.abc
import os
import sys


class _WatchTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "tensorflow":
            print(f"AT_IMPORT {os.environ.get('TF_XLA_FLAGS')!r}", flush=True)
            os._exit(0)
        return None  # any other import goes on as usual


sys.meta_path.insert(0, _WatchTensorFlow())
from hvd_train import cli

code = cli.main(sys.argv[1:])
print(f"NEVER_IMPORTED CODE {code}", flush=True)
