"""Runs `hvd-train train ARGS` alone, as a worker starts, on a machine made to look like a GPU
host whose Horovod has its XLA all-reduce (the two checks `runtime.xla` makes are replaced), and
prints `AT_LOAD [...]`: HOROVOD_ENABLE_XLA_OPS as it was each time Horovod's TensorFlow library
(`horovod.tensorflow.mpi_ops`, whose import loads mpi_lib*.so and runs its XLA registrars) was
imported, then the command's exit code.

It proves when the variable is set, not that XLA then compiles the all-reduce (no GPU here).
"""

import importlib.abc
import os
import sys

from hvd_train.runtime import xla

xla.gpu_visible = lambda: True
xla.horovod_has_xla_ops = lambda lib=None: True
seen = []


class _WatchHorovodLibrary(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == xla.LIBRARY_MODULE:
            seen.append(os.environ.get(xla.ENV))
        return None  # the import goes on as usual


sys.meta_path.insert(0, _WatchHorovodLibrary())
from hvd_train import cli  # noqa: E402

code = cli.main(["train", *sys.argv[1:]])
print(f"AT_LOAD {seen} CODE {code}", flush=True)
