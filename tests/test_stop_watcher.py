"""The stop watcher (stops.StopSignals) in a real process receiving real signals: it ends the
process itself when waiting would save nothing, or when the stop outlasts its grace, and leaves
it alone once the run has written its own ending. Before the run's record exists (TensorFlow's
import, Horovod's start, the data), rank 0 writes the ending itself: run_record.end_before_start."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap

import pytest
from harness import PYTHON, QUICKSTART, ROOT, WORKERS
from harness import run as run_job

from hvd_train.record.run_record import end_before_start
from hvd_train.record.rundir import LOCK_NAME
from hvd_train.record.stops import STOP_NOTE, SUPERVISED

SCRIPT = """
import os, signal, sys, time
sys.path.insert(0, {root!r})
from hvd_train.record.stops import StopSignals
s = StopSignals(grace_s=0.5)
s.recorded_by(lambda e: print(
    f"ABANDON signal={{e.signum}} ran={{e.ran}} failed={{e.failed}}: {{e.reason}}", flush=True))
s.steps_run = {steps}
s.install()
{before}
os.kill(os.getpid(), signal.SIGTERM)
{after}
time.sleep(60)  # the watcher must end the process long before this
print("NOT ENDED", flush=True)
"""


def run(steps: int = 0, before: str = "", after: str = "", env: dict | None = None):
    code = SCRIPT.format(root=str(ROOT), steps=steps, before=before, after=after)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=env)  # fmt: skip


@pytest.mark.processes
def test_a_stop_before_any_step_ends_the_process_at_once_recorded() -> None:
    proc = run(steps=0)
    assert proc.returncode == 143, proc.stdout + proc.stderr
    assert "ABANDON signal=15 ran=False failed=False: before any step ran" in proc.stdout


@pytest.mark.processes
def test_a_stop_that_outlasts_the_grace_ends_the_process_without_a_checkpoint() -> None:
    proc = run(steps=3)
    assert proc.returncode == 143, proc.stdout + proc.stderr
    assert "ABANDON signal=15 ran=True failed=False: its stop did not finish" in proc.stdout


@pytest.mark.processes
def test_a_run_that_wrote_its_ending_is_left_to_end_by_itself() -> None:
    proc = run(steps=3, before="s.done.set()",
               after="time.sleep(2); print('ENDED BY ITSELF'); sys.exit(0)")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ENDED BY ITSELF" in proc.stdout and "ABANDON" not in proc.stdout


@pytest.mark.processes
def test_mpiruns_kill_sequence_is_recorded_as_a_failure_not_a_stop() -> None:
    """mpirun ends a job with SIGCONT, then SIGTERM: that is not a user's stop."""
    env = {**os.environ, "OMPI_COMM_WORLD_RANK": "0"}
    proc = run(steps=3, before="os.kill(os.getpid(), signal.SIGCONT)", env=env)
    assert proc.returncode == 143, proc.stdout + proc.stderr
    assert "ABANDON signal=15 ran=True failed=True: mpirun ended the job" in proc.stdout


KNOCK_ON_UNDER_MPIRUN = """
import os, signal, sys, threading, time
sys.path.insert(0, {root!r})
from hvd_train.record import stops
s = stops.StopSignals(grace_s=30)
s.recorded_by(lambda e: print(
    f"ABANDON signal={{e.signum}} ran={{e.ran}} failed={{e.failed}}: {{e.reason}}", flush=True))
s.steps_run = 3
s.install()
def mpirun_ends_the_job():  # as mpirun does once a worker has died
    os.kill(os.getpid(), signal.SIGCONT)
    time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)
if {mpirun_ends}:
    threading.Thread(target=mpirun_ends_the_job).start()
print("RETURNED", stops.first_failure_awaited({wait_s}), flush=True)
"""


@pytest.mark.processes
@pytest.mark.parametrize("mpirun_ends", [True, False])
def test_rank_0_that_saw_a_knock_on_under_mpirun_waits_for_mpirun_to_end_the_job(
    mpirun_ends,
) -> None:
    """A rank that dies inside a shared-memory all-reduce fails rank 0's at once (an MPI
    collective would have waited): rank 0 waits for mpirun's SIGCONT and SIGTERM, so its
    record says that mpirun ended the job, as before; without them it goes on after the wait."""
    code = KNOCK_ON_UNDER_MPIRUN.format(root=str(ROOT), mpirun_ends=mpirun_ends,
                                        wait_s=3.0 if mpirun_ends else 0.2)  # fmt: skip
    env = {**os.environ, "OMPI_COMM_WORLD_RANK": "0"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=env)  # fmt: skip
    if mpirun_ends:
        assert proc.returncode == 143, proc.stdout + proc.stderr
        assert "ABANDON signal=15 ran=True failed=True: mpirun ended the job" in proc.stdout
        assert "RETURNED" not in proc.stdout
    else:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "RETURNED None" in proc.stdout and "ABANDON" not in proc.stdout


# --------------------------------------------------------------------------- before the record

BEFORE_THE_RECORD = """
import os, signal, sys, time
sys.path.insert(0, {root!r})
from hvd_train.record import stops
from hvd_train.config import load_config
if {at_install!r}:  # the signal the moment its handler is in place (SigCgt), as a launcher sees
    install = signal.signal
    def signalled_at_install(sig, handler):
        previous = install(sig, handler)
        if sig == signal.{signal}:
            os.kill(os.getpid(), sig)
        return previous
    signal.signal = signalled_at_install
signals = stops.installed(load_config({config!r}, ["run.dir={run_dir}"]))
if {claimed!r}:  # rank 0 claimed run.dir, then died in the collective that shares the claim
    from hvd_train.record import rundir
    claim = rundir.claim({run_dir!r}, overwrite=False, config_path=None)
    signals.before_exit.append(claim.release)  # as the trainer's Run does (run_state.running)
if not {at_install!r}:
    os.kill(os.getpid(), signal.{signal})
time.sleep(60)  # TensorFlow's import, say: the watcher must end the process long before this
print("NOT ENDED", flush=True)
"""


def before_the_record(
    run_dir: pathlib.Path,
    sig: str = "SIGTERM",
    claimed: bool = False,
    at_install: bool = False,
    **env: str,
):
    code = BEFORE_THE_RECORD.format(root=str(ROOT), config=str(QUICKSTART), run_dir=str(run_dir),
                                    signal=sig, claimed=claimed, at_install=at_install)  # fmt: skip
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env})  # fmt: skip


@pytest.mark.processes
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGUSR1"])
def test_a_stop_before_the_record_is_recorded_by_rank_0_itself(tmp_path, sig) -> None:
    d = tmp_path / "run"
    proc = before_the_record(d, sig, HOROVOD_RANK="0", HOROVOD_SIZE="2")
    assert proc.returncode == 128 + getattr(signal, sig), proc.stdout + proc.stderr
    s = json.loads((d / "summary.json").read_text())
    assert s["status"] == "interrupted" and s["stopped_by"] == sig, s
    assert s["recorded_by"] == "start-up" and s["world_size"] == 2, s
    assert s["epochs_completed"] == 0 and "nothing to save" in s["stop_detail"], s
    assert f"{d / 'summary.json'} says interrupted" in proc.stdout + proc.stderr
    assert not (d / LOCK_NAME).exists()  # run.dir is free for the same command again


@pytest.mark.processes
@pytest.mark.parametrize("sender", ["mpirun alone", "the supervisor", "mpirun, supervised"])
def test_a_signal_in_an_mpi_workers_start_up_is_a_stop_only_from_the_launcher(
    tmp_path, sender
) -> None:
    """mpirun alone ends a job with SIGCONT, SIGTERM, SIGKILL, and its SIGCONT may come before
    the worker hears signals: a SIGTERM in start-up is then mpirun ending the job, not a stop.
    hvd-train launch's supervisor, which passes stops to MPI workers itself, notes each one
    first: a SIGTERM it did not note is mpirun's, whatever the moment."""
    d = tmp_path / "run"
    note = tmp_path / "stops"
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}
    if sender != "mpirun alone":
        env.update({SUPERVISED: "1", STOP_NOTE: str(note)})
    if sender == "the supervisor":
        note.write_text("SIGTERM\n")
    proc = before_the_record(d, **env)
    assert proc.returncode == 143, proc.stdout + proc.stderr
    s = json.loads((d / "summary.json").read_text())
    if sender == "the supervisor":
        assert s["status"] == "interrupted" and s["stopped_by"] == "SIGTERM", s
    else:
        assert s["status"] == "failed" and s["error"].startswith("mpirun ended the job"), s
        assert "stopped_by" not in s, s


@pytest.mark.processes
@pytest.mark.parametrize("sender", ["a user's stop", "mpirun, supervised"])
def test_a_signal_the_moment_it_is_caught_is_recorded_by_rank_0_itself(tmp_path, sender) -> None:
    """A launcher or a test may signal a worker as soon as the worker is seen to catch the
    signal (SigCgt in /proc, as tests/test_stops.py waits for it): the watcher and the
    start-up's recorder are in place from that moment (before, a signal that came after the
    handler and before the watcher was lost, and one before the recorder ended the process
    unrecorded: lab/test-suite-time)."""
    d = tmp_path / "run"
    if sender == "a user's stop":
        env = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}
    else:  # hvd-train launch's MPI worker, which the supervisor noted no stop for
        env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", SUPERVISED: "1",
               STOP_NOTE: str(tmp_path / "stops")}  # fmt: skip
    proc = before_the_record(d, at_install=True, **env)
    assert proc.returncode == 143, proc.stdout + proc.stderr
    s = json.loads((d / "summary.json").read_text())
    assert s["recorded_by"] == "start-up", s
    if sender == "a user's stop":
        assert s["status"] == "interrupted" and s["stopped_by"] == "SIGTERM", s
    else:
        assert s["status"] == "failed" and s["error"].startswith("mpirun ended the job"), s


@pytest.mark.processes
def test_rank_0_that_holds_run_dir_already_writes_its_ending(tmp_path) -> None:
    """Between rank 0's claim on run.dir and its record's start lies the collective that tells
    every rank the claim's outcome: a worker that dies there gets mpirun's SIGTERM to rank 0,
    whose ending is written under the claim it holds (before, it asked for a second claim,
    was refused by its own, and wrote nothing: under raw horovodrun no one else could)."""
    d = tmp_path / "run"
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}
    proc = before_the_record(d, claimed=True, **env)
    assert proc.returncode == 143, proc.stdout + proc.stderr
    s = json.loads((d / "summary.json").read_text())
    assert s["status"] == "failed" and s["error"].startswith("mpirun ended the job"), s
    assert s["recorded_by"] == "start-up" and "stopped_by" not in s, s
    assert not (d / LOCK_NAME).exists()  # released as the process ended


@pytest.mark.processes
def test_rank_0_whose_claim_collective_fails_writes_its_ending(tmp_path) -> None:
    """Under Gloo, a worker that dies in the collective after rank 0's claim makes Horovod
    raise in rank 0 at once, before horovodrun's SIGTERM: rank 0 writes `failed` under its
    claim and gives run.dir back (before, under raw horovodrun --gloo, most such jobs left no
    record: docs/benchmarks.md, "Early deaths"). The collective fails in
    tests/workers/claim_collective_fails.py."""
    d = tmp_path / "run"
    proc = run_job(
        [PYTHON, str(WORKERS / "claim_collective_fails.py"), str(QUICKSTART), str(d)], tmp_path
    )
    assert proc.returncode != 0 and "UnknownError" in proc.stderr, proc.stdout + proc.stderr
    s = json.loads((d / "summary.json").read_text())
    assert s["status"] == "failed" and s["recorded_by"] == "start-up", s
    assert s["error"].startswith("another worker ended first; rank 0 then saw: UnknownError"), s
    assert (d / "config.yaml").exists() and not (d / LOCK_NAME).exists()


@pytest.mark.processes
def test_another_rank_stopped_before_the_record_writes_nothing(tmp_path) -> None:
    d = tmp_path / "run"
    proc = before_the_record(d, HOROVOD_RANK="1", HOROVOD_SIZE="2")
    assert proc.returncode == 143, proc.stdout + proc.stderr
    assert not d.exists()


def test_the_ending_before_the_record_keeps_what_earlier_jobs_achieved(tmp_path) -> None:
    """An earlier job's record gets the new ending, its cause replaced, its progress kept."""
    d = tmp_path / "run"
    d.mkdir()
    earlier = {
        "status": "failed",
        "error": "disk full",
        "error_type": "CheckpointError",
        "epochs_completed": 4,
        "last_checkpoint": "ckpt-64",
        "final_metrics": {"loss": 1},
    }
    (d / "summary.json").write_text(json.dumps(earlier))  # fmt: skip
    said = end_before_start(str(d), False, 2, 6, {"status": "failed", "error": "rank 1 died",
                                                   "failed_rank": 1})  # fmt: skip
    s = json.loads((d / "summary.json").read_text())
    assert said == f"{d / 'summary.json'} says failed"
    assert {k: s.get(k) for k in ("epochs_completed", "last_checkpoint", "final_metrics")} == {
        "epochs_completed": 4,
        "last_checkpoint": "ckpt-64",
        "final_metrics": {"loss": 1},
    }
    assert (s["error"], s["failed_rank"], s["recorded_by"]) == ("rank 1 died", 1, "start-up"), s
    assert "error_type" not in s, s


@pytest.mark.parametrize("case", ["completed", "another job's", "not a run's"])
def test_the_ending_before_the_record_writes_nothing_where_the_run_could_not(
    tmp_path, case
) -> None:
    """A completed run is never rewritten; a run.dir the run would have been refused (held by
    a live job, or holding files that are not a run's) is not touched."""
    d = tmp_path / "run"
    d.mkdir()
    if case == "completed":
        (d / "summary.json").write_text(json.dumps({"status": "completed", "epochs_completed": 3}))
    elif case == "another job's":
        holder = subprocess.Popen(["sleep", "600"])
        with open(f"/proc/{holder.pid}/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19])
        (d / LOCK_NAME).write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(),
                                               "start_time": started, "time": "now"}))  # fmt: skip
        (d / "summary.json").write_text(json.dumps({"status": "running"}))
    else:
        (d / "thesis.tex").write_text("mine")
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    try:
        said = end_before_start(str(d), False, 2, 6, {"status": "failed", "error": "x"})
    finally:
        if case == "another job's":
            holder.kill()
            holder.wait()
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before, said
    assert ("left as it is" if case == "completed" else "nothing was written") in said, said
