"""Which device a worker trains on (`runtime.device`), decided before TensorFlow is imported
(runtime/device.py holds TensorFlow to it once it is).

A GPU host whose TensorFlow cannot use its GPUs (a CPU wheel left from an earlier install, CUDA
libraries that do not load) would otherwise train on the CPU, many times slower, and record
`completed`. So with `auto` a GPU that nvidia-smi lists (base/gpus.py), and with `gpu` any,
must be one TensorFlow sees, or the worker ends in one line saying why (`unusable`); `cpu` hides
the GPUs from TensorFlow before it looks for them (`prepare`).
"""

from __future__ import annotations

import ctypes
import glob
import os
import sysconfig
from collections.abc import Callable
from typing import Any

# CUDA's largest JIT cache (CUDA_CACHE_MAXSIZE, bytes). TensorFlow 2.21's CUDA wheel carries
# machine code for sm_60, 70, 80, 89 and 90 and PTX for compute_90 alone: on a newer GPU (a
# B200, sm_100) the driver compiles every kernel from that PTX at first use, and keeps what
# fits in its cache (~/.nv/ComputeCache, or CUDA_CACHE_PATH), whose default is far smaller than
# TensorFlow's kernels; too small, the compile is repeated in every run. Where the GPU has its
# machine code, the cache is never used.
JIT_CACHE_BYTES = 4 << 30


def prepare(choice: str, listed: int) -> bool:
    """Before TensorFlow is imported: with `cpu` hides the GPUs (CUDA_VISIBLE_DEVICES=-1:
    TensorFlow, Horovod and their CUDA libraries then find none), else, for a GPU, sizes the
    driver's JIT cache (JIT_CACHE_BYTES; a value set already wins); returns whether this worker
    will train on a GPU, `listed`: the devices nvidia-smi lists for it (base/gpus.py)."""
    if choice == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    gpu = expects_gpu(choice, listed)
    if gpu:
        os.environ.setdefault("CUDA_CACHE_MAXSIZE", str(JIT_CACHE_BYTES))
    return gpu


def expects_gpu(choice: str, listed: int) -> bool:
    """Whether `runtime.device` (`choice`) makes a GPU this worker's device: `gpu` always,
    `auto` where nvidia-smi lists one (`listed`), `cpu` never."""
    return choice == "gpu" or (choice == "auto" and listed > 0)


def unusable(choice: str, listed: int, tf_version: str, info: dict[str, Any]) -> str:
    """The one line of a worker whose TensorFlow sees no GPU where it must: what was expected,
    TensorFlow's build (`info`: tf.sysconfig.get_build_info()), what did not load, and the two
    ways out."""
    where = f"nvidia-smi lists {listed} GPU(s)" if listed else "a GPU was asked for"
    why = build_problem(info, load_failures)
    return (
        f"runtime.device: {choice}: {where} but TensorFlow {tf_version} sees none ({why}); "
        "HVD_TRAIN_DEVICE=gpu scripts/install.sh installs TensorFlow's CUDA build and its "
        "libraries, or set runtime.device: cpu to train on the CPU"
    )


def build_problem(info: dict[str, Any], failures: Callable[[list[str]], list[str]]) -> str:
    """Why a TensorFlow of build `info` sees no GPU: a CPU build, or the CUDA libraries that
    `failures(names)` says did not load (the loader's errors), the driver's first."""
    if not info.get("is_cuda_build"):
        return "a CPU-only build: tf.sysconfig.get_build_info() says is_cuda_build False"
    cuda, cudnn = info.get("cuda_version") or "?", info.get("cudnn_version") or "?"
    built = f"built for CUDA {cuda} and cuDNN {cudnn}"
    failed = failures(cuda_libraries(str(cuda), str(cudnn)))
    if not failed:
        return f"{built}; its CUDA libraries load: see the rank's log for TensorFlow's reason"
    return f"{built}; did not load: {'; '.join(failed)}"


def cuda_libraries(cuda: str, cudnn: str) -> list[str]:
    """The shared libraries a CUDA build of TensorFlow loads first: the driver's, then the
    CUDA runtime and cuDNN of its build's major versions."""
    major = {"cuda": cuda.split(".")[0], "cudnn": cudnn.split(".")[0]}
    return ["libcuda.so.1", f"libcudart.so.{major['cuda']}", f"libcudnn.so.{major['cudnn']}"]


def load_failures(names: list[str]) -> list[str]:
    """The loader's error (it names the library) for each of `names` that does not load."""
    return [str(error) for name in names if (error := load_error(name)) is not None]


def load_error(name: str) -> OSError | None:
    """Why the shared library `name` loads neither from the loader's path nor from the NVIDIA
    pip wheels beside TensorFlow (site-packages/nvidia/*/lib, where TensorFlow's CUDA wheel
    finds it); None when it loads. The loader's own error is the one given."""
    wheels = glob.glob(os.path.join(sysconfig.get_path("purelib"), "nvidia", "*", "lib", name))
    first = None
    for candidate in [name, *wheels]:
        try:
            ctypes.CDLL(candidate)
            return None
        except OSError as e:
            first = first or e
    return first


def label(choice: str, device: str) -> str:
    """The device as the run's opening line gives it: `cpu (runtime.device: cpu)` where the
    user chose the CPU, else "gpu" or "cpu"."""
    return f"{device} (runtime.device: {choice})" if choice == "cpu" else device
