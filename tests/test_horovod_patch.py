"""Horovod as scripts/install.sh builds it: 0.28.1's sdist with the series of
patches/horovod-0.28.1 applied before the build. The series applies cleanly to the pristine
sdist, the installed Horovod carries it (its version says which), and each change does what its
header says: horovodrun keeps a stopped worker's exit code (unpatched, a third of stops came back
as exit code 0: docs/validation.md; 20 stops that all keep their 143 do not pass by chance), it
starts a job without importing TensorFlow to check how Horovod was built, and a job whose
worker failed ends in one line, with that worker's exit code."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import tarfile

import pytest
from harness import BIN, PYTHON, ROOT, SERIES_VERSION, WORKERS, check, run

SERIES = ROOT / "patches" / "horovod-0.28.1"


def series_files(stack: str | None = None) -> list[pathlib.Path]:
    """The patches the install applies on `stack` (default: this virtualenv's), in order."""
    env = {**os.environ, **({"HVD_TRAIN_TF": stack} if stack else {})}
    script = str(ROOT / "scripts" / "horovod_series.sh")
    out = subprocess.run(["bash", script, "files"], env=env, capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    return [ROOT / line for line in out.split()]


def installed_horovod() -> pathlib.Path:
    """Horovod's installed package folder, found without importing it (horovod.tensorflow
    would import TensorFlow)."""
    import importlib.util

    return pathlib.Path(importlib.util.find_spec("horovod").submodule_search_locations[0])


def added_blocks(patch: pathlib.Path) -> list[tuple[str, str]]:
    """(file inside Horovod's package, lines the patch adds there, joined) for each run of
    added lines: what the patched file holds, whatever the patches after it change nearby."""
    blocks, path, run_ = [], None, []
    for line in [*patch.read_text().splitlines(), ""]:
        if line.startswith("+") and not line.startswith("+++ "):
            run_.append(line[1:])
            continue
        if run_ and path:
            blocks.append((path, "\n".join(run_)))
        run_ = []
        if line.startswith("+++ b/horovod/"):
            path = line[len("+++ b/horovod/") :]
    return blocks


@pytest.mark.processes
def test_a_stopped_worker_keeps_its_exit_code() -> None:
    proc = subprocess.run([PYTHON, str(WORKERS / "stop_codes.py"), "20"], cwd=WORKERS,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == [143] * 20


def test_the_installed_horovod_says_which_series_it_carries() -> None:
    """Its version: 0.28.1 labelled with a hash of the applied diffs (what `hvd-train doctor`
    and summary.json's `versions` report); a changed patch is another version."""
    from importlib.metadata import version

    import horovod

    assert re.fullmatch(r"0\.28\.1\+hvdtrain\.g[0-9a-f]{8}", SERIES_VERSION), SERIES_VERSION
    assert horovod.__version__ == version("horovod") == SERIES_VERSION


def test_the_label_follows_the_diffs_not_the_headers(tmp_path) -> None:
    """The version, and with it the wheel cache's key, changes when a patch's diff changes (the
    install builds again), and not when only its header does (documentation)."""
    for script in ("horovod_series.sh", "stack.sh"):
        (tmp_path / "scripts").mkdir(exist_ok=True)
        shutil.copy(ROOT / "scripts" / script, tmp_path / "scripts" / script)
    copy = tmp_path / "patches" / SERIES.name
    shutil.copytree(SERIES, copy)

    def version() -> str:
        script = str(tmp_path / "scripts" / "horovod_series.sh")
        return check(run(["bash", script, "version"], tmp_path)).stdout.strip()

    first = copy / "0001-horovodrun-keeps-a-stopped-workers-exit-code.patch"
    before = version()
    first.write_text(first.read_text().replace("Description: ", "Description: (reworded) ", 1))
    assert version() == before
    first.write_text(
        first.read_text().replace("+    # hvd_train's fix", "+    # hvd_train's fix!", 1)
    )
    assert version() != before


@pytest.mark.parametrize("patch", sorted(SERIES.glob("*.patch")), ids=lambda p: p.name[:4])
def test_each_patch_is_in_the_installed_horovod(patch) -> None:
    """Every line a patch of this stack's series adds is in the installed file it patches
    (CMake's list is not installed: 0011 is checked on the source); a patch this stack does not
    apply (0011 on 2.15 and 2.18) leaves the installed Horovod as Horovod ships it."""
    blocks = [(f, b) for f, b in added_blocks(patch) if f.endswith(".py")]
    if patch not in series_files():
        assert all(b not in (installed_horovod() / f).read_text() for f, b in blocks)
        return
    for file, block in blocks:
        assert block in (installed_horovod() / file).read_text(), f"{patch.name}: {file}"


def test_the_xla_ops_go_only_where_the_stack_says() -> None:
    """0011 is guarded XLA_OPS=no in `series`: applied on 2.19, 2.20 and 2.21, whose
    TensorFlow cannot compile xla_mpi_ops.cc; not on 2.15 and 2.18. The rest of the series is
    the same on every stack, in the same order."""
    every = [p.name for p in series_files("2.21")]
    assert "0011-without-xla-ops.patch" in every
    for stack in ("2.19", "2.20"):
        assert [p.name for p in series_files(stack)] == every
    for stack in ("2.15", "2.18"):
        assert [p.name for p in series_files(stack)] == [
            name for name in every if name != "0011-without-xla-ops.patch"
        ]


def sdist() -> pathlib.Path:
    """Horovod 0.28.1's sdist as the install keeps it (downloaded once, SHA-256 checked); the
    tests do not download it."""
    cache = os.environ.get("HVD_TRAIN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hvd_train"
    )
    path = pathlib.Path(cache, "horovod-sdist", "horovod-0.28.1.tar.gz")
    if not path.is_file():
        pytest.skip(f"no {path}: scripts/install.sh keeps Horovod's sdist there when it builds it")
    return path


def test_the_series_applies_cleanly_to_the_pristine_sdist(tmp_path) -> None:
    """Every patch of every stack's series, in order, on a scratch copy of the sdist: `patch
    --dry-run`, then the patch, with no fuzz and no offset; the result, labelled as the install
    labels it, is the installed Horovod, file for file."""
    with tarfile.open(sdist()) as tar:
        tar.extractall(tmp_path, filter="data")
    source = tmp_path / "horovod-0.28.1"
    pristine = tmp_path / "pristine"
    shutil.copytree(source, pristine)
    for patch in series_files("2.21"):  # every patch: 2.21's series is 2.18's and 0011
        for dry in (["--dry-run"], []):
            cmd = ["patch", "-p1", "--forward", "--batch", "--fuzz=0", *dry, "-d", str(source)]
            proc = subprocess.run([*cmd, "-i", str(patch)], capture_output=True, text=True)
            assert proc.returncode == 0, f"{patch.name}: {proc.stdout}{proc.stderr}"
            assert not re.search(r"offset|fuzz|Hunk", proc.stdout), f"{patch.name}: {proc.stdout}"
    assert not list(source.rglob("*.rej")) and not list(source.rglob("*.orig"))
    cmake = (source / "horovod" / "tensorflow" / "CMakeLists.txt").read_text()
    assert 'xla_mpi_ops.cc")' not in cmake and '/horovod/tensorflow/mpi_ops.cc")' in cmake
    # The installed files this stack's series patches, against the same series applied alone.
    mine = tmp_path / "mine"
    shutil.copytree(pristine, mine)
    script = str(ROOT / "scripts" / "horovod_series.sh")
    check(run(["bash", script, "apply", str(mine)], tmp_path))
    for patch in series_files():
        for file in {f for f, _ in added_blocks(patch) if f.endswith(".py")}:
            got, want = installed_horovod() / file, mine / "horovod" / file
            assert got.read_text() == want.read_text(), f"{file} is not the patched source's"
    init = (mine / "horovod" / "__init__.py").read_text()
    assert f"__version__ = '{SERIES_VERSION}'" in init


def test_stopping_a_worker_whose_shell_just_ended_raises_nothing(monkeypatch) -> None:
    """The race of 0007, made certain: the stopping thread holds the shell's psutil.Process,
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


@pytest.mark.processes
def test_horovodrun_imports_without_distutils(tmp_path) -> None:
    """0009: with distutils not importable (as on Python 3.12+ without setuptools' copy),
    horovodrun's modules import, js_run included."""
    block = tmp_path / "block"
    block.mkdir()
    (block / "distutils.py").write_text("raise ImportError('no distutils here')\n")
    code = "import horovod.runner.js_run, horovod.runner.launch; print('ok')"
    # stdlib: setuptools' own distutils, which its import hook would hand out, stays out too.
    env = {**os.environ, "PYTHONPATH": str(block), "SETUPTOOLS_USE_DISTUTILS": "stdlib"}
    proc = subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout == "ok\n", proc.stderr[-3000:]
    unpatched = "from distutils.spawn import find_executable"  # 0.28.1's js_run.py line
    proc = subprocess.run([PYTHON, "-c", unpatched], env=env, capture_output=True, text=True)
    assert "no distutils here" in proc.stderr, "the block did not hold: this test proves nothing"


@pytest.mark.processes
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


@pytest.mark.processes
def test_a_failed_worker_ends_horovodrun_in_one_line(tmp_path) -> None:
    """Rank 1 killed: horovodrun's last line names it, its code and its signal, and no
    traceback of horovodrun's own code follows; horovodrun exits with that code."""
    # Rank 0 waits as `sleep` itself (exec), which horovodrun's SIGTERM ends at once: a shell's
    # `sleep` child would hold the output open until it ended by itself.
    die = 'if [ "$HOROVOD_RANK" = 1 ]; then kill -9 $$; fi; exec sleep 5'
    job = [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", "sh", "-c", die]
    proc = run(job, tmp_path)
    assert proc.returncode == 137, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.splitlines()[-1] == (
        "horovodrun: process 1 exited first, with code 137 (killed by SIGKILL), and ended the "
        "job; its output is above, and in <run.dir>/logs/rank-1.log for hvd_train"
    ), proc.stderr


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
    """0005's helper in the installed horovodrun, on the messages Horovod raises: a signal's
    negative code becomes 128 + N, as a shell reports it; a code no exit status holds, 1."""
    from horovod.runner import launch

    line, got = launch._failed_job(message)
    assert line.startswith(line_starts) and got == code, (line, got)
    assert launch._failed_job("some other RuntimeError") is None


def test_mpiruns_loopback_library_is_built_once_and_a_missing_compiler_is_said(tmp_path) -> None:
    """0010's library (scripts/build_loopback_bind.sh): built beside a copy of its source, once
    (a second install says nothing); without a C compiler, or when it fails, one line and no
    library (horovodrun then keeps mpirun's listener where Open MPI puts it, and says so:
    tests/test_listening.py). The install built it where mpi_run.py looks for it."""
    build = ["bash", str(ROOT / "scripts" / "build_loopback_bind.sh"), str(tmp_path)]
    lib = tmp_path / "hvd_train_loopback_bind.so"
    for cc, why in (("/nowhere/cc", "no C compiler: /nowhere/cc"), ("false", "false failed")):
        proc = subprocess.run(build, env={**os.environ, "CC": cc}, capture_output=True, text=True)
        [line] = proc.stdout.splitlines()
        assert proc.returncode == 0 and line.startswith(f"not built {lib} ({why}"), line
        assert "mpirun's listener" in line and list(tmp_path.iterdir()) == []
    env = {k: v for k, v in os.environ.items() if k != "CC"}
    proc = subprocess.run(build, env=env, capture_output=True, text=True)
    assert proc.stdout == f"built {lib}: mpirun listens on loopback alone for a job on one host\n"
    assert lib.read_bytes().startswith(b"\x7fELF")
    source = (ROOT / "scripts" / "loopback_bind.c").read_text()
    assert lib.with_suffix(".c").read_text() == source
    again = subprocess.run(build, env=env, capture_output=True, text=True)
    assert (again.returncode, again.stdout) == (0, "")
    from horovod.runner import mpi_run

    assert mpi_run._LOOPBACK_BIND == str(installed_horovod() / "runner" / lib.name)
    assert pathlib.Path(mpi_run._LOOPBACK_BIND).read_bytes().startswith(b"\x7fELF")


@pytest.mark.parametrize(("tf", "via"), [((2, 15), "AsGpuStreamValue"),
                                         ((2, 18), "platform_specific_handle"),
                                         ((2, 21), "platform_specific_handle")])  # fmt: skip
def test_the_gpu_stream_comes_from_what_each_tensorflow_exports(tmp_path, tf, via) -> None:
    """0014: every op's GPU stream comes from one helper in mpi_ops.cc, which calls
    Stream::platform_specific_handle() (virtual: no symbol of TensorFlow's) from 2.18, and
    AsGpuStreamValue, which TensorFlow 2.21 no longer exports, only before. The GPU part of
    the patched file is preprocessed as a CUDA build would, with the TENSORFLOW_VERSION
    Horovod's CMake passes (TensorFlow's own TF_MINOR_VERSION is no guard: from 2.20 its
    headers leave it to TensorFlow's build), against empty stand-in headers."""
    with tarfile.open(sdist()) as tar:
        tar.extractall(tmp_path, filter="data")
    source = tmp_path / "horovod-0.28.1"
    check(run(["bash", str(ROOT / "scripts" / "horovod_series.sh"), "apply", str(source)],
              tmp_path))  # fmt: skip
    text = (source / "horovod" / "tensorflow" / "mpi_ops.cc").read_text()
    start = text.index("#if HAVE_GPU\n")
    gpu_part = text[start : text.index("#endif // HAVE_GPU\n", start) + len("#endif // HAVE_GPU\n")]
    assert "AsGpuStreamValue" not in text.replace(gpu_part, ""), "a call outside the helper"
    headers = tmp_path / "include"
    for header in ("cuda_runtime.h", "tensorflow/compiler/xla/stream_executor/stream.h"):
        (headers / header).parent.mkdir(parents=True, exist_ok=True)
        (headers / header).write_text("")
    (tmp_path / "gpu_part.cc").write_text(gpu_part)
    version = f"-DTENSORFLOW_VERSION={tf[0]}0{tf[1]:02d}000000"
    cmd = ["cpp", "-P", "-DHAVE_GPU=1", "-DHAVE_CUDA=1", version, f"-I{headers}", "gpu_part.cc"]
    out = check(run(cmd, tmp_path)).stdout
    assert "HorovodGpuStream(stream_executor::Stream* stream)" in out
    other = {"AsGpuStreamValue", "platform_specific_handle"} - {via}
    assert via in out and not any(name in out for name in other), out
