"""Launching real jobs from tests: horovodrun with Gloo on localhost, bounded by a timeout.

On failure or timeout the assertion carries every rank's output, as horovodrun printed it.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(sys.executable).parent
PYTHON = sys.executable
WORKERS = ROOT / "tests" / "workers"
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


def run(
    cmd: list[str], cwd: pathlib.Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Runs `cmd` in its own process group; kills the whole group if it outlives `timeout`."""
    return finish(start(cmd, cwd, env), timeout)


def horovodrun(np: int, command: list[str], cwd: pathlib.Path, timeout: float = 300):
    """`horovodrun -np N -H localhost:N --gloo COMMAND`, as Horovod's own CI runs its tests."""
    cmd = [str(BIN / "horovodrun"), "-np", str(np), "-H", f"localhost:{np}", "--gloo", *command]
    return run(cmd, cwd, timeout)


def check(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """Raises with the job's whole output unless it exited 0."""
    if proc.returncode != 0:
        raise AssertionError(
            f"exit code {proc.returncode}: {' '.join(map(str, proc.args))}\n"
            f"--- stdout\n{proc.stdout[-8000:]}\n--- stderr\n{proc.stderr[-8000:]}"
        )
    return proc


def start(cmd: list[str], cwd: pathlib.Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Starts `cmd` in the background, in its own process group, output captured; `env` is
    added to the test's environment."""
    full = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}  # fmt: skip
    return subprocess.Popen(
        cmd, cwd=cwd, env=full, text=True, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def finish(proc: subprocess.Popen, timeout: float) -> subprocess.CompletedProcess:
    """Waits for a `start`ed job; kills its process group if it outlives `timeout`."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(
            f"timed out after {timeout} s: {' '.join(map(str, proc.args))}\n"
            f"--- stdout\n{out}\n--- stderr\n{err}"
        ) from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# What TensorFlow prints as it is imported, whatever TF_CPP_MIN_LOG_LEVEL says (the last two at
# TF_CPP_MIN_LOG_LEVEL=0): kept off every command's console (hvd_train/logs.py).
TENSORFLOW_START_UP = (
    "All log messages before absl::InitializeLog()",
    "oneDNN custom operations are on",
    "cpu_feature_guard",
    "rebuild TensorFlow with the appropriate compiler flags",
)


def start_up_lines(output: str) -> list[str]:
    """The lines of `output` that are TensorFlow's start-up lines."""
    return [ln for ln in output.splitlines() if any(s in ln for s in TENSORFLOW_START_UP)]


def workers(marker: str) -> dict[int, int]:
    """{rank: pid} of the live training processes whose command line holds `marker`."""
    found = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = "hvd_train" in cmdline or str(WORKERS) in cmdline  # the trainer, or a test's
        if marker not in cmdline or not ours or "horovodrun" in cmdline:
            continue
        for item in environ:  # horovodrun (Gloo) or mpirun
            if item.startswith((b"HOROVOD_RANK=", b"OMPI_COMM_WORLD_RANK=")):
                found[int(item.split(b"=", 1)[1])] = int(entry.name)
    return found
