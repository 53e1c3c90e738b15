"""Experiment tracking with MLflow (`logging.mlflow: true`): one MLflow run per run.dir,
whatever happens to it, against a real `mlflow server` on 127.0.0.1 with a SQLite store.

One run.dir lives through three 2-worker jobs of `hvd-train launch` (tracked, below), the
server given by MLflow's own variables: the first loses its server after epoch 1 and trains on;
the server back, the second continues the run with a raised train.epochs and completes; the
third, continued again, has rank 1 killed. Skipped where MLflow's client or the tests' server is
not installed (`HVD_TRAIN_MLFLOW=server make install`; `make test` installs both).
"""

from __future__ import annotations

import csv
import json
import os
import pathlib
import signal
import time

import pytest
from harness import PYTHON, QUICKSTART, finish, run, start, workers
from mlflow_server import QUIET, server, unavailable
from sshd import free_port

from hvd_train.config import LoggingConfig
from hvd_train.record import mlflow_run
from hvd_train.record.summary import problems

needs_server = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
needs_client = pytest.mark.skipif(unavailable(server=False) is not None,
                                  reason=str(unavailable(server=False)))  # fmt: skip
EXPERIMENT = "hvd_train tests"
COMMON = ["logging.tensorboard=false", "logging.mlflow=true", "model.dropout=0"]
JOB_LIMIT_S = 300


def launch(run_dir: pathlib.Path, *overrides: str) -> list[str]:
    """`hvd-train launch` of the quickstart (digits) at 2 workers into `run_dir`."""
    sets = [x for o in (*COMMON, f"run.dir={run_dir}", *overrides) for x in ("--set", o)]
    return [PYTHON, "-m", "hvd_train", "launch", "--np", "2", "--gloo",
            "--config", str(QUICKSTART), *sets]  # fmt: skip


def summary(run_dir: pathlib.Path) -> dict:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def wait_until(condition, what: str, proc=None, timeout: float = 240, every: float = 0.02):
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc is None or proc.poll() is None, f"the job ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(every)


def ended(run_dir: pathlib.Path, proc) -> dict:
    """The job's output and exit code, once it and its record have ended (rank 0's keeper may
    write the ending a moment after the job)."""
    result = finish(proc, JOB_LIMIT_S)
    wait_until(lambda: summary(run_dir).get("status") not in (None, "running")
               and not (run_dir / ".hvd_train.lock").exists(), "ending of the record")  # fmt: skip
    s = summary(run_dir)
    assert problems(s) == [], problems(s)
    return {"summary": s, "output": result.stdout + result.stderr, "code": result.returncode}


def mlflow_runs(uri: str) -> list:
    """The runs of the tests' experiment at `uri`, MLflow's client asking."""
    tracker, _ = mlflow_run.client(uri)
    experiment = tracker.get_experiment_by_name(EXPERIMENT)
    return tracker.search_runs([experiment.experiment_id]) if experiment else []


def history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    tracker, _ = mlflow_run.client(uri)
    return sorted((m.step, m.value) for m in tracker.get_metric_history(run_id, key))


def artifact_text(uri: str, run_id: str, name: str, folder: pathlib.Path) -> str:
    mlflow_run.client(uri)  # MLflow's variables set before it loads
    from mlflow.artifacts import download_artifacts

    path = download_artifacts(run_id=run_id, artifact_path=name, dst_path=str(folder),
                              tracking_uri=uri)  # fmt: skip
    return pathlib.Path(path).read_text()


def metrics_csv(run_dir: pathlib.Path, column: str) -> list[tuple[int, float]]:
    with open(run_dir / "metrics.csv") as f:
        return [(int(r["epoch"]), float(r[column])) for r in csv.DictReader(f)]


@pytest.fixture(scope="module")
def tracked(tmp_path_factory) -> dict:
    """The three jobs of one run.dir, and what the record and the MLflow server said after
    each. The server is given by MLFLOW_TRACKING_URI and MLFLOW_EXPERIMENT_NAME alone."""
    root = tmp_path_factory.mktemp("mlflow")
    run_dir = root / "run"
    seen: dict = {"run_dir": run_dir, "root": root}
    with server(root / "server") as s:
        env = {"MLFLOW_TRACKING_URI": s.uri, "MLFLOW_EXPERIMENT_NAME": EXPERIMENT, **QUIET}
        seen["uri"] = s.uri
        # 1: the server killed once epoch 1 has ended; epochs 2 and 3 are trained without it.
        proc = start(launch(run_dir, "train.epochs=3"), root, env)
        wait_until(lambda: summary(run_dir).get("epochs_completed", 0) >= 1, "epoch 1", proc)
        s.kill()
        seen["lost"] = ended(run_dir, proc)
        # 2: the server back (same store, same port); train.epochs raised: the run continues.
        s.start()
        seen["continued"] = ended(run_dir, start(launch(run_dir, "train.epochs=4"), root, env))
        seen["runs_after_continued"] = mlflow_runs(s.uri)
        run_id = seen["continued"]["summary"]["mlflow"]["run_id"]
        seen["history_after_continued"] = history(s.uri, run_id, "val_accuracy")
        # 3: continued again; rank 1 killed as soon as rank 0 has set the MLflow run running.
        proc = start(launch(run_dir, "train.epochs=6"), root, env)
        wait_until(lambda: summary(run_dir).get("status") == "running"
                   and {r.info.status for r in mlflow_runs(s.uri)} == {"RUNNING"},
                   "the MLflow run continued", proc, every=0.2)  # fmt: skip
        os.kill(workers(str(run_dir))[1], signal.SIGKILL)
        seen["killed"] = ended(run_dir, proc)
        # The launcher has set the MLflow run's status, or rank 0's keeper is about to.
        wait_until(lambda: {r.info.status for r in mlflow_runs(s.uri)} != {"RUNNING"},
                   "status of the MLflow run", timeout=60, every=0.2)  # fmt: skip
        seen["runs_after_killed"] = mlflow_runs(s.uri)
        seen["history"] = history(s.uri, run_id, "val_accuracy")
        seen["examples_per_sec"] = history(s.uri, run_id, "examples_per_sec")
        seen["artifacts"] = sorted(
            a.path for a in mlflow_run.client(s.uri)[0].list_artifacts(run_id)
        )
        seen["summary_artifact"] = json.loads(
            artifact_text(s.uri, run_id, "summary.json", root / "downloaded")
        )
    return seen


@pytest.mark.processes
@needs_server
@pytest.mark.multiworker
def test_a_server_lost_mid_run_neither_stops_the_training_nor_goes_unrecorded(tracked) -> None:
    """Job 1, its server killed after epoch 1, trains to its end; rank 0 says so once on the
    console, and summary.json keeps why and the points it could not send (epochs 2 and 3)."""
    job = tracked["lost"]
    s = job["summary"]
    assert job["code"] == 0, job["output"][-4000:]
    assert (s["status"], s["epochs_completed"]) == ("completed", 3), s
    assert "Connection refused" in s["mlflow"]["lost"], s["mlflow"]
    assert job["output"].count("stopped answering") == 1, job["output"][-4000:]
    assert "Retrying" not in job["output"], job["output"][-4000:]  # MLflow's HTTP client's
    unsent = {(p["key"], p["step"]) for p in s["mlflow"]["unsent_metrics"]}
    assert {("val_accuracy", 2), ("val_accuracy", 3), ("examples_per_sec", 3)} <= unsent, unsent


@pytest.mark.processes
@needs_server
@pytest.mark.multiworker
def test_a_continued_run_is_one_finished_mlflow_run_whose_history_goes_on(tracked) -> None:
    """Job 2, train.epochs raised from 3 to 4: the same MLflow run, FINISHED, with a point per
    epoch over both jobs (job 1's unsent points sent now), the parameters, tags and files."""
    job, run_dir = tracked["continued"], tracked["run_dir"]
    s = job["summary"]
    assert job["code"] == 0, job["output"][-4000:]
    assert s["status"] == "completed" and s["epochs_completed"] == 4, s
    assert "lost" not in s["mlflow"] and "unsent_metrics" not in s["mlflow"], s["mlflow"]
    (run,) = tracked["runs_after_continued"]  # one run for the run.dir
    assert (
        run.info.run_id == tracked["lost"]["summary"]["mlflow"]["run_id"] == s["mlflow"]["run_id"]
    )
    assert run.info.status == "FINISHED", run.info
    assert run.info.run_name == "run"
    steps = tracked["history_after_continued"]
    assert {step for step, _ in steps} == {1, 2, 3, 4}, steps
    for step, value in steps:  # job 1's points (sent then, or kept and sent by job 2) and job 2's
        assert value == pytest.approx(dict(metrics_csv(run_dir, "val_accuracy"))[step], rel=1e-5)
    params, tags = run.data.params, run.data.tags
    # The first job's parameters; MLflow never changes one: what changed is a `latest.` tag.
    assert (params["train.epochs"], tags["latest.train.epochs"]) == ("3", "4"), (params, tags)
    assert (params["world_size"], params["per_worker_batch_size"]) == ("2", "32"), params
    assert (params["global_batch_size"], params["logging.mlflow"]) == ("64", "true"), params
    assert float(params["scaled_learning_rate"]) == s["scaled_learning_rate"], params
    assert params["versions.tensorflow"] == s["versions"]["tensorflow"], params
    assert (tags["controller"], tags["device"]) == ("gloo", "cpu"), tags
    assert tags["run.dir"] == str(run_dir), tags
    assert run.data.metrics["final/val_accuracy"] == pytest.approx(
        s["final_metrics"]["val_accuracy"]
    )
    assert run.data.metrics["train_examples_per_sec"] == pytest.approx(s["train_examples_per_sec"])


@pytest.mark.processes
@needs_server
@pytest.mark.multiworker
def test_a_killed_worker_ends_the_mlflow_run_failed(tracked) -> None:
    """Job 3, continued with train.epochs 6, its rank 1 killed: the record says `failed`, and
    so does the same MLflow run, which keeps every point, and summary.json, config.yaml and the
    model job 2 sent."""
    job = tracked["killed"]
    s = job["summary"]
    assert s["status"] == "failed" and s["failed_rank"] == 1, s
    (run,) = tracked["runs_after_killed"]
    assert run.info.run_id == s["mlflow"]["run_id"] and run.info.status == "FAILED", run.info
    assert {step for step, _ in tracked["history"]} >= {1, 2, 3, 4}, tracked["history"]
    assert {step for step, _ in tracked["examples_per_sec"]} >= {1, 2, 3, 4}
    assert tracked["artifacts"] == ["config.yaml", "model.keras", "summary.json"]
    # The last summary.json rank 0 sent: job 3's (`failed`), or job 2's when rank 0 was ended
    # before it could send (its keeper or the launcher then set the status alone).
    uploaded = tracked["summary_artifact"]
    assert uploaded["status"] in ("failed", "completed"), uploaded
    assert uploaded["mlflow"]["run_id"] == run.info.run_id, uploaded


@pytest.mark.processes
@needs_server
@pytest.mark.multiworker
def test_a_server_unreachable_at_start_is_one_line_and_exit_2(tmp_path) -> None:
    """Nothing listens at the URI: `hvd-train launch` says so in one line and starts no job;
    a worker started without it (horovodrun's, or alone) does the same before run.dir exists."""
    uri = f"http://127.0.0.1:{free_port()}"
    run_dir = tmp_path / "run"
    expected = (f"hvd_train: error: logging.mlflow: cannot reach the MLflow tracking server at "
                f"{uri} ([Errno 111] Connection refused): start it, point MLFLOW_TRACKING_URI (or "
                "logging.mlflow_tracking_uri) at one that answers, or set logging.mlflow: false")  # fmt: skip
    launched = run(launch(run_dir, f"logging.mlflow_tracking_uri={uri}"), tmp_path, env=QUIET)
    assert launched.returncode == 2, launched.stdout + launched.stderr
    assert launched.stderr.strip().splitlines() == [expected], launched.stderr
    assert not run_dir.exists()
    alone = run([PYTHON, "-m", "hvd_train", "--config", str(QUICKSTART), "--set",
                 f"run.dir={run_dir}", *[x for o in COMMON for x in ("--set", o)],
                 "--set", f"logging.mlflow_tracking_uri={uri}"], tmp_path, env=QUIET)  # fmt: skip
    assert alone.returncode == 2, alone.stdout + alone.stderr
    assert alone.stderr.strip().splitlines() == [expected], alone.stderr
    assert not run_dir.exists()


@needs_client
def test_the_mlflow_status_follows_the_record(tmp_path) -> None:
    """What the keeper and `hvd-train launch` do after rank 0: the MLflow run (here in MLflow's
    local store, SQLite, no server) gets the status of the record's ending, and none while it
    runs."""
    place = mlflow_run.Where(f"sqlite:///{tmp_path}/mlflow.db", EXPERIMENT)
    target = mlflow_run.Target(place, "run", {})
    sender = mlflow_run.start(target, {"a": "1"}, {"b": "2"}, say=print)
    sender.close()
    run_id = sender.run_id
    tracker, _ = mlflow_run.client(place.uri)
    record = tmp_path / "summary.json"
    for status, expected in [("running", "RUNNING"), ("interrupted", "KILLED"),
                             ("failed", "FAILED"), ("completed", "FINISHED")]:  # fmt: skip
        record.write_text(json.dumps({"status": status, "mlflow": sender.fields()}))
        said = mlflow_run.follow_record(str(tmp_path), place.uri)
        assert said == ("" if status == "running" else expected)
        assert tracker.get_run(run_id).info.status == expected, status
    assert tracker.get_run(run_id).data.params == {"a": "1"}


@needs_client
def test_a_lost_server_is_said_once_and_every_later_point_is_kept() -> None:
    """The sender's thread meets a failure: one line, and from then on every point is kept
    (none is sent, none is waited for), for summary.json."""

    class Refusing:
        calls = 0

        def log_batch(self, *args, **kwargs):
            Refusing.calls += 1
            raise OSError("[Errno 111] Connection refused")

    said, changes = [], []
    sender = mlflow_run.Sender(Refusing(), "http://u:secret@127.0.0.1:1", said.append,
                               changes.append)  # fmt: skip
    sender.identify(run_id="r1")
    sender.log_epoch(1, {"loss": 1.0})
    sender.flush(30)
    for epoch in (2, 3):
        sender.log_epoch(epoch, {"loss": 1.0 / epoch, "val_loss": 2.0})
    sender.close()
    assert Refusing.calls == 1
    assert len(said) == 1 and "MLflow at http://127.0.0.1:1 stopped answering" in said[0], said
    fields = sender.fields()
    assert fields["lost"] == "at epoch 1: [Errno 111] Connection refused", fields
    assert [(p["key"], p["step"]) for p in fields["unsent_metrics"]] == [
        ("loss", 1), ("loss", 2), ("val_loss", 2), ("loss", 3), ("val_loss", 3)
    ]  # fmt: skip
    assert changes[-1] == fields and "secret" not in json.dumps(fields)


def test_the_config_keys_win_over_mlflow_s_variables() -> None:
    """logging.mlflow_tracking_uri and logging.mlflow_experiment_name win over
    MLFLOW_TRACKING_URI and MLFLOW_EXPERIMENT_NAME; with neither, MLflow's own defaults."""
    environ = {"MLFLOW_TRACKING_URI": "http://env:5000", "MLFLOW_EXPERIMENT_NAME": "env"}
    assert mlflow_run.where(LoggingConfig(), environ) == mlflow_run.Where("http://env:5000", "env")
    keys = LoggingConfig(mlflow_tracking_uri="http://key:5000", mlflow_experiment_name="key")
    assert mlflow_run.where(keys, environ) == mlflow_run.Where("http://key:5000", "key")
    assert mlflow_run.where(LoggingConfig(), {}) == mlflow_run.Where(None, None)  # MLflow's own
