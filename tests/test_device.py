"""A worker's device (`runtime.device`): a GPU that nvidia-smi lists but TensorFlow cannot use
ends the job in one line, never a silent run on the CPU; the CPU chosen on purpose says so; and
a worker's share of the host's cores sizes TensorFlow's thread pools.

No GPU here: a stand-in `nvidia-smi` on PATH lists one, and this machine's TensorFlow (a CPU
build) sees none, as on a GPU host with a CPU wheel left from an earlier install.
"""

from __future__ import annotations

import json
import os
import pathlib
import shlex

import pytest
from harness import PYTHON, QUICKSTART, horovodrun

from hvd_train import cli
from hvd_train.base import device_choice
from hvd_train.base.errors import DeviceError


def fake_nvidia_smi(folder: pathlib.Path, gpus: int) -> None:
    """A stand-in `nvidia-smi` in `folder` whose `-L` lists `gpus` H100s, as the driver does."""
    folder.mkdir()
    script = folder / "nvidia-smi"
    lines = "".join(
        f"echo 'GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i}abc)'\n" for i in range(gpus)
    )
    script.write_text(f"#!/bin/sh\n{lines}")
    script.chmod(0o755)


@pytest.fixture
def gpu_host(tmp_path, monkeypatch) -> None:
    """nvidia-smi on PATH lists one GPU; CUDA_VISIBLE_DEVICES unset."""
    fake_nvidia_smi(tmp_path / "fake-bin", 1)
    monkeypatch.setenv("PATH", f"{tmp_path / 'fake-bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.mark.processes
@pytest.mark.multiworker
def test_a_gpu_tensorflow_cannot_use_fails_the_job_and_the_cpu_on_purpose_trains(
    tmp_path, gpu_host
) -> None:
    """The quickstart as a 1-worker job on a host whose nvidia-smi lists a GPU that TensorFlow
    does not see: one line on stderr that says why (a CPU-only build) and how to get out, exit
    code 2, summary.json `failed`, and no epoch trained. With `runtime.device=cpu` the same
    job trains on the CPU and its opening line says the user chose it."""
    base = [PYTHON, "-m", "hvd_train", "--config", str(QUICKSTART), "--set", "train.epochs=1",
            "--set", "logging.tensorboard=false"]  # fmt: skip
    run_dir = tmp_path / "gpu"
    proc = horovodrun(1, [*base, "--set", f"run.dir={run_dir}"], tmp_path, timeout=240)
    output = proc.stdout + proc.stderr
    assert proc.returncode == DeviceError.exit_code, output[-3000:]
    errors = [ln for ln in output.splitlines() if "hvd_train: error:" in ln]
    assert len(errors) == 1, output[-3000:]
    assert "runtime.device: auto: nvidia-smi lists 1 GPU(s) but TensorFlow " in errors[0]
    assert "a CPU-only build: tf.sysconfig.get_build_info() says is_cuda_build False" in errors[0]
    assert "set runtime.device: cpu to train on the CPU" in errors[0]
    assert "Traceback" not in output and "epoch 1/1" not in output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["error_type"]) == ("failed", "DeviceError"), summary
    assert summary["epochs_completed"] == 0 and "is_cuda_build False" in summary["error"]

    run_dir = tmp_path / "cpu"
    proc = horovodrun(1, [*base, "--set", f"run.dir={run_dir}", "--set", "runtime.device=cpu"],
                      tmp_path, timeout=240)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    plan = next(ln for ln in proc.stdout.splitlines() if "steps/epoch" in ln)
    assert "1 worker(s), gloo, cpu (runtime.device: cpu) | batch" in plan, plan
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["epochs_completed"]) == ("completed", 1), summary


# --------------------------------------------------------------------------- in one process


@pytest.fixture
def nvidia_smi(tmp_path, monkeypatch):
    """Puts first on PATH a stand-in nvidia-smi that lists the GPUs asked (0: none listed);
    CUDA_VISIBLE_DEVICES as it was after the test."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")

    def install(count: int) -> None:
        fake_nvidia_smi(tmp_path / f"bin-{count}", count)
        monkeypatch.setenv("PATH", f"{tmp_path / f'bin-{count}'}{os.pathsep}{os.environ['PATH']}")

    return install


def test_auto_needs_a_gpu_only_where_nvidia_smi_lists_one_and_gpu_always(nvidia_smi) -> None:
    pytest.importorskip("tensorflow")
    from hvd_train.runtime import device

    assert [device_choice.prepare(c, n) for c, n in [("auto", 0), ("auto", 2), ("gpu", 0)]] == [
        False, True, True,
    ]  # fmt: skip
    nvidia_smi(0)
    device.require("auto")  # a host without GPUs: nothing to hold TensorFlow to
    with pytest.raises(DeviceError, match=r"^runtime.device: gpu: a GPU was asked for but "):
        device.require("gpu")
    nvidia_smi(2)
    with pytest.raises(DeviceError, match=r"^runtime.device: auto: nvidia-smi lists 2 GPU\(s\) "):
        device.require("auto")


def test_cpu_hides_the_gpus_before_tensorflow_looks(nvidia_smi) -> None:
    """CUDA_VISIBLE_DEVICES=-1 before TensorFlow's import: neither it nor Horovod's CUDA
    libraries find a GPU; and nothing is required of TensorFlow."""
    pytest.importorskip("tensorflow")
    from hvd_train.runtime import device

    nvidia_smi(8)
    assert device_choice.prepare("cpu", 8) is False
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "-1"
    device.require("cpu")


def test_a_gpu_worker_keeps_the_drivers_jit_compiles_a_users_cache_size_wins(
    monkeypatch,
) -> None:
    """A worker that will train on a GPU sizes the driver's JIT cache before CUDA loads
    (TensorFlow 2.21 has PTX alone for GPUs newer than sm_90: every kernel is compiled at first
    use, and what the cache cannot hold is compiled again next run); a value already set is
    kept, and a CPU worker's environment is left alone."""
    monkeypatch.delenv("CUDA_CACHE_MAXSIZE", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    device_choice.prepare("cpu", 8)
    assert "CUDA_CACHE_MAXSIZE" not in os.environ
    device_choice.prepare("auto", 1)
    assert os.environ["CUDA_CACHE_MAXSIZE"] == str(4 * 1024**3)
    monkeypatch.setenv("CUDA_CACHE_MAXSIZE", "1073741824")
    device_choice.prepare("gpu", 0)
    assert os.environ["CUDA_CACHE_MAXSIZE"] == "1073741824"


def test_the_launcher_shapes_a_cpu_job_on_a_gpu_host_as_on_a_host_without_one(
    nvidia_smi, capsys
) -> None:
    """With runtime.device cpu the workers hide the host's GPUs, so `hvd-train launch` starts
    launch.cpu_workers by default and does not refuse more workers than GPUs."""
    nvidia_smi(1)

    def launch(*args: str) -> tuple[int, list[str]]:
        code = cli.main(["launch", "--config", str(QUICKSTART), "--print-command", *args])
        return code, shlex.split(capsys.readouterr().out)

    assert launch("--np", "2")[0] == 2  # two workers would pin the one GPU
    code, argv = launch("--np", "2", "--set", "runtime.device=cpu")
    assert code == 0 and argv[argv.index("-np") + 1] == "2"
    code, argv = launch("--set", "runtime.device=cpu")
    assert code == 0 and argv[argv.index("-np") + 1] == "2"  # launch.cpu_workers, not 1 GPU


def test_a_cuda_build_names_its_versions_and_the_libraries_that_did_not_load() -> None:
    asked: list[list[str]] = []

    def failures(names: list[str]) -> list[str]:
        asked.append(names)
        return [f"{names[2]}: cannot open shared object file: No such file or directory"]

    info = {"is_cuda_build": True, "cuda_version": "12.5.1", "cudnn_version": "9"}
    why = device_choice.build_problem(info, failures)
    assert asked == [["libcuda.so.1", "libcudart.so.12", "libcudnn.so.9"]]
    assert why == ("built for CUDA 12.5.1 and cuDNN 9; did not load: libcudnn.so.9: cannot open "
                   "shared object file: No such file or directory")  # fmt: skip
    assert "is_cuda_build False" in device_choice.build_problem({"is_cuda_build": False}, failures)


def test_a_library_that_does_not_load_is_reported_with_the_loaders_error() -> None:
    error = device_choice.load_error("libhvd_train_no_such_library.so.12")
    assert error is not None and "libhvd_train_no_such_library.so.12" in str(error)
    assert device_choice.load_error("libc.so.6") is None


def test_the_opening_line_says_when_the_cpu_was_chosen() -> None:
    assert device_choice.label("cpu", "cpu") == "cpu (runtime.device: cpu)"
    assert device_choice.label("auto", "cpu") == "cpu"
    assert device_choice.label("auto", "gpu") == "gpu"


@pytest.mark.parametrize(
    ("config", "cores", "workers", "bound", "gpu", "expected"),
    [
        ((0, 0), 64, 8, False, True, (8, 8)),  # 8 GPU workers on 64 cores: 8 each
        ((0, 0), 64, 8, False, False, (8, 2)),  # on CPU, two ops at once
        ((0, 0), 3, 8, False, True, (1, 1)),  # more workers than cores: at least 1
        ((0, 0), 16, 8, True, True, (16, 16)),  # bound: the affinity mask is its share already
        ((4, 3), 64, 8, False, True, (4, 3)),  # the config's own counts win
    ],
)  # fmt: skip
def test_thread_pools_are_the_workers_share_of_the_cores(
    config, cores, workers, bound, gpu, expected
) -> None:
    """Not every core of the host in each of its workers, GPU workers included."""
    pytest.importorskip("tensorflow")

    from hvd_train.runtime.distributed import core_share, thread_counts

    share = core_share(cores, workers, bound=bound)
    assert thread_counts(*config, share, gpu=gpu) == expected
