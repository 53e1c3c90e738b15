"""Runs `hvd-train train ARGS` alone, as a worker starts, on a machine made to look like a GPU
host whose Horovod has its XLA all-reduce (the two checks the XLA decision makes are replaced:
base/xla_env.py's before TensorFlow's import, runtime/xla.py's after it, as that module is
imported, so that TensorFlow still loads where the command loads it), and prints
`AT_LOAD [...]`: HOROVOD_ENABLE_XLA_OPS as it was each time Horovod's TensorFlow library
(`horovod.tensorflow.mpi_ops`, whose import loads mpi_lib*.so and runs its XLA registrars) was
imported, then the command's exit code.

It proves when the variable is set, not that XLA then compiles the all-reduce (no GPU here).
"""

import importlib.abc
import importlib.machinery
import os
import sys

from hvd_train.base import xla_env

xla_env.horovod_has_xla_ops = lambda lib=None: True
seen = []


class _Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == xla_env.LIBRARY_MODULE:
            seen.append(os.environ.get(xla_env.ENV))
        if name != "hvd_train.runtime.xla":
            return None  # the import goes on as usual
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            module.gpu_visible = lambda: True  # TensorFlow "sees" a GPU

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Watch())
from hvd_train import cli

code = cli.main(["train", *sys.argv[1:]])
print(f"AT_LOAD {seen} CODE {code}", flush=True)
