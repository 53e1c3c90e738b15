"""`make gpu-build-check` (scripts/gpu_build_check.py), its logic without its download: which
of an object's undefined symbols are TensorFlow's, and which of those no library of TensorFlow's
exports, read from `nm` output as the check reads it; and which of Horovod's sources it compiles.
The check itself (wheels of about 600 MB a stack, minutes of g++) is not part of `make test`."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tarfile

import pytest
from harness import ROOT

spec = importlib.util.spec_from_file_location(
    "gpu_build_check", ROOT / "scripts" / "gpu_build_check.py"
)
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)

AS_GPU_STREAM = "_ZN15stream_executor3gpu16AsGpuStreamValueEPNS_6StreamE"
OP_KERNEL_DTOR = "_ZN10tensorflow8OpKernelD2Ev"
ENQUEUE = "_ZN7horovod6common16EnqueueJoinEv"  # a Horovod symbol another object defines

# `nm -P -u mpi_ops.o`, shortened: TensorFlow's, CUDA's, Horovod's own and a weak one.
MPI_OPS_UNDEFINED = f"""\
{AS_GPU_STREAM} U
{OP_KERNEL_DTOR} U
cudaStreamWaitEvent U
{ENQUEUE} U
_ZN10tensorflow7WeakOneEv w
"""
# `nm -P --defined-only operations.o` and `nm -D -P --defined-only libtensorflow_framework.so.2`.
OPERATIONS_DEFINED = f"{ENQUEUE} T 0000000000000000 0000000000000010\n"
TF_EXPORTED = f"{OP_KERNEL_DTOR}@@tensorflow T 00000000001a2b30 0000000000000022\n"


@pytest.mark.skipif(shutil.which("c++filt") is None, reason="no c++filt (binutils)")
def test_a_tensorflow_symbol_no_library_exports_is_missing() -> None:
    """As on TensorFlow 2.21 without patch 0014: mpi_ops.o needs AsGpuStreamValue and no
    library exports it; CUDA's and Horovod's own symbols, and a weak one, are not asked of
    TensorFlow. Once a library exports it, nothing is missing."""
    undefined = {"mpi_ops.o": check.parse_nm(MPI_OPS_UNDEFINED, "U")}
    defined = check.parse_nm(OPERATIONS_DEFINED)
    names = check.demangle(undefined["mpi_ops.o"])
    exported = check.parse_nm(TF_EXPORTED)
    assert exported == {OP_KERNEL_DTOR}  # the version suffix is not part of the name
    assert check.missing_symbols(undefined, defined, exported, names) == {
        "mpi_ops.o": ["stream_executor::gpu::AsGpuStreamValue(stream_executor::Stream*)"]
    }
    exported.add(AS_GPU_STREAM)
    assert check.missing_symbols(undefined, defined, exported, names) == {}


@pytest.mark.parametrize(
    ("demangled", "tensorflows"),
    [
        ("stream_executor::gpu::AsGpuStreamValue(stream_executor::Stream*)", True),
        ("tensorflow::OpKernel::~OpKernel()", True),
        ("tsl::errors::Internal(char const*)", True),
        ("absl::lts_20250814::Mutex::Lock()", True),
        ("TF_GetCode", True),
        ("horovod::tensorflow::ConvertStatus(horovod::common::Status const&)", False),
        ("horovod::common::EnqueueJoin()", False),
        ("cudaStreamWaitEvent", False),
        ("ncclAllReduce", False),
        ("MPI_Allreduce", False),
        ("std::__throw_length_error(char const*)", False),
    ],
)
def test_a_symbol_is_asked_of_tensorflow_by_its_namespace(demangled, tensorflows) -> None:
    """TensorFlow's namespaces (absl and protobuf come inside its wheel) and its C API; not
    Horovod's own namespace horovod::tensorflow, nor CUDA, NCCL, MPI or the C++ library."""
    assert check.is_tensorflows(demangled) is tensorflows


def test_the_header_wheels_follow_tensorflows_cuda_extra(tmp_path) -> None:
    """The CUDA runtime, nvcc and NCCL requirements of TensorFlow's `and-cuda` extra, as its
    wheel's METADATA writes them (2.21's ranges; 2.15 pins exact versions)."""
    meta = tmp_path / "tensorflow-2.21.0.dist-info" / "METADATA"
    meta.parent.mkdir()
    meta.write_text(
        'Requires-Dist: nvidia-cublas-cu12<13.0,>=12.5.3.2; extra == "and-cuda"\n'
        'Requires-Dist: nvidia-cuda-nvcc-cu12<13.0,>=12.5.82; extra == "and-cuda"\n'
        'Requires-Dist: nvidia-cuda-runtime-cu12<13.0,>=12.5.82; extra == "and-cuda"\n'
        'Requires-Dist: nvidia-nccl-cu12==2.16.5; extra == "and-cuda"\n'
        "Requires-Dist: numpy>=1.26.0\n"
    )
    assert check.cuda_specs(tmp_path) == [
        "nvidia-cuda-runtime-cu12<13.0,>=12.5.82",
        "nvidia-cuda-nvcc-cu12<13.0,>=12.5.82",
        "nvidia-nccl-cu12==2.16.5",
    ]


def test_the_header_wheels_follow_the_extra_as_tensorflow_2_19_writes_it(tmp_path) -> None:
    """2.19's METADATA puts a space before the version and single quotes round the extra (the
    check stopped on it with a KeyError before it read this form)."""
    meta = tmp_path / "tensorflow-2.19.1.dist-info" / "METADATA"
    meta.parent.mkdir()
    meta.write_text(
        "Requires-Dist: nvidia-cuda-nvcc-cu12 ==12.5.82 ; extra == 'and-cuda'\n"
        "Requires-Dist: nvidia-cuda-runtime-cu12 ==12.5.82 ; extra == 'and-cuda'\n"
        "Requires-Dist: nvidia-nccl-cu12 ==2.23.4 ; extra == 'and-cuda'\n"
    )
    assert check.cuda_specs(tmp_path) == [
        "nvidia-cuda-runtime-cu12==12.5.82",
        "nvidia-cuda-nvcc-cu12==12.5.82",
        "nvidia-nccl-cu12==2.23.4",
    ]


def _sdist_or_skip() -> str:
    cache = os.environ.get("HVD_TRAIN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hvd_train"
    )
    path = os.path.join(cache, "horovod-sdist", "horovod-0.28.1.tar.gz")
    if not os.path.isfile(path):
        pytest.skip(f"no {path}: scripts/install.sh keeps Horovod's sdist there when it builds it")
    return path


@pytest.mark.parametrize(("stack", "xla_ops"), [("2.21", False), ("2.18", True)])
def test_the_check_compiles_what_a_cuda_build_compiles(tmp_path, stack, xla_ops) -> None:
    """The sources of the stack's patched CMake lists for CUDA, NCCL, MPI and Gloo: the GPU
    operations, 0013's shared-memory all-reduce and mpi_ops.cc; xla_mpi_ops.cc only where
    0011 leaves it in; never another backend's (oneCCL, ROCm, DDL)."""
    with tarfile.open(_sdist_or_skip()) as tar:
        tar.extractall(tmp_path, filter="data")
    source = tmp_path / "horovod-0.28.1"
    env = {**os.environ, "HVD_TRAIN_TF": stack}
    script = str(ROOT / "scripts" / "horovod_series.sh")
    subprocess.run(["bash", script, "apply", str(source)], env=env, check=True,
                   capture_output=True)  # fmt: skip
    names = [p.name for p in check.sources(source)]
    for name in ("nccl_operations.cc", "cuda_operations.cc", "gpu_operations.cc",
                 "shm_operations.cc", "gloo_controller.cc", "mpi_controller.cc", "mpi_ops.cc"):  # fmt: skip
        assert name in names
    assert ("xla_mpi_ops.cc" in names) is xla_ops
    assert not {"ccl_operations.cc", "hip_operations.cc", "ddl_operations.cc"} & set(names)
    assert len(names) == len(set(names))


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_runs_a_list_of_stacks_with_the_machines_python_first_on_path() -> None:
    """`HVD_TRAIN_TF=2.19,2.18 make gpu-build-check` names no one venv: the Makefile must not
    put `/bin` first on PATH then (it did: `$(abspath )/bin`), or the check ran under the
    distribution's Python (Debian's 3.11.2, whose tarfile has no `filter`) and failed."""
    env = {**os.environ, "HVD_TRAIN_TF": "2.19,2.18"}
    out = subprocess.run(
        ["make", "-s", "-f", "Makefile", "-f", "-", "print-path"],
        input="print-path:\n\t@echo $$PATH\n", cwd=ROOT, env=env, text=True,
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    assert out.split(":")[0] != "/bin", out
    assert out.strip() == os.environ["PATH"], out
