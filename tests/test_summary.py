"""summary.json has one typed home (record/summary.py): `Summary` declares every field, and
`problems` finds what a record holds that the declaration does not allow."""

from __future__ import annotations

import json

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
