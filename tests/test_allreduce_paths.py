"""Horovod's all-reduce as hvd_train builds it (patches/horovod-0.28.1, 0012 and 0013): on one
host, CPU tensors are summed through shared memory, to the same bits the transport gives and
alike on every rank; the background thread sleeps while nothing is queued; a rank that dies
inside a shared-memory all-reduce ends the others' wait with an error, not a hang; and a rank
that never comes to an all-reduce ends the job after the stall shutdown time (0015)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import signal
import subprocess
import time

import pytest
from harness import (
    BIN,
    PYTHON,
    ROOT,
    WORKERS,
    check,
    finish,
    kill_inside_a_shared_memory_all_reduce,
    run,
    start,
    variant,
)

from hvd_train.base.errors import KNOCK_ON

WORKER = str(WORKERS / "allreduce_paths.py")


def job_command(np: int, controller: str, mode: str, out: pathlib.Path) -> list[str]:
    return [str(BIN / "horovodrun"), "-np", str(np), "-H", f"localhost:{np}", f"--{controller}",
            PYTHON, WORKER, mode, str(out)]  # fmt: skip


def results(out: pathlib.Path, np: int) -> list[dict]:
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(np)]


def activities(timeline: pathlib.Path) -> set[str]:
    """The names of what rank 0's Horovod timeline recorded (operations and their steps)."""
    return set(re.findall(r'"name": "([A-Z_]+)"', timeline.read_text()))


def check_exact(out: pathlib.Path, np: int, shared_memory: bool, transport: str) -> None:
    """Every rank got the exact sums and averages, the same bytes, on the path expected: what
    Horovod says of itself and what rank 0's timeline recorded."""
    for rank, result in enumerate(results(out, np)):
        assert result["wrong"] == [], f"rank {rank}: {result['wrong']}"
        assert result["alike"], f"rank {rank}: the ranks' averages differ"
        assert result["shared_memory"] == shared_memory, f"rank {rank}"
    names = activities(out / "timeline.json")
    taken, not_taken = (
        ("SHM_ALLREDUCE", transport) if shared_memory else (transport, "SHM_ALLREDUCE")
    )
    assert taken in names and not_taken not in names, sorted(names)


@pytest.mark.processes
@pytest.mark.stack  # Horovod's C++ core, as each stack's build compiles it
@pytest.mark.parametrize(
    "controller, np, shared_memory",
    # Each controller, worker count and path; Gloo at 2 is CI's (harness.variant).
    [variant("gloo", 2, True), ("mpi", 2, True), ("gloo", 3, True), ("mpi", 2, False)],
)
def test_sums_and_averages_are_exact_and_alike_on_every_rank(
    controller, np, shared_memory, tmp_path
) -> None:
    """Float32 and float64 sums and averages, fused and alone, from 0 to 3,000,001 elements,
    equal the rank-order sum in the tensor's type, and every rank holds the same bytes: through
    shared memory on one host, and through the transport with HOROVOD_SHM_ALLREDUCE=0; Horovod
    and rank 0's timeline say which path was taken."""
    env = {"HOROVOD_TIMELINE": str(tmp_path / "timeline.json")}
    if not shared_memory:
        env["HOROVOD_SHM_ALLREDUCE"] = "0"
    check(run(job_command(np, controller, "exact", tmp_path), tmp_path, env=env))
    check_exact(tmp_path, np, shared_memory, f"{controller.upper()}_ALLREDUCE")


def test_a_dev_shm_too_small_for_the_segments_leaves_every_rank_on_the_transport(tmp_path) -> None:
    """In a mount namespace whose /dev/shm holds 64 KB, no rank can reserve its segment: every
    rank agrees to all-reduce through Gloo, exactly, as upstream Horovod would; nothing is left
    in that /dev/shm."""
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace here: {probe.stderr.decode().strip()}")
    job = shlex.join(job_command(2, "gloo", "exact", tmp_path))
    left = shlex.quote(str(tmp_path / "left"))
    script = f"mount -t tmpfs -o size=64k tmpfs /dev/shm && {job} && ls -A /dev/shm > {left}"
    env = {"HOROVOD_TIMELINE": str(tmp_path / "timeline.json")}
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
    check(run(cmd, tmp_path, env=env))
    check_exact(tmp_path, 2, False, "GLOO_ALLREDUCE")
    assert (tmp_path / "left").read_text() == ""


@pytest.mark.processes
@pytest.mark.stack
@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="needs a core to bind Horovod's thread to"
)
@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_the_background_thread_sleeps_while_nothing_is_queued(controller, tmp_path) -> None:
    """Over 2 s with nothing queued, and an idle cycle longer than that, Horovod's background
    thread does not wake (it goes to sleep once at most, as the window opens), where with
    HOROVOD_IDLE_CYCLE_TIME=0 it cycles as upstream Horovod's does, every 1 ms, and at least
    one rank's wakes more than once in 20 ms."""
    core = str(min(os.sched_getaffinity(0)))
    switches = {}
    for idle_cycle in ("10000", "0"):
        out = tmp_path / idle_cycle
        out.mkdir()
        env = {"HOROVOD_IDLE_CYCLE_TIME": idle_cycle, "HOROVOD_THREAD_AFFINITY": f"{core},{core}"}
        check(run(job_command(2, controller, "idle", out), tmp_path, env=env))
        switches[idle_cycle] = [r["switches"] for r in results(out, 2)]
    assert max(switches["10000"]) <= 1, switches
    assert max(switches["0"]) > 2000 / 20, switches


def test_every_error_of_the_shared_memory_all_reduce_is_read_as_a_knock_on() -> None:
    """Patch 0013 fails an all-reduce only when a rank it waited for has gone: hvd_train reads
    each of its errors as a knock-on of another rank's failure (errors.KNOCK_ON), so the record
    names the rank that failed first instead of blaming rank 0 (test_stops.py)."""
    patch = next((ROOT / "patches" / "horovod-0.28.1").glob("0013-*.patch")).read_text()
    thrown = re.findall(r'std::runtime_error\((?:\s|\+)*"([^"]+)"', patch)
    assert len(thrown) == 2, thrown
    assert all(any(k in text for k in KNOCK_ON) for text in thrown), thrown


@pytest.mark.processes
def test_a_rank_dead_inside_a_shared_memory_all_reduce_ends_the_others_wait(tmp_path) -> None:
    """Rank 1 is stopped until rank 0 is caught waiting for it inside a shared-memory all-reduce
    (not in Gloo's negotiation), then killed: rank 0's all-reduce fails, naming rank 1 as gone,
    and the job ends."""
    proc = start(job_command(2, "gloo", "victim", tmp_path), tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"pid-{r}").exists() for r in (0, 1)):
            assert proc.poll() is None and time.monotonic() < deadline, "the job did not start"
            time.sleep(0.1)
        time.sleep(1.0)  # into the stream of all-reduces
        pid0, pid1 = (int((tmp_path / f"pid-{r}").read_text()) for r in (0, 1))
        if not kill_inside_a_shared_memory_all_reduce(pid0, pid1):
            pytest.fail("rank 0 was never caught waiting inside a shared-memory all-reduce")
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    ended = finish(proc, 120)
    assert ended.returncode != 0
    error = json.loads((tmp_path / "rank-0.json").read_text())["error"]
    assert error and "shared-memory all-reduce: rank 1 has gone" in error, error


@pytest.mark.processes
@pytest.mark.stack
@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_a_rank_that_never_comes_to_an_all_reduce_ends_the_job_at_the_stall_shutdown(
    controller, tmp_path
) -> None:
    """Horovod's test/parallel/test_stall.py, with TensorFlow and both controllers: rank 0
    all-reduces a tensor rank 1 never submits. Horovod's stall check names rank 1 as missing
    after HOROVOD_STALL_CHECK_TIME_SECONDS and shuts down after
    HOROVOD_STALL_SHUTDOWN_TIME_SECONDS (hvd_train's horovod.stall_warning_s and
    horovod.stall_shutdown_s): rank 0's all-reduce fails and the job ends. Under Gloo it hung
    until killed before patch 0015 (the check saw no ranks)."""
    env = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "2", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "5"}
    ended = run(job_command(2, controller, "stalled", tmp_path), tmp_path, timeout=120, env=env)
    assert ended.returncode != 0, ended.stdout[-2000:]
    error = json.loads((tmp_path / "rank-0.json").read_text())["error"]
    assert error and "Horovod has been shut down" in error, error
    # horovodrun's prefixes ([0]<stderr>: under Gloo, [1,0]<stderr>: under MPI) taken off.
    said = re.sub(r"(?m)^\[[\d,]+\]<std\w+>:", "", ended.stdout + ended.stderr)
    # Rank 1 named as missing, and marked (!) as the one the shutdown is for.
    assert "Missing ranks:" in said and "\n1!: [" in said, said[-3000:]
