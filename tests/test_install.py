"""scripts/stack.sh and scripts/install.sh: each stack and Python gets its own virtualenv, and a
Python the stack's TensorFlow has no wheels for is refused in one line before anything is
installed. The Pythons are stand-ins (a script that answers a version), so no other Python need
be on the machine."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest
from harness import ROOT

pytestmark = pytest.mark.stack  # what a stack on a new Python meets first


def fake_python(tmp_path: pathlib.Path, minor: str) -> str:
    """A `python` that answers `minor` to the install's question (its version, 3.13)."""
    path = tmp_path / f"python{minor}"
    path.write_text(f"#!/bin/sh\necho {minor}\n")
    path.chmod(0o755)
    return str(path)


def run_script(script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("VENV", "PYTHON", "HVD_TRAIN_TF")}
    return subprocess.run(["bash", str(ROOT / "scripts" / script), *args], env={**clean, **env},
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.mark.parametrize(
    ("stack", "minor", "venv"),
    [("2.21", "3.11", ".venv"), ("2.21", "3.13", ".venv-py3.13"),
     ("2.15", "3.11", ".venv-tf2.15"), ("2.20", "3.12", ".venv-tf2.20-py3.12")],
)  # fmt: skip
def test_each_stack_and_python_has_its_own_virtualenv(tmp_path, stack, minor, venv) -> None:
    proc = run_script("stack.sh", "venv", HVD_TRAIN_TF=stack, PYTHON=fake_python(tmp_path, minor))
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, venv + "\n", "")


@pytest.mark.parametrize(
    ("stack", "tensorflow", "minor", "wheels"),
    [("2.15", "2.15.1", "3.12", "3.10, 3.11"), ("2.19", "2.19.1", "3.13", "3.10, 3.11, 3.12"),
     ("2.21", "2.21.0", "3.14", "3.10, 3.11, 3.12, 3.13")],
)  # fmt: skip
def test_a_python_without_tensorflow_wheels_is_refused_in_one_line(
    tmp_path, stack, tensorflow, minor, wheels
) -> None:
    python = fake_python(tmp_path, minor)
    proc = run_script("install.sh", HVD_TRAIN_TF=stack, PYTHON=python)
    venv = ROOT / run_script("stack.sh", "venv", HVD_TRAIN_TF=stack, PYTHON=python).stdout.strip()
    assert proc.returncode == 1 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        f"[install] error: Python {minor}: TensorFlow {tensorflow} has wheels for Python {wheels} "
        "only; set PYTHON=python3.11 (or another of those)"
    ]
    assert not venv.exists()


def test_a_virtualenv_of_another_python_is_refused_in_one_line(tmp_path) -> None:
    """A virtualenv made with one Python, asked for with another (a .venv made with
    PYTHON=python3.12 before each Python had its own): refused, left as it was."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(fake_python(tmp_path, "3.12"))
    (venv / ".hvd_train-stack").write_text("2.21\n")
    proc = run_script("install.sh", VENV=str(venv), PYTHON=fake_python(tmp_path, "3.11"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        f"[install] error: {venv} holds Python 3.12, not {tmp_path}/python3.11 (3.11): remove "
        f"{venv}, or set PYTHON to a Python 3.12"
    ]
    assert sorted(p.name for p in venv.iterdir()) == [".hvd_train-stack", "bin"]


def test_a_python_that_does_not_run_is_refused_in_one_line(tmp_path) -> None:
    """PYTHON naming nothing (pyenv's python3.13 outside its version): refused, not the
    virtualenv of python3's version instead."""
    proc = run_script("install.sh", PYTHON=str(tmp_path / "python3.13"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        f"[install] error: no Python at '{tmp_path}/python3.13': set PYTHON to a Python 3.10, "
        "3.11, 3.12, 3.13"
    ]


# --- the GPU install: the toolkit found before any download (issue 60) ---

NVCC_SAYS = {
    "12.4": "Cuda compilation tools, release 12.4, V12.4.131",
    "13.0": "Cuda compilation tools, release 13.0, V13.0.88",
}
# What each nvcc compiles for (`nvcc --list-gpu-arch`, its compute_NN lines) and the newest GCC
# it accepts as host compiler (its crt/host_config.h), from NVIDIA's release notes.
NVCC_ARCHS = {
    "12.4": "50 52 53 60 61 62 70 72 75 80 86 87 89 90",
    "13.0": "75 80 86 87 88 89 90 100 103 110 120 121",
}
NVCC_NEWEST_GCC = {"12.4": 13, "13.0": 15}


def write_script(path: pathlib.Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def cuda_toolkit(
    root: pathlib.Path, release: str, nccl: str | None = "2.21.5", nccl_lib: bool = True
) -> pathlib.Path:
    """A stand-in CUDA toolkit at `root`, as in NVIDIA's devel images: bin/nvcc answering
    `--version` and `--list-gpu-arch` as `release`'s does, and compiling with `-ccbin` only a
    host compiler whose GCC it accepts (the real one's #error line otherwise); NCCL's header in
    include/ (none when `nccl` is None) and its library in lib64/ (none without `nccl_lib`)."""
    write_script(root / "bin" / "nvcc", f"""case "$1" in
  --list-gpu-arch) for arch in {NVCC_ARCHS[release]}; do echo "compute_$arch"; done ;;
  -ccbin)
    gcc=$("$2" -dumpfullversion)
    if [ "${{gcc%%.*}}" -gt {NVCC_NEWEST_GCC[release]} ]; then
      echo "{root}/targets/x86_64-linux/include/crt/host_config.h:143:2: error: #error -- unsupported GNU version! gcc versions later than {NVCC_NEWEST_GCC[release]} are not supported! The nvcc flag '-allow-unsupported-compiler' can be used to override this version check; however, using an unsupported host compiler may cause compilation failure or incorrect runtime execution. Use at your own risk." >&2
      exit 1
    fi ;;
  *) echo 'nvcc: NVIDIA (R) Cuda compiler driver'; echo '{NVCC_SAYS[release]}' ;;
esac
""")  # fmt: skip
    if nccl:
        nccl_header(root / "include", nccl)
        if nccl_lib:
            (root / "lib64").mkdir(parents=True, exist_ok=True)
            (root / "lib64" / "libnccl.so").write_text("")
    return root


def nccl_header(include: pathlib.Path, version: str) -> None:
    major, minor, patch = version.split(".")
    include.mkdir(parents=True, exist_ok=True)
    (include / "nccl.h").write_text(
        f"#define NCCL_MAJOR {major}\n#define NCCL_MINOR {minor}\n#define NCCL_PATCH {patch}\n"
        '#define NCCL_SUFFIX ""\n'
    )


def gpu_host(tmp_path: pathlib.Path, *on_path: pathlib.Path, cc: str = "9.0") -> dict[str, str]:
    """The environment of a host whose nvidia-smi lists an H100 (a GPU of compute capability
    `cc`), with only `on_path` (and the system's /usr/bin:/bin) on PATH, no toolkit in the
    standard places, and a Python that cannot download (guarded_python)."""
    smi = tmp_path / "smi"
    write_script(smi / "nvidia-smi", f"""case "$*" in
  *--query-gpu=compute_cap*) echo '{cc}' ;;
  *) echo 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5d4e)' ;;
esac
""")  # fmt: skip
    path = ":".join([str(smi), *(str(p) for p in on_path), "/usr/bin", "/bin"])
    return {"PATH": path, "HVD_TRAIN_CUDA_DIRS": str(tmp_path / "no-cuda*"),
            "PYTHON": guarded_python(tmp_path), "VENV": str(tmp_path / "venv")}  # fmt: skip


def run_install(*args: str, **env: str) -> subprocess.CompletedProcess:
    """scripts/install.sh with only `env` from the test (no HOROVOD_* or CUDA_HOME leaking in)."""
    keep = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "TMPDIR")}
    return subprocess.run(["bash", str(ROOT / "scripts" / "install.sh"), *args],
                          env={**keep, **env}, capture_output=True, text=True, timeout=120)  # fmt: skip


def guarded_python(tmp_path: pathlib.Path) -> str:
    """A `python` for the install that answers its version question (3.11) and its machine
    question (this Python's answer), and records and refuses everything else, in
    python-calls.txt: the install downloads only through Python (`-m venv`, `-m pip`)."""
    write_script(tmp_path / "guard" / "python3.11", f"""echo "$*" >> {tmp_path}/python-calls.txt
case "$*" in
  *sys.version_info*) echo 3.11 ;;
  *sys.implementation.cache_tag*) exec {sys.executable} "$@" ;;
  *) exit 1 ;;
esac
""")  # fmt: skip
    return str(tmp_path / "guard" / "python3.11")


@pytest.mark.parametrize("nvcc", ["absent", "13.0"])
def test_a_gpu_host_without_cuda_12_is_refused_in_one_line_before_any_download(
    tmp_path, nvcc
) -> None:
    """On a host whose nvidia-smi lists a GPU, with no nvcc or CUDA 13's, the install stops in
    one line naming CUDA 12 and every place it looked, exit 1, before Python is asked to make a
    virtualenv or run pip (issue 60: it downloaded TensorFlow's CUDA wheels, about 2 GB, then
    failed building Horovod with a line that named neither nvcc nor CUDA)."""
    toolkit = [] if nvcc == "absent" else [cuda_toolkit(tmp_path / "cuda-13.0", nvcc) / "bin"]
    proc = run_install(**gpu_host(tmp_path, *toolkit))
    on_path = (
        "nvcc on PATH (none)"
        if nvcc == "absent"
        else f"nvcc on PATH: {tmp_path}/cuda-13.0/bin/nvcc (CUDA 13.0.88)"
    )
    assert (proc.returncode, proc.stdout) == (1, ""), proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        "[install] error: Horovod's GPU build needs a CUDA 12 toolkit (nvcc 12.x: TensorFlow "
        "2.21.0 is built against CUDA 12) and found none: install CUDA 12's toolkit (NVIDIA's "
        "cuda-toolkit-12-x package) and set HOROVOD_CUDA_HOME to it, or set HVD_TRAIN_DEVICE=cpu "
        f"for the CPU build; looked at CUDA_HOME (unset); {on_path}; {tmp_path}/no-cuda* (none)"
    ]
    asked = (tmp_path / "python-calls.txt").read_text().splitlines()
    assert asked and all("sys.version_info" in call for call in asked), asked
    assert not (tmp_path / "venv").exists()


def test_horovod_cuda_home_is_the_one_toolkit_looked_at(tmp_path) -> None:
    """Set, HOROVOD_CUDA_HOME is what Horovod's CMake compiles with: CUDA 13 there is refused
    even with a CUDA 12 nvcc on PATH, and the line says where it looked."""
    cuda12 = cuda_toolkit(tmp_path / "cuda-12.4", "12.4")
    cuda13 = cuda_toolkit(tmp_path / "cuda-13.0", "13.0")
    env = gpu_host(tmp_path, cuda12 / "bin")
    proc = run_install("--check-gpu-toolkit", **env, HOROVOD_CUDA_HOME=str(cuda13))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.splitlines()[0].endswith(
        f"; looked at HOROVOD_CUDA_HOME: {cuda13}/bin/nvcc (CUDA 13.0.88)"
    ), proc.stderr
    assert len(proc.stderr.splitlines()) == 1


def test_no_nccl_header_is_refused_in_one_line(tmp_path) -> None:
    """A CUDA 12 toolkit and no nccl.h anywhere the install looks: one line naming NCCL for
    CUDA 12 and each place, exit 1."""
    cuda = cuda_toolkit(tmp_path / "cuda-12.4", "12.4", nccl=None)
    proc = run_install("--check-gpu-toolkit", **gpu_host(tmp_path, cuda / "bin"))
    assert (proc.returncode, proc.stdout) == (1, ""), proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        "[install] error: Horovod's GPU build needs NCCL's header (nccl.h) and its library and "
        "found none: install NCCL 2 for CUDA 12 (libnccl2 and libnccl-dev from NVIDIA's CUDA "
        "repository; the nvidia/cuda devel images have them) or set HOROVOD_NCCL_HOME to an NCCL, or set HVD_TRAIN_DEVICE=cpu "
        "for the CPU build; looked at HOROVOD_NCCL_HOME (unset); HOROVOD_NCCL_INCLUDE (unset); the "
        f"CUDA toolkit: {cuda}/include/nccl.h (none); the system: /usr/include/nccl.h (none); "
        f"the nvidia-nccl-cu12 wheel in {tmp_path}/venv (none)"
    ]


def check_gpu_toolkit(tmp_path, *on_path: pathlib.Path, **env: str) -> tuple[list[str], list[str]]:
    """`install.sh --check-gpu-toolkit` on a GPU host: (the HOROVOD_* variables Horovod's
    build gets, the lines its wheel's cache key is made of)."""
    proc = run_install("--check-gpu-toolkit", **{**gpu_host(tmp_path, *on_path), **env})
    assert proc.returncode == 0 and proc.stderr == "", proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    key_at = next(i for i, line in enumerate(lines) if line.startswith("wheel cache key "))
    return [v for v in lines[:key_at] if v.startswith("HOROVOD_")], lines[key_at + 1 :]


@pytest.mark.parametrize("where", ["PATH", "CUDA_HOME", "/usr/local/cuda*"])
def test_the_cuda_12_toolkit_found_goes_to_horovods_build_and_its_wheel_key(
    tmp_path, where
) -> None:
    """CUDA 12.4 on PATH, at CUDA_HOME, or among the standard toolkits (where a CUDA 13 nvcc
    on PATH comes first and is passed over), with NCCL 2.21.5 in its include/: Horovod's build
    gets that toolkit and NCCL with its GPU operations, and the wheel's cache key their versions."""
    cuda = cuda_toolkit(tmp_path / "toolkits" / "cuda-12.4", "12.4")
    env: dict[str, str] = {}
    on_path = [cuda / "bin"] if where == "PATH" else []
    if where == "CUDA_HOME":
        env["CUDA_HOME"] = str(cuda)
    if where == "/usr/local/cuda*":
        on_path = [cuda_toolkit(tmp_path / "cuda-13.0", "13.0") / "bin"]
        env["HVD_TRAIN_CUDA_DIRS"] = str(tmp_path / "toolkits" / "cuda*")
    exported, key = check_gpu_toolkit(tmp_path, *on_path, **env)
    assert exported == [
        "HOROVOD_BUILD_CUDA_CC_LIST=90", f"HOROVOD_CUDA_HOME={cuda}",
        "HOROVOD_GPU_OPERATIONS=NCCL", f"HOROVOD_NCCL_INCLUDE={cuda}/include",
        f"HOROVOD_NCCL_LIB={cuda}/lib64", "HOROVOD_WITHOUT_MXNET=1",
        "HOROVOD_WITHOUT_PYTORCH=1", "HOROVOD_WITH_GLOO=1", "HOROVOD_WITH_MPI=1",
        "HOROVOD_WITH_TENSORFLOW=1",
    ]  # fmt: skip
    assert key[0].endswith(" tensorflow==2.21.0 device=gpu"), key
    assert key[-1] == "cuda=12.4.131 nccl=2.21.5", key


def test_another_nccl_is_another_wheel(tmp_path) -> None:
    """A Horovod compiled against one NCCL is not installed for another: HOROVOD_NCCL_HOME
    (kept as given) with NCCL 2.23.4 changes the key, which its path alone would not."""
    cuda = cuda_toolkit(tmp_path / "cuda-12.4", "12.4")
    nccl_header(tmp_path / "nccl" / "include", "2.23.4")
    (tmp_path / "nccl" / "lib").mkdir()
    (tmp_path / "nccl" / "lib" / "libnccl.so.2").write_text("")
    _, with_cudas = check_gpu_toolkit(tmp_path, cuda / "bin")
    exported, with_own = check_gpu_toolkit(
        tmp_path, cuda / "bin", HOROVOD_NCCL_HOME=str(tmp_path / "nccl")
    )
    assert f"HOROVOD_NCCL_HOME={tmp_path}/nccl" in exported
    assert (with_cudas[-1], with_own[-1]) == (
        "cuda=12.4.131 nccl=2.21.5",
        "cuda=12.4.131 nccl=2.23.4",
    )
    assert with_cudas[:-1] == with_own[:-1]  # NCCL's paths are not in the key; its version is


def test_the_build_runs_the_toolkit_found_whatever_nvcc_comes_first(tmp_path) -> None:
    """CUDA 13's nvcc first on PATH (conda's or a newer toolkit's) and CUDA 12.4 among the
    standard toolkits: Horovod's build runs with 12.4's bin first on PATH, so its setup takes
    the -gencode list from the nvcc CMake compiles with (with 13's, the build died on an
    architecture CUDA 12.4 does not know)."""
    cuda13 = cuda_toolkit(tmp_path / "cuda-13.0", "13.0")
    cuda12 = cuda_toolkit(tmp_path / "toolkits" / "cuda-12.4", "12.4")
    env = {**gpu_host(tmp_path, cuda13 / "bin"), "HVD_TRAIN_CUDA_DIRS": str(cuda12)}
    proc = run_install("--check-gpu-toolkit", **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"nvcc for Horovod's build: {cuda12}/bin/nvcc" in proc.stdout.splitlines()


@pytest.mark.parametrize(
    ("cc", "archs", "expected"),
    [("9.0", None, "90"),  # an H100: its own architecture alone
     ("8.0\n9.0\n9.0", None, "80,90"),  # A100s and H100s, each once
     ("9.0", "80;86;89;90", "80,86,89,90"),  # the override wins over the GPUs here
     ("", None, "80,86,89,90"),  # none visible (a `docker build`): the default
     ("10.0", None, "90")],  # a B200, newer than CUDA 12.4: 90's PTX, compiled by the driver
)  # fmt: skip
def test_horovods_kernels_are_built_for_the_gpus_here_or_as_told(
    tmp_path, cc, archs, expected
) -> None:
    """HOROVOD_BUILD_CUDA_CC_LIST comes from the compute capabilities nvidia-smi reports, else
    HVD_TRAIN_CUDA_ARCHS, else 80;86;89;90; left to itself Horovod compiles every architecture
    its nvcc knows. An architecture newer than nvcc knows becomes its newest, said in a line."""
    cuda = cuda_toolkit(tmp_path / "cuda-12.4", "12.4")
    env = {**gpu_host(tmp_path, cuda / "bin", cc=cc)}
    if archs:
        env["HVD_TRAIN_CUDA_ARCHS"] = archs
    proc = run_install("--check-gpu-toolkit", **env)
    assert proc.returncode == 0 and proc.stderr == "", proc.stdout + proc.stderr
    assert f"HOROVOD_BUILD_CUDA_CC_LIST={expected}" in proc.stdout.splitlines()
    jit = [line for line in proc.stdout.splitlines() if "driver compiles at first use" in line]
    assert jit == (
        ["[install] gpu: compute capability 100 is newer than nvcc 12.4.131 compiles for: "
         "Horovod's kernels are built as 90's PTX, which the driver compiles at first use"]
        if cc == "10.0" else []
    ), proc.stdout  # fmt: skip


@pytest.mark.parametrize(
    ("archs", "why"),
    [("8.0;9.0", "HVD_TRAIN_CUDA_ARCHS='8.0;9.0': expected compute capabilities without the "
      "dot, separated by ';' (80;86;89;90: an A100, A10, L4 and H100)"),
     ("35;90", "compute capability 35 (HVD_TRAIN_CUDA_ARCHS): nvcc 12.4.131 compiles for 50, "
      "52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90 only")],
)  # fmt: skip
def test_architectures_nvcc_cannot_build_are_refused_in_one_line(tmp_path, archs, why) -> None:
    """A malformed HVD_TRAIN_CUDA_ARCHS, or an architecture older than the toolkit builds:
    one line, exit 2, before any download."""
    cuda = cuda_toolkit(tmp_path / "cuda-12.4", "12.4")
    env = {**gpu_host(tmp_path, cuda / "bin"), "HVD_TRAIN_CUDA_ARCHS": archs}
    proc = run_install(**env)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [f"[install] error: {why}"]
    assert not (tmp_path / "venv").exists()


def test_a_host_compiler_nvcc_refuses_is_named_in_one_line_before_any_download(tmp_path) -> None:
    """GCC 14 as the host compiler (CXX, which Horovod's CMake makes CUDA's host compiler too)
    and CUDA 12.4, which takes GCC 13 at most: nvcc's own reason in one line, exit 2, before
    TensorFlow's 2 GB of CUDA wheels are downloaded."""
    cuda = cuda_toolkit(tmp_path / "cuda-12.4", "12.4")
    gcc14 = tmp_path / "gcc-14" / "g++-14"
    write_script(gcc14, "echo 14.2.0\n")
    proc = run_install(**gpu_host(tmp_path, cuda / "bin"), CXX=str(gcc14))
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        f"[install] error: nvcc 12.4.131 does not accept the host compiler {gcc14} (14.2.0): "
        "unsupported GNU version! gcc versions later than 13 are not supported!; install a "
        "compiler it supports and set CXX to it (CXX=g++-12), or set HVD_TRAIN_DEVICE=cpu for "
        "the CPU build"
    ]
    asked = (tmp_path / "python-calls.txt").read_text().splitlines()
    assert all("sys.version_info" in call for call in asked), asked


def test_an_nccl_header_without_its_library_is_passed_over(tmp_path) -> None:
    """nccl.h in the toolkit without libnccl (libnccl-dev's header left by a removed libnccl2):
    not taken, since the build would find the header and then fail to link; the line says what
    was missing where."""
    cuda = cuda_toolkit(tmp_path / "cuda-12.4", "12.4", nccl_lib=False)
    proc = run_install("--check-gpu-toolkit", **gpu_host(tmp_path, cuda / "bin"))
    assert (proc.returncode, proc.stdout) == (1, ""), proc.stdout + proc.stderr
    [line] = proc.stderr.splitlines()
    assert (
        f"the CUDA toolkit: {cuda}/include/nccl.h (NCCL 2.21.5, no libnccl_static.a or "
        f"libnccl.so in {cuda}/lib64 {cuda}/lib);"
    ) in line, line


@pytest.mark.processes
def test_the_cpu_install_on_a_gpu_host_needs_no_toolkit_and_keeps_its_wheel_key(tmp_path) -> None:
    """HVD_TRAIN_DEVICE=cpu on a host whose nvidia-smi lists a GPU, with no nvcc: the CPU
    build, and its wheel's cache key made of what it was before the GPU identity was added
    (so the CPU wheels already cached stay valid)."""
    proc = run_install("--check-gpu-toolkit", **gpu_host(tmp_path), HVD_TRAIN_DEVICE="cpu")
    assert proc.returncode == 0 and proc.stderr == "", proc.stdout + proc.stderr
    series = run_script("horovod_series.sh", "version").stdout.strip()
    machine = subprocess.run(
        [sys.executable, "-c", "import platform, sys, sysconfig; "
         "print(sys.implementation.cache_tag, sysconfig.get_platform(), platform.libc_ver())"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    switches = ["CMAKE_POLICY_VERSION_MINIMUM=3.5", "HOROVOD_WITHOUT_MXNET=1",
                "HOROVOD_WITHOUT_PYTORCH=1", "HOROVOD_WITH_GLOO=1", "HOROVOD_WITH_MPI=1",
                "HOROVOD_WITH_TENSORFLOW=1"]  # fmt: skip
    lines = proc.stdout.splitlines()
    key_at = next(i for i, line in enumerate(lines) if line.startswith("wheel cache key "))
    assert lines[key_at + 1 :] == [
        f"horovod=={series} tensorflow-cpu==2.21.0 device=cpu",
        machine,
        *switches,
    ]


def test_a_cpu_tensorflow_left_on_a_gpu_host_is_uninstalled_before_the_cuda_one(tmp_path) -> None:
    """A virtualenv an earlier CPU install made holds tensorflow-cpu; on a GPU host (CUDA 12.4
    found) the install removes it, and the `tensorflow` its files share, before it installs
    tensorflow[and-cuda]. (Its Python is a stand-in that records each pip call; the install
    stops where the stand-in refuses to install.)"""
    cuda = cuda_toolkit(tmp_path / "cuda-12.4", "12.4")
    env = gpu_host(tmp_path, cuda / "bin")
    venv = pathlib.Path(env["VENV"])
    calls = tmp_path / "pip-calls.txt"
    # A virtualenv's python: Python 3.11, tensorflow-cpu alone installed, pip that uninstalls
    # and refuses to install.
    write_script(venv / "bin" / "python", f"""case "$1" in
  -c) case "$2" in *sys.version_info*) echo 3.11 ;; esac ;;
  -) shift; for spec in "$@"; do [ "$spec" = tensorflow-cpu ] || exit 1; done ;;
  -m) echo "$*" >> {calls}; [ "$3" = uninstall ] ;;
esac
""")  # fmt: skip
    (venv / ".hvd_train-stack").write_text("2.21\n")
    proc = run_install(**env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (
        "[install] replacing tensorflow-cpu with tensorflow[and-cuda]==2.21.0 (a GPU host)"
        in proc.stdout
    )
    pip = calls.read_text().splitlines()
    assert pip[:2] == [
        "-m pip uninstall -q -y tensorflow-cpu tensorflow",
        "-m pip install -q tensorflow[and-cuda]==2.21.0 numpy>=2.0,<3",
    ], pip


@pytest.mark.processes
def test_after_a_gpu_install_a_cpu_tensorflow_and_a_horovod_without_nccl_are_named(
    tmp_path,
) -> None:
    """The check after a GPU install, on this machine's virtualenv as a GPU host would leave it
    with a CPU TensorFlow and a Horovod built without NCCL: one line naming both, exit 1."""
    script = '. scripts/gpu_toolkit.sh; gpu_install_check "$1" 2 || { echo "$GPU_ERROR"; exit 1; }'
    proc = subprocess.run(["bash", "-c", script, "check", sys.executable], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        "after the GPU install, TensorFlow lists 0 of the 2 GPUs nvidia-smi lists (its build's "
        "CUDA: none; `hvd-train doctor` says which library did not load), and Horovod was built "
        "without NCCL (horovod.tensorflow.nccl_built() is false)"
    ]


@pytest.mark.processes
def test_a_driver_too_old_for_cuda_12_is_named_after_the_install_with_its_floor(tmp_path) -> None:
    """TensorFlow lists both GPUs, but its first op fails (a driver of CUDA 11's age, which
    listing alone passed): one line with the ops' reason, the driver found and CUDA 12's floor,
    exit 1. The virtualenv's python is a stand-in giving what the check's script prints on
    such a host; nvidia-smi a stand-in for the driver's version."""
    python = tmp_path / "venv" / "bin" / "python"
    write_script(python, """cat > /dev/null
echo 'hvd-check 2 1 12.5.1 0'
echo 'hvd-check-failure GPU 0: InternalError: cudaGetDevice() failed. Status: CUDA driver version is insufficient for CUDA runtime version'
""")  # fmt: skip
    write_script(tmp_path / "smi" / "nvidia-smi", "echo 470.256.02\necho 470.256.02\n")
    script = '. scripts/gpu_toolkit.sh; gpu_install_check "$1" 2 || { echo "$GPU_ERROR"; exit 1; }'
    proc = subprocess.run(["bash", "-c", script, "check", str(python)], cwd=ROOT,
                          env={"PATH": f"{tmp_path / 'smi'}:/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        "after the GPU install, a matmul and a convolution ran on 0 of TensorFlow's 2 GPUs (GPU "
        "0: InternalError: cudaGetDevice() failed. Status: CUDA driver version is insufficient "
        "for CUDA runtime version); driver 470.256.02 found, TensorFlow's CUDA 12.5.1 needs "
        "525.60.13 or newer, and a GPU newer than its machine code (sm_90) a driver that can "
        "compile its PTX"
    ]


@pytest.mark.parametrize(
    ("listing", "shown"),
    [(["GPU 0: H100 (UUID: GPU-a)", "GPU 1: H100 (UUID: GPU-b)"], 2),
     ([f"GPU {i}: A100 (UUID: GPU-{i})\n  MIG 3g.20gb Device 0: (UUID: MIG-{i})"
       for i in range(8)], 1),  # every GPU split: CUDA shows a process one instance
     (["GPU 0: A100 (UUID: GPU-a)", "  MIG 1g.5gb Device 0: (UUID: MIG-a)",
       "  MIG 1g.5gb Device 1: (UUID: MIG-b)", "GPU 1: A100 (UUID: GPU-c)"], 2)],
)  # fmt: skip
def test_the_install_expects_the_gpus_cuda_will_show(listing, shown) -> None:
    """The GPUs the install expects TensorFlow to list, from `nvidia-smi -L`: each whole GPU,
    and one for all MIG instances. Counting `GPU ` lines, 8 split GPUs aborted the install with
    "TensorFlow lists 1 of 8"."""
    proc = subprocess.run(["bash", "-c", ". scripts/gpu_toolkit.sh; cuda_visible_gpus"], cwd=ROOT,
                          input="\n".join(listing) + "\n", capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert proc.stdout.strip() == str(shown), proc.stdout + proc.stderr


def test_the_gpu_smoke_test_refuses_a_host_without_a_gpu_in_one_line(tmp_path) -> None:
    """`make gpu-test` runs scripts/gpu_test.sh, which on a host with no nvidia-smi (none on
    this PATH) says so in one line, exit 2, before it installs anything."""
    assert re.search(
        r"^gpu-test:\n\tbash scripts/gpu_test\.sh$", (ROOT / "Makefile").read_text(), re.M
    )
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_test.sh")],
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        "[gpu-test] error: no GPU here (nvidia-smi is missing or lists none): make gpu-test "
        "needs a host with NVIDIA GPUs and a CUDA 12 toolkit"
    ]
