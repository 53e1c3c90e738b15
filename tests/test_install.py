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


def write_script(path: pathlib.Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def cuda_toolkit(root: pathlib.Path, release: str, nccl: str | None = "2.21.5") -> pathlib.Path:
    """A stand-in CUDA toolkit at `root`: bin/nvcc answering `--version` as `release`'s does,
    and NCCL's header in include/ (none when `nccl` is None), as in NVIDIA's devel images."""
    write_script(
        root / "bin" / "nvcc",
        f"echo 'nvcc: NVIDIA (R) Cuda compiler driver'\necho '{NVCC_SAYS[release]}'\n",
    )
    if nccl:
        nccl_header(root / "include", nccl)
    return root


def nccl_header(include: pathlib.Path, version: str) -> None:
    major, minor, patch = version.split(".")
    include.mkdir(parents=True, exist_ok=True)
    (include / "nccl.h").write_text(
        f"#define NCCL_MAJOR {major}\n#define NCCL_MINOR {minor}\n#define NCCL_PATCH {patch}\n"
        '#define NCCL_SUFFIX ""\n'
    )


def gpu_host(tmp_path: pathlib.Path, *on_path: pathlib.Path) -> dict[str, str]:
    """The environment of a host whose nvidia-smi lists an H100, with only `on_path` (and the
    system's /usr/bin:/bin) on PATH, no toolkit in the standard places, and a Python that
    cannot download (guarded_python)."""
    smi = tmp_path / "smi"
    write_script(smi / "nvidia-smi", "echo 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5d4e)'\n")
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
        "[install] error: Horovod's GPU build needs NCCL's header (nccl.h) and found none: "
        "install NCCL 2 for CUDA 12 (libnccl-dev from NVIDIA's CUDA repository; the nvidia/cuda "
        "devel images have it) or set HOROVOD_NCCL_HOME to an NCCL, or set HVD_TRAIN_DEVICE=cpu "
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
        f"HOROVOD_CUDA_HOME={cuda}", "HOROVOD_GPU_OPERATIONS=NCCL",
        f"HOROVOD_NCCL_INCLUDE={cuda}/include", "HOROVOD_WITHOUT_MXNET=1",
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
