"""`hvd-train launch` never calls a stopped job completed, whatever its launcher's exit code
(a Horovod without scripts/patch_horovod.py may exit 0 after a Ctrl-C), and ends a stop it
passed on with 128 + the signal, not with horovodrun's 1 for the workers it stopped."""

from __future__ import annotations

import json
import signal

import pytest
from harness import QUICKSTART

from hvd_train import launch


class StoppedJob:
    """The supervisor of a job that a stop (Ctrl-C by default) ended with `code`."""

    code = 0
    signum = signal.SIGINT

    def __init__(self) -> None:
        self.stop_signal = 0

    def run(self, cmd, env=None, tidy=None) -> tuple[int, str]:
        self.stop_signal = self.signum
        return self.code, ""


@pytest.mark.parametrize(("status", "code"), [("interrupted", 130), ("completed", 0)])
def test_a_job_stopped_then_exiting_0_exits_as_its_record_says(
    tmp_path, monkeypatch, capsys, status, code
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"status": status}))
    monkeypatch.setattr(launch, "Supervisor", StoppedJob)
    argv = ["--config", str(QUICKSTART), "--np", "2", "--set", f"run.dir={run_dir}"]
    assert launch.main(argv, "hvd-train launch") == code
    said = capsys.readouterr().err
    assert ("job completed" in said) == (status == "completed"), said
    assert json.loads((run_dir / "summary.json").read_text())["status"] == status


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stopped_job_that_horovodrun_ends_with_1_exits_128_plus_the_signal(
    tmp_path, monkeypatch, signum, code
) -> None:
    """What a patched horovodrun does after a stop: its workers exit 143, so it exits 1."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"status": "interrupted"}))
    job = type("Job", (StoppedJob,), {"code": 1, "signum": signum})
    monkeypatch.setattr(launch, "Supervisor", job)
    argv = ["--config", str(QUICKSTART), "--np", "2", "--set", f"run.dir={run_dir}"]
    assert launch.main(argv, "hvd-train launch") == code
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
