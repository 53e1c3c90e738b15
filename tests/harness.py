"""Launching real jobs from tests: horovodrun with Gloo on localhost, bounded by a timeout.

On failure or timeout the assertion carries every rank's output, as horovodrun printed it.
"""

from __future__ import annotations

import concurrent.futures
import ipaddress
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time
from typing import NamedTuple

import pytest

from hvd_train.runtime.keras.binding import has_keras3, of_saved

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(sys.executable).parent
PYTHON = sys.executable
WORKERS = ROOT / "tests" / "workers"
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


def _series_version() -> str:
    """The version scripts/install.sh gives the Horovod it builds for this virtualenv's stack:
    0.28.1 labelled with the patch series it carries (scripts/horovod_series.sh)."""
    stamp = pathlib.Path(sys.prefix, ".hvd_train-stack")  # the stack the install made it for
    stack = stamp.read_text().strip() if stamp.is_file() else os.environ.get("HVD_TRAIN_TF", "")
    env = {**os.environ, "HVD_TRAIN_TF": stack or "2.21"}
    script = [ROOT / "scripts" / "horovod_series.sh", "version"]
    return subprocess.run(["bash", *map(str, script)], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


SERIES_VERSION = _series_version()
# The Kerases this stack trains with (runtime.keras): Keras 3 and tf_keras on TensorFlow 2.16+,
# TensorFlow's own Keras 2 alone on 2.15.
KERASES = ["keras", "tf_keras"] if has_keras3() else ["tf_keras"]
# The deep tests of a binding (resume, sync batch norm, mixed precision) run on each of them; on a
# stack with two, the runs on tf_keras are marked `second_keras`: `make test` leaves them out
# (it must keep within its time), and CI's short suite on Python 3.13, the same two Kerases on
# the same TensorFlow, runs them (`make test-stack` selects by `stack` alone). On TensorFlow
# 2.15, Keras 2 is the only Keras, and `make test` runs its binding's tests.
BINDING_RUNS = [k if k == KERASES[0] else pytest.param(k, marks=pytest.mark.second_keras)
                for k in KERASES]  # fmt: skip


def variant(*values: object) -> object:
    """One run of a matrix test (controller x rank, launcher x controller, ...) that `make test`
    leaves out, marked `variant`: each of its values is still run there by another of the
    test's runs (every value of every factor once, not every combination). CI's Python 3.13
    leg, the same TensorFlow and Kerases, runs them all (`make test-stack
    STACK_TESTS="stack or variant"`): it keeps `make test` within its time."""
    return pytest.param(*values, marks=pytest.mark.variant)


def load_model(path: pathlib.Path):
    """A saved model, loaded by the Keras that wrote it (Keras 3 reads no Keras 2 file, nor the
    reverse), uncompiled; without hvd_train's own code (the exports load without it)."""
    if of_saved(str(path)) == "tf_keras" and has_keras3():
        import tf_keras as keras
    else:
        import keras  # Keras 3; TensorFlow 2.15's Keras 2
    return keras.models.load_model(path, compile=False)


def run(
    cmd: list[str], cwd: pathlib.Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Runs `cmd` in its own process group; kills the whole group if it outlives `timeout`."""
    return finish(start(cmd, cwd, env), timeout)


def horovodrun(np: int, command: list[str], cwd: pathlib.Path, timeout: float = 300):
    """`horovodrun -np N -H localhost:N --gloo COMMAND`, as Horovod's own CI runs its tests."""
    cmd = [str(BIN / "horovodrun"), "-np", str(np), "-H", f"localhost:{np}", "--gloo", *command]
    return run(cmd, cwd, timeout)


def horovod_cases(worker: str, cwd: pathlib.Path, timeout: float) -> list[dict]:
    """Every case of `worker` (tests/workers/, run by case_runner.py) in one 2-worker job:
    each one's outcome (`name`, `ok`, `error`) as rank 0 reported it, in order."""
    proc = check(horovodrun(2, [PYTHON, str(WORKERS / worker)], cwd, timeout=timeout))
    found = [json.loads(m) for m in re.findall(r"\[0\]<stdout>:CASE (\{.*\})", proc.stdout)]
    if not found:
        raise AssertionError(f"no case reported:\n{proc.stdout[-3000:]}")
    return found


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
# TF_CPP_MIN_LOG_LEVEL=0): kept off every command's console (hvd_train/base/logs.py).
TENSORFLOW_START_UP = (
    "All log messages before absl::InitializeLog()",
    "oneDNN custom operations are on",
    "cpu_feature_guard",
    "rebuild TensorFlow with the appropriate compiler flags",
)


def two_local_hosts(folder: pathlib.Path) -> pathlib.Path:
    """A Horovod Elastic discovery script in `folder` offering two one-slot hosts, both this
    machine (localhost and 127.0.0.1: Horovod blacklists the host of a failed worker)."""
    hosts = folder / "hosts"
    hosts.write_text("localhost:1\n127.0.0.1:1\n")
    discover = folder / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    return discover


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


class Listener(NamedTuple):
    """A TCP socket in the LISTEN state, and the process that holds it."""

    process: str  # its command name (/proc/PID/comm): horovodrun, python, mpirun, ...
    address: str
    port: int

    def on_loopback(self) -> bool:
        ip = ipaddress.ip_address(self.address)
        return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback


def listening(root: int) -> set[Listener]:
    """The TCP sockets that `root` and its descendants listen on, read from /proc/PID/net/tcp and
    tcp6: each process's own network namespace (a job started by `ip netns exec` included)."""
    found = set()
    for pid in _tree(root):
        try:
            name = pathlib.Path(f"/proc/{pid}/comm").read_text().strip()
            inodes = {_link(fd) for fd in pathlib.Path(f"/proc/{pid}/fd").iterdir()}
            tables = [pathlib.Path(f"/proc/{pid}/net/{t}").read_text() for t in ("tcp", "tcp6")]
        except OSError:  # the process ended meanwhile
            continue
        for table in tables:
            for fields in (line.split() for line in table.splitlines()[1:]):
                if fields[3] == "0A" and f"socket:[{fields[9]}]" in inodes:  # 0A: LISTEN
                    found.add(Listener(name, *_address(fields[1])))
    return found


def open_mpi_transports(root: int) -> set[str]:
    """The Open MPI transports (btl components: vader, tcp, ofi, ...) that `root` and its
    descendants have loaded, from the `mca_btl_NAME.so` each maps (/proc/PID/maps)."""
    found = set()
    for pid in _tree(root):
        try:
            maps = pathlib.Path(f"/proc/{pid}/maps").read_text()
        except OSError:  # the process ended meanwhile
            continue
        found.update(re.findall(r"/mca_btl_(\w+)\.so$", maps, re.MULTILINE))
    return found


def finish_listening(proc: subprocess.Popen, timeout: float):
    """`finish` a `start`ed job, reading what its processes listen on every 0.2 s meanwhile.

    Returns (the CompletedProcess, every Listener seen while the job ran): a socket that
    listens for less than the interval between two readings may be missed (Gloo's, while the
    ranks connect), one that listens while the job runs is not (a rendezvous server)."""
    done, (seen,) = finish_watching(proc, timeout, listening)
    return done, seen


def finish_watching(proc: subprocess.Popen, timeout: float, *readers):
    """`finish` a `start`ed job, calling each reader (`listening`, `open_mpi_transports`) on
    its process tree every 0.2 s meanwhile; returns (the CompletedProcess, each reader's
    findings over the job's life, as one set a reader)."""
    seen: list[set] = [set() for _ in readers]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        done = pool.submit(finish, proc, timeout)  # reads the output: no pipe fills up
        while not done.done():
            for found, read in zip(seen, readers, strict=True):
                found |= read(proc.pid)
            time.sleep(0.2)
        return done.result(), seen


def _link(fd: pathlib.Path) -> str:
    """What a file descriptor is (`socket:[INODE]` for a socket); "" when it closed meanwhile."""
    try:
        return os.readlink(fd)
    except OSError:
        return ""


def _tree(root: int) -> list[int]:
    """`root` and its live descendants."""
    children: dict[int, list[int]] = {}
    for entry in pathlib.Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        if stat:  # "PID (comm) STATE PPID ...": the name may hold spaces and parentheses
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def _address(hex_address: str) -> tuple[str, int]:
    """/proc/net/tcp's `0100007F:1F90` as ("127.0.0.1", 8080): the address in the kernel's
    byte order, 32-bit words of it in the host's (little-endian on x86)."""
    ip, port = hex_address.split(":")
    raw = bytes.fromhex(ip)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, words), int(port, 16)


def thread_states(pid: int) -> str:
    """The state letter of each of `pid`'s threads (R: running or runnable)."""
    states = ""
    try:
        tasks = list(pathlib.Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return states  # the process has gone
    for task in tasks:
        try:
            states += (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            pass
    return states


def spinning(pid: int, looks: int = 40) -> bool:
    """Whether a thread of `pid` is runnable at nearly every look over 0.4 s: a rank waiting at
    a shared-memory barrier yields in a loop, one waiting in Gloo's transport sleeps. The looks
    end at the third that finds no thread runnable: the answer is no by then."""
    idle = 0
    for _ in range(looks):
        idle += "R" not in thread_states(pid)
        if idle > 2:
            return False
        time.sleep(0.01)
    return True


def kill_inside_a_shared_memory_all_reduce(pid0: int, pid1: int, attempts: int = 200) -> bool:
    """Stops rank 1 (`pid1`) until rank 0 (`pid0`) is caught waiting for it inside a
    shared-memory all-reduce (spinning: in Gloo's negotiation it would sleep), then kills rank
    1; False, rank 1 left running, if rank 0 was never caught there (or has ended)."""
    for attempt in range(attempts):
        if thread_states(pid0).strip("Z") == "":
            return False  # rank 0 has ended: the job is over
        os.kill(pid1, signal.SIGSTOP)
        time.sleep(0.05)
        if spinning(pid0):
            os.kill(pid1, signal.SIGKILL)
            return True
        os.kill(pid1, signal.SIGCONT)
        time.sleep(0.002 * (attempt % 10))
    return False
