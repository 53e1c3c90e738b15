"""`hvd-train launch` never calls a stopped job completed, whatever its launcher's exit code
(a Horovod without patches/horovod-0.28.1 may exit 0 after a Ctrl-C), and ends a stop it
passed on with 128 + the signal, not with horovodrun's code for the workers it stopped."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from harness import QUICKSTART, ROOT

from hvd_train.commands import launch as launch_command
from hvd_train.config import load_config
from hvd_train.launcher import launch


class StoppedJob:
    """The supervisor of a job that a stop (Ctrl-C by default) ended with `code`."""

    code = 0
    signum = signal.SIGINT
    record: tuple | None = None  # (summary.json, its status): what the job's rank 0 writes

    def __init__(self) -> None:
        self.stop_signal = 0

    def run(self, cmd, env=None, tidy=None) -> tuple[int, str]:
        if self.record:
            path, status = self.record
            path.write_text(json.dumps({"status": status, "started_at": 2.0}))
        self.stop_signal = self.signum
        return self.code, ""


@pytest.mark.parametrize(("status", "code"), [("interrupted", 130), ("completed", 0)])
def test_a_job_stopped_then_exiting_0_exits_as_its_record_says(
    tmp_path, monkeypatch, capsys, status, code
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"status": "failed", "started_at": 1.0}))
    job = type("Job", (StoppedJob,), {"record": (run_dir / "summary.json", status)})
    monkeypatch.setattr(launch, "Supervisor", job)
    argv = ["--config", str(QUICKSTART), "--np", "2", "--set", f"run.dir={run_dir}"]
    assert launch_command.main(argv, "hvd-train launch") == code
    said = capsys.readouterr().err
    assert ("job completed" in said) == (status == "completed"), said
    assert json.loads((run_dir / "summary.json").read_text())["status"] == status


@pytest.mark.parametrize("horovodrun_code", [143, 1])
@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGUSR1, 138)]
)
def test_a_stopped_job_that_horovodrun_ends_as_failed_exits_128_plus_the_signal(
    tmp_path, monkeypatch, signum, code, horovodrun_code
) -> None:
    """What a patched horovodrun does after a stop: its workers exit 143, and it exits with
    that code (143), or with 1 where Horovod was patched before it passed the code on."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"status": "interrupted"}))
    job = type("Job", (StoppedJob,), {"code": horovodrun_code, "signum": signum})
    monkeypatch.setattr(launch, "Supervisor", job)
    argv = ["--config", str(QUICKSTART), "--np", "2", "--set", f"run.dir={run_dir}"]
    assert launch_command.main(argv, "hvd-train launch") == code
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"


def _failure(rank, rank_exit_code, error=None) -> dict:
    return {"rank": rank, "rank_exit_code": rank_exit_code, "error": error, "exit_code": 1}


@pytest.mark.parametrize(
    ("before", "failure", "stop", "after"),
    [
        # rank 0 took horovodrun's SIGTERM, after rank 1 died, for a stop
        ({"status": "interrupted", "stopped_by": "SIGTERM"}, _failure(1, 137), 0,
         {"status": "failed", "failed_rank": 1}),
        # a scheduler's SIGTERM to the workers themselves: a stop
        ({"status": "interrupted", "stopped_by": "SIGTERM"}, _failure(0, 143), 0,
         {"status": "interrupted", "stopped_by": "SIGTERM"}),
        # Slurm's warning (SIGUSR1), to the workers themselves: a stop too
        ({"status": "interrupted", "stopped_by": "SIGUSR1"}, _failure(1, 138), 0,
         {"status": "interrupted", "stopped_by": "SIGUSR1"}),
        # the launcher passed a stop on: the workers' failures only echo it
        ({"status": "failed"}, _failure(1, 137), signal.SIGINT,
         {"status": "interrupted", "stopped_by": "SIGINT"}),
        # no record yet: the launcher writes one
        (None, _failure(1, 137), 0, {"status": "failed", "failed_rank": 1,
                                     "recorded_by": "launcher", "epochs_completed": 0}),
        (None, _failure(1, -9), signal.SIGTERM, {"status": "interrupted", "stopped_by": "SIGTERM",
                                                  "recorded_by": "launcher"}),
    ],
)  # fmt: skip
def test_the_launcher_makes_the_record_say_how_the_attempt_ended(
    tmp_path, before, failure, stop, after
) -> None:
    run_dir = tmp_path / "run"
    path = run_dir / "summary.json"
    if before is not None:
        run_dir.mkdir()
        path.write_text(json.dumps(before))
    cfg = load_config(str(QUICKSTART), [f"run.dir={run_dir}"])
    launch.mark_ended(str(path), failure, stop, cfg, 2)
    got = json.loads(path.read_text())
    assert {k: got.get(k) for k in after} == after, got
    if after["status"] == "failed":
        assert "stopped_by" not in got and got["failure"].startswith("rank 1 failed first"), got


@pytest.mark.parametrize("case", ["user error", "foreign files"])
def test_the_launcher_writes_no_record_where_the_job_was_refused(tmp_path, case) -> None:
    """Exit code 2 (a bad config, run.dir another job's): nothing of the job's is in run.dir.
    A folder with files that are not a run's gets none either."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if case == "foreign files":
        (run_dir / "notes.txt").write_text("mine")
    failure = _failure(0, 2 if case == "user error" else 137)
    cfg = load_config(str(QUICKSTART), [f"run.dir={run_dir}"])
    launch.mark_ended(str(run_dir / "summary.json"), failure, 0, cfg, 2)
    assert not (run_dir / "summary.json").exists()


# ------------------------------------------------------------ the supervisor passes SIGUSR1 on
# A stand-in for horovodrun (Gloo): it starts one "worker" and exits with its code; it does not
# handle SIGUSR1 (as horovodrun does not: the signal would end it, exit code -10), and on
# SIGTERM says so and ends its worker. The worker carries HOROVOD_RANK as horovodrun's do (or
# not: then no worker runs on this host).
FAKE_HOROVODRUN = """
import os, signal, subprocess, sys
def term(signum, frame):
    print("horovodrun: TERM", flush=True)
    worker.kill()
    sys.exit(143)
env = dict(os.environ)
if {local_worker}:
    env["HOROVOD_RANK"] = "0"
worker = subprocess.Popen([sys.executable, "-c", {worker!r}], env=env)
signal.signal(signal.SIGTERM, term)
sys.exit(worker.wait())
"""
FAKE_WORKER = """
import os, signal, sys, time
def stop(signum, frame):
    print(f"worker: {{signal.Signals(signum).name}}", flush=True)
    sys.exit(128 + signum)
signal.signal(signal.SIGUSR1, stop)
open({ready!r}, "w").close()
time.sleep(60)
"""
SUPERVISED = """
import sys
sys.path.insert(0, {root!r})
from hvd_train.launcher.supervise import Supervisor
s = Supervisor()
code, _ = s.run([sys.executable, "-c", {horovodrun!r}])
print(f"code={{code}} stop_signal={{s.stop_signal}}", flush=True)
"""


@pytest.mark.processes
@pytest.mark.parametrize("local_worker", [True, False])
def test_slurms_warning_signal_reaches_the_workers_here_not_horovodrun(
    tmp_path, local_worker
) -> None:
    """SIGUSR1 to the launcher goes to the workers on its host (horovodrun would die of it);
    with none here, horovodrun gets the SIGTERM it passes on."""
    ready = tmp_path / "ready"
    worker = FAKE_WORKER.format(ready=str(ready))
    fake = FAKE_HOROVODRUN.format(local_worker=local_worker, worker=worker)
    code = SUPERVISED.format(root=str(ROOT), horovodrun=fake)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    if local_worker:
        assert "worker: SIGUSR1" in out and "code=138 stop_signal=10" in out, out
    else:
        assert "horovodrun: TERM" in out and "code=143 stop_signal=10" in out, out
