"""Weights & Biases beside MLflow (`logging.wandb: true`): one W&B run per run.dir, written
offline (no network) and read back from what wandb wrote, its transaction log (wandb_log.py).

Single-process jobs of the quickstart (digits, seconds each): a run of 2 epochs then continued
to 3 (the same W&B run), a run whose loss turns NaN (failed), a run stopped by SIGTERM
(interrupted, exit code 143). Skipped where wandb is not installed (`HVD_TRAIN_WANDB=1 make
install`; `make test` installs it).
"""

from __future__ import annotations

import csv
import json
import pathlib
import signal
import time

import pytest
from harness import PYTHON, QUICKSTART, WORKERS, finish, run, start
from sshd import free_port
from wandb_log import read, unavailable

from hvd_train.base.errors import UserError
from hvd_train.config import LoggingConfig
from hvd_train.record import wandb_run
from hvd_train.record.summary import problems

needs_wandb = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
COMMON = ["logging.tensorboard=false", "logging.wandb=true", "model.dropout=0",
          "train.verbose=false"]  # fmt: skip
# Synthetic 32x32x3 data, 24 steps an epoch: epochs long enough for a stop to land in one.
LONG = ["data.source=synthetic", "train.epochs=6", "train.steps_per_epoch=24",
        "data.val_examples=256"]  # fmt: skip
JOB_LIMIT_S = 300


def wandb_env(root: pathlib.Path) -> dict[str, str]:
    """W&B's folders in the test's, so nothing is read from or written to the home folder."""
    return {"WANDB_DIR": str(root / "wandb"), "WANDB_CACHE_DIR": str(root / "wandb-cache"),
            "WANDB_CONFIG_DIR": str(root / "wandb-config"),
            "WANDB_DATA_DIR": str(root / "wandb-data")}  # fmt: skip


def train(run_dir: pathlib.Path, *overrides: str) -> list[str]:
    sets = [x for o in (*COMMON, f"run.dir={run_dir}", *overrides) for x in ("--set", o)]
    return [PYTHON, "-m", "hvd_train", "--config", str(QUICKSTART), *sets]


def summary(run_dir: pathlib.Path) -> dict:
    s = json.loads((run_dir / "summary.json").read_text())
    assert problems(s) == [], problems(s)
    return s


def metrics_csv(run_dir: pathlib.Path) -> list[dict[str, float]]:
    with open(run_dir / "metrics.csv") as f:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def job(cmd: list[str], cwd: pathlib.Path, env: dict[str, str]) -> dict:
    result = run(cmd, cwd, JOB_LIMIT_S, env)
    return {"code": result.returncode, "output": result.stdout + result.stderr}


@pytest.fixture(scope="module")
def tracked(tmp_path_factory) -> dict:
    """One run.dir through two jobs: 2 epochs, then train.epochs raised to 3. Where it goes is
    given by W&B's own variables (WANDB_MODE, WANDB_PROJECT) alone."""
    root = tmp_path_factory.mktemp("wandb")
    run_dir = root / "run"
    env = {**wandb_env(root), "WANDB_MODE": "offline", "WANDB_PROJECT": "hvd_train-tests"}
    seen: dict = {"run_dir": run_dir}
    seen["first"] = job(train(run_dir, "train.epochs=2"), root, env)
    seen["first_summary"] = summary(run_dir)
    seen["first_logged"] = read(seen["first_summary"]["wandb"]["dir"])
    seen["continued"] = job(train(run_dir, "train.epochs=3"), root, env)
    seen["summary"] = summary(run_dir)
    seen["logged"] = read(seen["summary"]["wandb"]["dir"])
    return seen


@pytest.mark.processes
@needs_wandb
def test_a_completed_run_logs_its_config_each_epoch_and_its_summary(tracked) -> None:
    """Job 1: the resolved config and the job's figures, one row per epoch equal to
    metrics.csv's (every column), summary.json's status and fields, the model as an artifact,
    and the W&B run finished (exit code 0)."""
    first, s, w = tracked["first"], tracked["first_summary"], tracked["first_logged"]
    assert first["code"] == 0, first["output"][-4000:]
    assert s["status"] == "completed" and s["epochs_completed"] == 2, s
    assert s["wandb"]["mode"] == "offline" and s["wandb"]["project"] == "hvd_train-tests", s
    assert (w.run_id, w.project, w.name) == (s["wandb"]["run_id"], "hvd_train-tests", "run")
    assert w.config["train"]["epochs"] == 2 and w.config["train"]["batch_size"] == 32
    assert w.config["logging"]["wandb"] is True and w.config["model"]["dropout"] == 0
    assert w.config["job"]["world_size"] == 1 and w.config["job"]["global_batch_size"] == 32
    assert w.config["versions"]["tensorflow"] == s["versions"]["tensorflow"], w.config
    rows = metrics_csv(tracked["run_dir"])[:2]  # the run.dir's metrics.csv after job 2 too
    assert [int(r["epoch"]) for r in w.history] == [1, 2], w.history
    for row, logged in zip(rows, w.history, strict=True):
        assert set(row) == set(logged), (row, logged)  # the same columns, throughput included
        for key, value in row.items():
            assert logged[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert w.summary["status"] == "completed" and w.summary["epochs_completed"] == 2
    assert w.summary["final/val_accuracy"] == pytest.approx(s["final_metrics"]["val_accuracy"])
    assert w.summary["train_examples_per_sec"] == pytest.approx(s["train_examples_per_sec"])
    assert w.summary["world_size"] == 1 and w.summary["controller"] == "none", w.summary
    assert w.artifacts == [{"name": "run-model", "type": "model", "files": ["model.keras"]}]
    assert w.exit_code == 0


@pytest.mark.processes
@needs_wandb
def test_a_continued_run_continues_the_same_wandb_run(tracked) -> None:
    """Job 2, train.epochs raised from 2 to 3: the same W&B run id (kept in summary.json), its
    config updated, epoch 3 logged as metrics.csv has it, and finished again."""
    job2, s, w = tracked["continued"], tracked["summary"], tracked["logged"]
    assert job2["code"] == 0, job2["output"][-4000:]
    assert s["status"] == "completed" and s["epochs_completed"] == 3, s
    first_id = tracked["first_summary"]["wandb"]["run_id"]
    assert s["wandb"]["run_id"] == first_id == w.run_id, (s["wandb"], w.run_id)
    assert s["wandb"]["dir"] != tracked["first_summary"]["wandb"]["dir"]  # each job its folder
    assert w.config["train"]["epochs"] == 3, w.config["train"]
    (row,) = metrics_csv(tracked["run_dir"])[2:]
    assert w.by_epoch("val_accuracy") == {3: pytest.approx(row["val_accuracy"], rel=1e-5)}
    assert w.summary["status"] == "completed" and w.summary["epochs_completed"] == 3
    assert w.exit_code == 0


@pytest.mark.processes
@needs_wandb
def test_a_failed_run_ends_its_wandb_run_failed(tmp_path) -> None:
    """A NaN loss at epoch 2: the record says failed, the W&B run ends with exit code 1 (W&B's
    `failed`), its summary holding the error, after epoch 1's row."""
    run_dir = tmp_path / "run"
    env = {**wandb_env(tmp_path), "FAULTY_RANK": "0", "FAULTY_AFTER_STEPS": "50"}
    done = job(train(run_dir, "model.factory=faulty_models:nan_on_one_rank",
                     "logging.wandb_mode=offline", "logging.wandb_project=failing"),
               WORKERS, env)  # fmt: skip
    assert done["code"] == 1, done["output"][-4000:]
    s = summary(run_dir)
    assert s["status"] == "failed" and s["error_type"] == "TrainingError", s
    w = read(s["wandb"]["dir"])
    assert w.project == "failing" and w.exit_code == 1, w
    assert w.summary["status"] == "failed" and w.summary["error_type"] == "TrainingError"
    assert "NaN" in w.summary["error"], w.summary
    assert sorted(w.by_epoch("loss")) == [1], w.history
    assert w.artifacts == []  # a model only for a completed run


@pytest.mark.processes
@needs_wandb
def test_a_stopped_run_ends_its_wandb_run_with_the_stop_s_exit_code(tmp_path) -> None:
    """SIGTERM after epoch 1: the record says interrupted (stopped by SIGTERM), and the W&B run
    ends with exit code 143, the job's own, holding the epochs trained."""
    run_dir = tmp_path / "run"
    proc = start(train(run_dir, *LONG, "logging.wandb_mode=offline"), tmp_path,
                 wandb_env(tmp_path))  # fmt: skip
    deadline = time.monotonic() + JOB_LIMIT_S
    while not (run_dir / "metrics.csv").exists() or len(metrics_csv(run_dir)) < 1:
        assert proc.poll() is None, "the job ended before the stop"
        assert time.monotonic() < deadline, "no epoch 1"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    done = finish(proc, JOB_LIMIT_S)
    assert done.returncode == 143, done.stdout + done.stderr
    s = summary(run_dir)
    assert s["status"] == "interrupted" and s["stopped_by"] == "SIGTERM", s
    w = read(s["wandb"]["dir"])
    assert w.exit_code == 143, w
    assert w.summary["status"] == "interrupted" and w.summary["stopped_by"] == "SIGTERM"
    epochs = [int(r["epoch"]) for r in metrics_csv(run_dir)]
    assert sorted(w.by_epoch("loss")) == epochs and epochs[0] == 1, (w.history, epochs)


@pytest.mark.processes
@needs_wandb
def test_w_and_b_unreachable_online_is_one_line_and_exit_2(tmp_path) -> None:
    """Online, with nothing listening at WANDB_BASE_URL: one line, exit code 2, and run.dir
    never made."""
    url = f"http://127.0.0.1:{free_port()}"
    run_dir = tmp_path / "run"
    done = run(train(run_dir, "logging.wandb_mode=online"), tmp_path,
               env={**wandb_env(tmp_path), "WANDB_BASE_URL": url})  # fmt: skip
    expected = (f"hvd_train: error: logging.wandb: cannot reach W&B at {url} ([Errno 111] "
                "Connection refused): point WANDB_BASE_URL at a server that answers, set "
                "logging.wandb_mode: offline (and `wandb sync` later), or set logging.wandb: "
                "false")  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [expected], done.stderr
    assert not run_dir.exists()


def test_offline_needs_no_network_and_online_checks_the_server() -> None:
    """check_reachable: offline asks nothing; online, a refused connection is one UserError."""
    if unavailable() is not None:
        pytest.skip(unavailable())
    wandb_run.check_reachable(wandb_run.Where(None, None, "offline"), {"WANDB_BASE_URL": "x:"})
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(UserError, match=r"cannot reach W&B at http://127\.0\.0\.1:\d+ \("):
        wandb_run.check_reachable(wandb_run.Where(None, None, "online"), {"WANDB_BASE_URL": url})


def test_the_config_keys_win_over_w_and_b_s_variables() -> None:
    """logging.wandb_project, _entity and _mode win over WANDB_PROJECT, WANDB_ENTITY and
    WANDB_MODE; with neither, W&B's defaults (online)."""
    environ = {"WANDB_PROJECT": "env", "WANDB_ENTITY": "team", "WANDB_MODE": "offline"}
    assert wandb_run.where(LoggingConfig(), environ) == wandb_run.Where("env", "team", "offline")
    keys = LoggingConfig(wandb_project="key", wandb_entity="me", wandb_mode="online")
    assert wandb_run.where(keys, environ) == wandb_run.Where("key", "me", "online")
    assert wandb_run.where(LoggingConfig(), {}) == wandb_run.Where(None, None, "online")


def test_a_failing_w_and_b_is_said_once_and_never_called_again() -> None:
    """W&B's client raises at epoch 1: one line, summary.json's `lost`, and no further call
    (training goes on); the W&B run still ends, with the record's exit code."""

    class Failing:
        id, project, entity, dir = "r1", "p", "", "/w/offline-run-1/files"
        logs = 0
        finished: list[int] = []

        def log(self, values):
            Failing.logs += 1
            raise OSError("[Errno 111] Connection refused")

        def finish(self, exit_code):
            Failing.finished.append(exit_code)

    said, changes = [], []
    place = wandb_run.Where("p", None, "online")
    tracked = wandb_run.WandbRun(Failing(), place, said.append, changes.append)
    for epoch in (1, 2, 3):
        tracked.log_epoch(epoch, {"loss": 1.0 / epoch})
    assert Failing.logs == 1
    assert len(said) == 1 and "W&B (online) failed (at epoch 1: [Errno 111]" in said[0], said
    fields = tracked.fields()
    assert fields["lost"] == "at epoch 1: [Errno 111] Connection refused", fields
    assert (fields["run_id"], fields["dir"]) == ("r1", "/w/offline-run-1"), fields
    assert changes == [fields]
    assert tracked.end(wandb_run.exit_code({"status": "failed"})) is False
    assert tracked.end(0) is False and Failing.finished == [1]  # ended once


def test_the_exit_code_follows_the_record() -> None:
    assert wandb_run.exit_code({"status": "completed"}) == 0
    assert wandb_run.exit_code({"status": "failed"}) == 1
    assert wandb_run.exit_code({"status": "interrupted", "stopped_by": "SIGTERM"}) == 143
    assert wandb_run.exit_code({"status": "interrupted", "stopped_by": "SIGINT"}) == 130
    assert wandb_run.exit_code({"status": "running"}) == 1  # an ending never written
