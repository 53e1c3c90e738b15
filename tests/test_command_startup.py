"""Every command that loads TensorFlow starts through one start-up
(hvd_train/commands/environment.py), which has set the environment when TensorFlow is first
imported: real processes, each ended at that import."""

from __future__ import annotations

import json
import pathlib

import pytest
from harness import PYTHON, QUICKSTART, WORKERS, check, run

pytestmark = pytest.mark.processes

# runtime.keras and runtime.device set so that the start-up leaves a mark in the environment:
# TF_USE_LEGACY_KERAS=1 (every command), CUDA_VISIBLE_DEVICES=-1 (a training worker's device).
SETTINGS = ["--set", "runtime.keras=tf_keras", "--set", "runtime.device=cpu"]
# What the start-up reads or writes, removed from the test's environment.
UNSET = ("TF_USE_LEGACY_KERAS", "CUDA_VISIBLE_DEVICES", "HVD_TRAIN_LAUNCHED_AT")


def fake_completed_run(root: pathlib.Path) -> pathlib.Path:
    """A run.dir that export takes for a completed run until TensorFlow loads: its config and
    a summary.json saying `completed`."""
    run_dir = root / "done"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(
        QUICKSTART.read_text() + "\nruntime:\n  keras: tf_keras\n  device: cpu\n"
    )
    (run_dir / "summary.json").write_text(json.dumps({"status": "completed"}))
    return run_dir


def state_at_import(argv: list[str], cwd: pathlib.Path) -> dict:
    """What `hvd-train ARGV` holds when it first imports TensorFlow (tests/workers/)."""
    proc = check(run([PYTHON, str(WORKERS / "state_at_tf_import.py"), *argv], cwd))
    found = [ln for ln in proc.stdout.splitlines() if ln.startswith("AT_IMPORT ")]
    assert found, proc.stdout + proc.stderr
    return json.loads(found[0].removeprefix("AT_IMPORT "))


def command_line(command: str, tmp_path: pathlib.Path) -> list[str]:
    config = ["--config", str(QUICKSTART), "--set", "run.dir=out", *SETTINGS]
    if command == "predict":
        return [command, *config, "--images", str(tmp_path), "--out", "p.csv"]
    if command == "export":
        return [command, str(fake_completed_run(tmp_path))]
    return [command, *config]


# command -> (a training worker's device set-up, stop handling and start-up marks)
COMMANDS = {
    "train": (True, True),
    "data-bench": (True, False),  # times the training step: a worker's device, no run to record
    "evaluate": (False, False),
    "predict": (False, False),
    "export": (False, False),
    "lr-plot": (False, False),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_command_sets_the_environment_before_tensorflow_loads(
    tmp_path, monkeypatch, command
) -> None:
    """Each command, alone, imports TensorFlow once its start-up has run: runtime.keras
    (TF_USE_LEGACY_KERAS), TensorFlow's start-up lines caught, the collector paused; and only
    where the command asks for them, a worker's device (CUDA_VISIBLE_DEVICES=-1 under
    runtime.device: cpu), the stop handling and the start-up mark."""
    for variable in UNSET:
        monkeypatch.delenv(variable, raising=False)
    worker, trains = COMMANDS[command]
    state = state_at_import(command_line(command, tmp_path), tmp_path)
    assert state["TF_USE_LEGACY_KERAS"] == "1", state
    assert state["stderr_caught"] and not state["collector_on"], state
    assert state["CUDA_VISIBLE_DEVICES"] == ("-1" if worker else None), state
    assert state["sigterm_handled"] is trains, state
    assert state["marks"] == (["config"] if trains else []), state
