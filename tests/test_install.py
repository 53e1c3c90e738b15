"""scripts/stack.sh and scripts/install.sh: each stack and Python gets its own virtualenv, and a
Python the stack's TensorFlow has no wheels for is refused in one line before anything is
installed. The Pythons are stand-ins (a script that answers a version), so no other Python need
be on the machine."""

from __future__ import annotations

import os
import pathlib
import subprocess

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
