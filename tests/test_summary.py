"""summary.json has one typed home (record/summary.py): `Summary` declares every field, and
`problems` finds what a record holds that the declaration does not allow."""

from __future__ import annotations

import json

from hvd_train.record.run_record import Opened, RunRecord
from hvd_train.record.summary import (
    Summary,
    earlier_job,
    early_summary,
    problems,
    read_summary,
    write_summary,
)


def test_a_field_not_declared_is_named_with_its_path() -> None:
    record = {
        "status": "failed",
        "launch": {"restarts": 0, "failures": [{"rank": 1, "attempt": 1, "tries": 2}]},
        "retries": 3,
    }
    assert problems(record) == [
        "launch.failures[0].tries: not a declared field",
        "retries: not a declared field",
    ]


def test_a_value_of_another_type_is_named_with_what_was_expected() -> None:
    record = {
        "world_size": "2",
        "controller": "slurm",
        "trained_from": {"epoch": 1, "step": 0.5},
        "final_metrics": {"loss": True},
        "stopped_at": 3,
    }
    assert problems(record) == [
        "world_size: expected int, got '2'",
        "controller: expected one of ('gloo', 'mpi', 'none'), got 'slurm'",
        "trained_from.step: expected int, got 0.5",
        "final_metrics.loss: expected float, got True",
        "stopped_at: expected Position | None, got 3",
    ]


def test_json_numbers_and_nulls_fit_where_declared() -> None:
    """A whole number is a float to JSON (a learning rate of 1); None fits an optional field."""
    record = {"base_learning_rate": 1, "stopped_at": None, "step_time_ms": None,
              "failed_rank": None, "earlier_jobs": [], "startup_s": {"config": 0.5}}  # fmt: skip
    assert problems(record) == []


def test_what_record_writes_itself_is_declared(tmp_path) -> None:
    """The records made without a run: a job's ending before its record, and what a resume
    keeps of an earlier job; both round-trip through write_summary and read_summary."""
    early = early_summary(2, 6, "launcher")
    earlier = {"started_at": 1.0, "status": "interrupted", "world_size": 2, "controller": "gloo",
               "epochs_completed": 1, "stopped_at": {"epoch": 2, "step": 3},
               "trained_from": {"epoch": 1, "step": 0}, "error": "x", "device": "cpu"}  # fmt: skip
    record: Summary = {**early, "earlier_jobs": [earlier_job(earlier)]}
    path = tmp_path / "summary.json"
    write_summary(str(path), record)
    assert read_summary(str(path)) == json.loads(path.read_text()) == record
    assert problems(record) == []
    assert "error" not in record["earlier_jobs"][0]


def test_an_unreadable_record_reads_as_empty(tmp_path) -> None:
    path = tmp_path / "summary.json"
    assert read_summary(str(path)) == {}
    path.write_text("[1, 2]")
    assert read_summary(str(path)) == {}
    path.write_text('{"status": "runn')
    assert read_summary(str(path)) == {}


# The one writer of the running record (record/run_record.py RunRecord), in-process: its keeper
# is not started (RunRecord.start), so only its writes are tested here; test_rerun and
# test_faults run it in real jobs.

EARLIER = {"started_at": 1.0, "status": "interrupted", "world_size": 2, "epochs_completed": 3}
SO_FAR = {"epochs_completed": 3, "last_checkpoint": "ckpt-3", "final_metrics": {"loss": 0.5},
          "model_path": None, "best_model_path": "best.keras"}  # fmt: skip
BASE = {"status": "running", "epochs": 6, "epochs_completed": 0, "last_checkpoint": None,
        "model_path": None}  # fmt: skip


def _opened_record(tmp_path, stack=None) -> RunRecord:
    opened = Opened(Summary(BASE), [earlier_job(EARLIER)], Summary(SO_FAR), {"run_id": "m1"})
    return RunRecord(str(tmp_path), opened, stack)


def test_until_its_start_is_known_a_jobs_record_keeps_the_run_so_far(tmp_path) -> None:
    record = _opened_record(tmp_path)
    record.update()
    on_disk = read_summary(str(tmp_path / "summary.json"))
    assert on_disk["epochs_completed"] == 3 and on_disk["final_metrics"] == {"loss": 0.5}
    assert on_disk["earlier_jobs"] == [earlier_job(EARLIER)]
    assert on_disk["mlflow"] == {"run_id": "m1"} and on_disk["status"] == "running"


def test_a_job_that_resumes_keeps_the_run_so_far_under_its_own_start(tmp_path) -> None:
    record = _opened_record(tmp_path)
    record.begins(resumed=True, epochs_completed=3, resumed_from="ckpt-3", last_checkpoint="ckpt-3")
    on_disk = read_summary(str(tmp_path / "summary.json"))
    assert on_disk["resumed_from"] == "ckpt-3" and on_disk["final_metrics"] == {"loss": 0.5}
    assert on_disk["best_model_path"] == "best.keras"
    assert on_disk["earlier_jobs"] == [earlier_job(EARLIER)] and on_disk == record.summary


def test_a_job_that_starts_afresh_keeps_nothing_the_earlier_jobs_left(tmp_path) -> None:
    record = _opened_record(tmp_path)
    record.begins(resumed=False, epochs_completed=0, resumed_from=None, last_checkpoint=None)
    on_disk = read_summary(str(tmp_path / "summary.json"))
    assert "final_metrics" not in on_disk and "best_model_path" not in on_disk, on_disk
    assert on_disk["epochs_completed"] == 0 and on_disk["last_checkpoint"] is None
    assert on_disk["earlier_jobs"] == [] and on_disk["mlflow"] == {"run_id": "m1"}


def test_versions_are_the_stacks_at_each_write(tmp_path) -> None:
    """A model factory may switch the Keras once the record has opened: each write asks."""
    keras = ["keras 3.15.1"]
    record = _opened_record(tmp_path, stack=lambda: {"keras": keras[0]})
    record.update()
    assert read_summary(str(tmp_path / "summary.json"))["versions"] == {"keras": "keras 3.15.1"}
    keras[0] = "tf_keras 2.21.0"
    assert record.end(status="completed")
    assert read_summary(str(tmp_path / "summary.json"))["versions"] == {"keras": keras[0]}
    record.update(epochs_completed=9)  # ignored once ended
    assert read_summary(str(tmp_path / "summary.json"))["status"] == "completed"


def test_a_survivor_that_became_rank_0_continues_the_lost_ones_tracking_runs(tmp_path) -> None:
    lost = {**BASE, "status": "failed", "mlflow": {"run_id": "m2"}, "wandb": {"run_id": "w2"}}
    write_summary(str(tmp_path / "summary.json"), Summary(lost))
    record = RunRecord.taken_over(str(tmp_path), Opened(Summary(BASE)))
    assert record.opened.mlflow == {"run_id": "m2"} and record.opened.wandb == {"run_id": "w2"}
    assert record.summary["status"] == "running" and record.summary["mlflow"] == {"run_id": "m2"}
