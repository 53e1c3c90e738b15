"""`hvd-train launch` never calls a stopped job completed, whatever its launcher's exit code
(a Horovod without scripts/patch_horovod.py may exit 0 after a Ctrl-C)."""

from __future__ import annotations

import json
import signal

import pytest
from harness import QUICKSTART

from hvd_train import launch


class StoppedJob:
    """The supervisor of a job that a Ctrl-C stopped, and whose launcher exited 0."""

    def __init__(self) -> None:
        self.stop_signal = 0

    def run(self, cmd, env=None, tidy=None) -> tuple[int, str]:
        self.stop_signal = signal.SIGINT
        return 0, ""


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
