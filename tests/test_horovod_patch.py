"""scripts/patch_horovod.py, which install.sh applies to Horovod 0.28.1: horovodrun keeps a
stopped worker's exit code (unpatched, 34 of 100 stops here came back as exit code 0, so 20
stops that all keep their 143 would happen by chance about once in 4,000 runs), and it starts a
job without importing TensorFlow to check how Horovod was built; a job whose worker failed ends
in one line, with that worker's exit code."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import struct
import subprocess

import pytest
from harness import BIN, PYTHON, ROOT, WORKERS, check, run


def test_a_stopped_worker_keeps_its_exit_code() -> None:
    proc = subprocess.run([PYTHON, str(WORKERS / "stop_codes.py"), "20"], cwd=WORKERS,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == [143] * 20


def test_the_patch_is_applied_and_applies_once() -> None:
    patch = [PYTHON, str(ROOT / "scripts" / "patch_horovod.py")]
    proc = subprocess.run(patch, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")  # already patched
    # Each patched file's bytecode is its own (written by the patch): no process compiles it.
    for module in {patch.module for patch in PATCHER.PATCHES}:
        path = PATCHER._module_file(module)  # found without importing it
        header = pathlib.Path(importlib.util.cache_from_source(str(path))).read_bytes()[4:16]
        stat = path.stat()
        assert header == struct.pack("<III", 0, int(stat.st_mtime), stat.st_size), path


def test_stopping_a_worker_whose_shell_just_ended_raises_nothing(monkeypatch) -> None:
    """The race of change 7, made certain: the stopping thread holds the shell's psutil.Process,
    then the middleman's main thread reaps the shell; the stop must return quietly."""
    import psutil
    from horovod.runner.common.util import safe_shell_exec

    shell = subprocess.Popen(["sh", "-c", "exit 3"])
    held = psutil.Process(shell.pid)
    assert shell.wait(timeout=60) == 3  # reaped: psutil's children() now raises NoSuchProcess
    with pytest.raises(psutil.NoSuchProcess):
        held.children()
    monkeypatch.setattr(safe_shell_exec.psutil, "Process", lambda pid: held)
    assert safe_shell_exec.terminate_executor_shell_and_children(shell.pid) is None


def test_horovod_source_loses_only_its_xla_ops(tmp_path) -> None:
    """--without-xla-ops on a copy of Horovod 0.28.1's CMake list (its lines 78-79): that one
    source line goes, once; a file that is not 0.28.1's is refused and left as it was."""
    cmake = tmp_path / "horovod" / "tensorflow" / "CMakeLists.txt"
    cmake.parent.mkdir(parents=True)
    mpi_ops = 'list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/mpi_ops.cc")\n'
    xla_ops = 'list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")\n'
    cmake.write_text("# TF SOURCES\n" + mpi_ops + xla_ops + "\n# Create library\n")
    patch = [PYTHON, str(ROOT / "scripts" / "patch_horovod.py"), "--without-xla-ops", str(tmp_path)]
    first = subprocess.run(patch, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0 and "without its XLA ops" in first.stdout, first.stderr
    text = cmake.read_text()
    assert (
        'xla_mpi_ops.cc")' not in text and mpi_ops in text and text.endswith("# Create library\n")
    )
    again = subprocess.run(patch, capture_output=True, text=True, timeout=60)
    assert (again.returncode, again.stdout, cmake.read_text()) == (0, "", text)
    cmake.write_text("# another Horovod\n" + mpi_ops)
    foreign = subprocess.run(patch, capture_output=True, text=True, timeout=60)
    assert foreign.returncode == 1 and "not Horovod 0.28.1's" in foreign.stderr
    assert cmake.read_text() == "# another Horovod\n" + mpi_ops


@pytest.mark.parametrize("controller", ["--gloo", "--mpi"])
def test_horovodrun_starts_a_job_without_importing_tensorflow(tmp_path, controller) -> None:
    """With a TensorFlow that cannot be imported first on the path, horovodrun still starts the
    job: it answers "built with Gloo/MPI?" from the check kept earlier (unpatched, it imports
    horovod.tensorflow for that at every job, gets None, and refuses to start)."""
    job = [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", controller, "true"]
    check(run(job, tmp_path))  # keeps the answer, if no job has yet
    broken = tmp_path / "broken" / "tensorflow"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('this TensorFlow cannot be imported')\n")
    env = {**os.environ, "PYTHONPATH": str(broken.parent)}
    proc = subprocess.run(job, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_kept_answer_belongs_to_one_build_of_one_framework_version() -> None:
    """The key names the compiled library's size and time and the framework's version, so a
    rebuilt Horovod or another TensorFlow checks again; an extension not built keeps nothing."""
    from importlib import metadata

    from horovod.common import util

    lib = next((pathlib.Path(util.__file__).parents[1] / "tensorflow").glob("mpi_lib*"))
    key = util._built_check_key("tensorflow", "built with Gloo")
    tf_dist = next(n for n in ("tensorflow-cpu", "tensorflow") if _installed(metadata, n))
    assert f"{lib.name}:{lib.stat().st_size}:{lib.stat().st_mtime_ns}" in key.split("|")
    assert f"{tf_dist}=={metadata.version(tf_dist)}" in key.split("|")
    assert util._built_check_key("torch", "built with Gloo") is None  # no horovod.torch here


def _installed(metadata, name: str) -> bool:
    try:
        return bool(metadata.version(name))
    except metadata.PackageNotFoundError:
        return False


def test_a_failed_worker_ends_horovodrun_in_one_line(tmp_path) -> None:
    """Rank 1 killed: horovodrun's last line names it, its code and its signal, and no
    traceback of horovodrun's own code follows; horovodrun exits with that code."""
    die = 'if [ "$HOROVOD_RANK" = 1 ]; then kill -9 $$; fi; sleep 5'
    job = [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", "sh", "-c", die]
    proc = run(job, tmp_path)
    assert proc.returncode == 137, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.splitlines()[-1] == (
        "horovodrun: process 1 exited first, with code 137 (killed by SIGKILL), and ended the "
        "job; its output is above, and in <run.dir>/logs/rank-1.log for hvd_train"
    ), proc.stderr


def _patch_script():
    """scripts/patch_horovod.py's changes to the installed Horovod, imported as a module."""
    path = ROOT / "scripts" / "patch_horovod.py"
    spec = importlib.util.spec_from_file_location("patch_horovod", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PATCHER = _patch_script()


@pytest.mark.parametrize("patch", PATCHER.PATCHES, ids=lambda p: p.module.rsplit(".", 1)[1])
def test_each_change_applies_once_and_a_foreign_file_is_refused(tmp_path, patch) -> None:
    """On a copy of the installed file with that one change taken back out (0.28.1's text
    there): the change is made, once; a file without 0.28.1's text is refused, untouched."""
    installed = PATCHER._module_file(patch.module).read_text()
    assert installed.count(patch.new) == 1, "the install made this change"
    copy = tmp_path / "module.py"
    copy.write_text(installed.replace(patch.new, patch.old))
    assert PATCHER.apply(patch, copy) == 0 and copy.read_text() == installed
    assert PATCHER.apply(patch, copy) == 0 and copy.read_text() == installed
    foreign = installed.replace(patch.new, "")
    copy.write_text(foreign)
    assert PATCHER.apply(patch, copy) == 1 and copy.read_text() == foreign


def test_a_horovod_patched_by_the_first_ending_is_brought_up_to_date(tmp_path, capsys) -> None:
    """Change 5 first kept horovodrun's exit code 1; a launch.py it patched then (or Horovod's
    own) gets the ending with the worker's exit code, once; a third text is refused."""
    patch = _patch_script()
    [ending] = [p for p in patch.PATCHES if p.module == "horovod.runner.launch"]
    path = tmp_path / "launch.py"
    for before in (ending.old, patch.ENDING_V1):
        path.write_text(f"import sys\n\n\n{before}\n\nif __name__ == '__main__':\n    pass\n")
        assert patch.apply(ending, path) == 0
        text = path.read_text()
        assert text.count(ending.new) == 1 and "sys.exit(1)" not in text
        assert patch.apply(ending, path) == 0 and path.read_text() == text
    path.write_text("def run_commandline():\n    pass\n")
    assert patch.apply(ending, path) == 1 and "not Horovod 0.28.1's" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("message", "line_starts", "code"),
    [
        ("The first process to do so was:\nProcess name: 1\nExit code: 2\n",
         "horovodrun: process 1 exited first, with code 2, and ended", 2),
        ("The first process to do so was:\nProcess name: 0\nExit code: 143\n",
         "horovodrun: process 0 exited first, with code 143 (killed by SIGTERM), and", 143),
        ("The first process to do so was:\nProcess name: 1\nExit code: -9\n",
         "horovodrun: process 1 exited first, with code -9 (killed by SIGKILL), and", 137),
        ("mpirun failed with exit code 2", "horovodrun: mpirun failed with exit code 2;", 2),
        ("mpirun failed with exit code 300", "horovodrun: mpirun failed with exit code 300;", 1),
    ],
    ids=["bad input", "stopped", "signal as -N", "mpirun", "no exit status"],
)  # fmt: skip
def test_the_ending_exits_with_the_first_failed_workers_code(message, line_starts, code) -> None:
    """The patched run_commandline's helper, run on the messages Horovod raises: a signal's
    negative code becomes 128 + N, as a shell reports it; a code no exit status holds, 1."""
    scope: dict = {}
    exec(_patch_script().ENDING_NEW, scope)  # defines run_commandline and its helpers
    line, got = scope["_failed_job"](message)
    assert line.startswith(line_starts) and got == code, (line, got)
    assert scope["_failed_job"]("some other RuntimeError") is None


def test_mpiruns_loopback_library_is_built_once_and_a_missing_compiler_is_said(
    tmp_path, monkeypatch, capsys
) -> None:
    """Change 10's library: built beside a copy of its source, once (a second install says
    nothing); without a C compiler, or when it fails, one line and no library (horovodrun then
    keeps mpirun's listener where Open MPI puts it, and says so: tests/test_listening.py)."""
    lib = tmp_path / PATCHER.LOOPBACK_BIND
    for cc, why in (("/nowhere/cc", "no C compiler: /nowhere/cc"), ("false", "false failed")):
        monkeypatch.setenv("CC", cc)
        assert PATCHER.build_loopback_bind(tmp_path) == 0
        [line] = capsys.readouterr().out.splitlines()
        assert line.startswith(f"not built {lib} ({why}") and "mpirun's listener" in line, line
        assert list(tmp_path.iterdir()) == []
    monkeypatch.delenv("CC")
    assert PATCHER.build_loopback_bind(tmp_path) == 0
    assert (
        capsys.readouterr().out
        == f"built {lib}: mpirun listens on loopback alone for a job on one host\n"
    )
    assert lib.read_bytes().startswith(b"\x7fELF")
    assert lib.with_suffix(".c").read_text() == PATCHER.LOOPBACK_BIND_SOURCE.read_text()
    assert PATCHER.build_loopback_bind(tmp_path) == 0 and capsys.readouterr().out == ""
