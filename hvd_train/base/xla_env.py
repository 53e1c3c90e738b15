"""XLA and Horovod's all-reduce, decided before TensorFlow and Horovod load: whether
`runtime.jit_compile` compiles the whole train step (the half of runtime/xla.py that runs first).

Horovod's all-reduce has an XLA implementation only in CUDA builds that compiled its
xla_mpi_ops.cc, and only for `HorovodAllreduce` (not the grouped all-reduce). A static
initializer of Horovod's TensorFlow library (`mpi_lib*.so`) registers it when
HOROVOD_ENABLE_XLA_OPS=1 as the library loads, which is when `horovod.tensorflow` is first
imported; set later (at `hvd.init`), it registers nothing, and a whole-step compile fails on the
all-reduce. So a worker decides before that import, and before TensorFlow's, whose XLA flags
(TF_XLA_FLAGS) are read once, at their first use (`environment`: the commands call it before
they import TensorFlow; runtime/xla.py's `prepare` after, for what TensorFlow sees), and every
later question reads the environment it left (`whole_step`).
Elsewhere (CPU; Horovod built for TensorFlow 2.19+, which drops that file:
patches/horovod-0.28.1/0011) XLA auto-clustering compiles what it can of the step, and the
all-reduce stays outside.
"""

from __future__ import annotations

import importlib.util
import mmap
import os
import pathlib
import sys

ENV = "HOROVOD_ENABLE_XLA_OPS"
# The module whose import loads Horovod's TensorFlow library (and runs its registrars).
LIBRARY_MODULE = "horovod.tensorflow.mpi_ops"


def environment(jit_compile: bool, gpu: bool) -> None:
    """Before TensorFlow is imported (`gpu`: whether this worker will train on one,
    base/device_choice.py): with `runtime.jit_compile` on, HOROVOD_ENABLE_XLA_OPS=1 where the
    whole step can be compiled (a GPU, Horovod's XLA all-reduce built), else XLA's flags for
    auto-clustering (TF_XLA_FLAGS: TensorFlow reads them once, at their first use, which may
    be its import). Once Horovod's library is loaded, HOROVOD_ENABLE_XLA_OPS is left as it is
    (set now, it would claim an all-reduce that was never registered)."""
    if not jit_compile:
        return
    if gpu and horovod_has_xla_ops() and LIBRARY_MODULE not in sys.modules:
        os.environ.setdefault(ENV, "1")
    if not whole_step(jit_compile, gpu):
        flags = os.environ.get("TF_XLA_FLAGS", "")
        if "--tf_xla_cpu_global_jit" not in flags:
            os.environ["TF_XLA_FLAGS"] = f"{flags} --tf_xla_cpu_global_jit".strip()


def whole_step(jit_compile: bool, gpu: bool) -> bool:
    """Whether `runtime.jit_compile` compiles the whole train step, all-reduce included: on a
    GPU, with Horovod's XLA all-reduce built and registered (HOROVOD_ENABLE_XLA_OPS=1 when its
    library loaded: `environment`)."""
    registered = os.environ.get(ENV) == "1"
    return jit_compile and registered and whole_step_xla(gpu, horovod_has_xla_ops())


def whole_step_xla(gpu: bool, xla_ops: bool) -> bool:
    """Whether XLA can compile the whole train step here: a GPU, and Horovod's XLA ops."""
    return gpu and xla_ops


def horovod_has_xla_ops(lib: pathlib.Path | None = None) -> bool:
    """Whether Horovod's TensorFlow library (`lib`: the installed one) holds its XLA all-reduce,
    the custom-call target xla_mpi_ops.cc registers in CUDA builds: its bytes searched, nothing
    imported or loaded."""
    if lib is None:
        spec = importlib.util.find_spec("horovod.tensorflow")
        origin = spec.origin if spec else None
        lib = next(pathlib.Path(origin).parent.glob("mpi_lib*.so"), None) if origin else None
    if lib is None or lib.stat().st_size == 0:
        return False
    with open(lib, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return data.find(b"CallbackHVDAllreduce") >= 0
