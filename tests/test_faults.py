"""State and faults with real 2-worker Horovod jobs: checkpoints, exact resume, no hangs,
graceful stops, restarts. Faults are real: SIGKILL, SIGTERM, SIGINT, a NaN or an exception
planted in one rank's model, a file-size limit that makes writes fail."""

from __future__ import annotations

import csv
import json
import os
import pathlib
import re
import resource
import signal
import time

import numpy as np
import pytest
import tensorflow as tf
from harness import (
    BINDING_RUNS,
    KERASES,
    PYTHON,
    QUICKSTART,
    WORKERS,
    check,
    finish,
    horovodrun,
    run,
    start,
    two_local_hosts,
    variant,
    workers,
)

from hvd_train.record.summary import problems
from hvd_train.runtime.keras import binding
from hvd_train.train.checkpoint import is_checkpoint, read_state

pytestmark = [pytest.mark.multiworker, pytest.mark.processes]

# The quickstart (digits, 22 steps/epoch at 2 workers) without dropout: the only randomness
# left is the data order, which is a function of (seed, epoch), so a resumed run must repeat an
# uninterrupted one. (Dropout masks come from TensorFlow's stateful RNG, whose position a
# checkpoint cannot hold: with dropout a resumed run is equivalent, not identical.)
BASE = ["--config", str(QUICKSTART), "--set", "model.dropout=0", "--set", "train.verbose=false",
        "--set", "logging.tensorboard=false"]  # fmt: skip
# Synthetic 32x32x3 data, 24 steps per epoch (a full epoch is 64 at 2 workers, 128 at one):
# epochs long enough to stop in, and a fault after epoch 1 or 2 leaves at least 3 epochs (72
# steps, seconds) to run, so the stop or the kill lands mid-training. What is trained after the
# fault (the restart, the elastic survivor alone, the resumed run) is short. 256 validation
# examples, not the default 1024: 4 validation steps a worker at 2 workers, 8 alone, where 1024
# made an epoch's validation cost more than its 24 steps of training.
LONG = [*BASE, "--set", "data.source=synthetic", "--set", "train.epochs=6",
        "--set", "train.steps_per_epoch=24", "--set", "data.val_examples=256"]  # fmt: skip
JOB_END_LIMIT_S = 60  # a dead worker must end the whole job within this


def train_cmd(*overrides: str, base: list[str] = BASE) -> list[str]:
    return [PYTHON, "-m", "hvd_train", *base, *(x for o in overrides for x in ("--set", o))]


def summary(run_dir: pathlib.Path) -> dict:
    """run.dir's summary.json, which holds only declared fields (record/summary.py)."""
    s = json.loads((run_dir / "summary.json").read_text())
    assert problems(s) == [], problems(s)
    return s


def epochs_in_csv(run_dir: pathlib.Path) -> list[int]:
    with open(run_dir / "metrics.csv") as f:
        return [int(row["epoch"]) for row in csv.DictReader(f)]


def wait_for_epochs(run_dir: pathlib.Path, n: int, proc, timeout: float = 240) -> None:
    """Blocks until metrics.csv holds `n` epochs (the job is then mid-training)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the job ended before the fault could be planted"
        if (run_dir / "metrics.csv").exists() and len(epochs_in_csv(run_dir)) >= n:
            return
        time.sleep(0.1)
    raise AssertionError(f"no {n} epochs within {timeout} s")


def checkpoints(run_dir: pathlib.Path) -> list[pathlib.Path]:
    return sorted((run_dir / "checkpoints").glob("ckpt-*"))


@pytest.mark.stack
@pytest.mark.parametrize("keras", BINDING_RUNS)
def test_resume_from_mid_epoch_checkpoint_repeats_the_uninterrupted_run(tmp_path, keras) -> None:
    """Run A trains 3 epochs with dropout (the quickstart's 0.25) and a checkpoint every 5
    steps. Run B starts from A's checkpoint in the middle of epoch 2 and must end with A's final
    metrics: each rank's dropout generators are in the checkpoint (random_states.py), on Keras 3
    and Keras 2 alike. Tolerance 1e-5 relative: the same float operations in the same order on
    the same machine, so the observed difference is 0; the margin covers summation order inside
    multi-threaded kernels (a dropout mask drawn differently moves the loss by percents)."""
    a, b = tmp_path / "a", tmp_path / "b"
    common = ["train.epochs=3", "checkpoint.every_steps=5", "checkpoint.keep_last=100",
              f"runtime.keras={keras}"]  # fmt: skip
    dropout = [x for x in BASE if x not in ("--set", "model.dropout=0")]
    dropout = ["--config", str(QUICKSTART), *(y for x in dropout[2:] for y in ("--set", x))]
    assert "model.dropout=0" not in dropout
    check(horovodrun(2, train_cmd(*common, f"run.dir={a}", base=dropout), tmp_path))
    mid = [p for p in checkpoints(a) if read_state(p)["epoch"] == 1 and read_state(p)["step"]]
    assert mid, [read_state(p) for p in checkpoints(a)]
    state = read_state(mid[0])
    assert state["global_step"] == state["epoch"] * state["steps_per_epoch"] + state["step"]
    assert (
        len(state["random_states"]) == 2 and state["random_states"][0] != state["random_states"][1]
    )
    resumed = train_cmd(*common, f"run.dir={b}", f"train.resume={mid[0]}", base=dropout)
    proc = check(horovodrun(2, resumed, tmp_path))
    assert f"resuming from {mid[0]}: epoch 2, step {state['step']}" in proc.stdout
    sa, sb = summary(a), summary(b)
    assert sb["status"] == "completed" and sb["resumed_from"] == str(mid[0])
    assert sa["versions"]["keras"] == sb["versions"]["keras"] == binding.describe(keras)
    assert sb["epochs_completed"] == sa["epochs_completed"] == 3
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        assert sb["final_metrics"][key] == pytest.approx(sa["final_metrics"][key], rel=1e-5), key
    # Every checkpoint is complete (renamed into place whole) and nothing temporary is left.
    assert all(is_checkpoint(str(p)) for p in checkpoints(a))
    assert not list((a / "checkpoints").glob(".tmp*"))


@pytest.mark.stack
def test_sigterm_and_sigint_stop_at_a_step_checkpoint_and_resume_completes(tmp_path) -> None:
    """Preemption (SIGTERM to every worker), then Ctrl-C (SIGINT to horovodrun, which passes
    SIGTERM on), then the same command runs to the end."""
    d = tmp_path / "run"
    cmd = ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo",
           *train_cmd(f"run.dir={d}", "checkpoint.keep_last=2", base=LONG)]  # fmt: skip

    # The SIGTERMs go to the workers themselves: horovodrun, which would kill them 5 s later,
    # is not involved, so they may take as long as the stop checkpoint takes on a busy machine.
    os.environ["HVD_TRAIN_STOP_GRACE_S"] = "120"
    try:
        proc = start(cmd, tmp_path)
    finally:
        del os.environ["HVD_TRAIN_STOP_GRACE_S"]
    wait_for_epochs(d, 1, proc)
    for pid in workers(str(d)).values():
        os.kill(pid, signal.SIGTERM)
    first = finish(proc, JOB_END_LIMIT_S)
    assert first.returncode != 0
    s = summary(d)
    assert s["status"] == "interrupted", f"{s}\n{first.stderr[-6000:]}{first.stdout[-3000:]}"
    # Both ranks stop after the same step; the first to exit ends the job, so the other may
    # be terminated before it prints its line.
    stops = {ln.split("stopped by SIGTERM at ")[1].split(";")[0]
             for ln in first.stderr.splitlines() if "hvd_train: stopped by SIGTERM at " in ln}  # fmt: skip
    assert len(stops) == 1, first.stderr[-3000:]
    stop = s["stopped_at"]
    newest = read_state(s["last_checkpoint"])
    assert (newest["epoch"] + 1, newest["step"]) == (stop["epoch"], stop["step"])
    assert newest["reason"] == "stopped"
    assert stops == {f"epoch {stop['epoch']}, step {stop['step']}"}
    assert epochs_in_csv(d) == list(range(1, stop["epoch"]))  # completed epochs only

    # Ctrl-C to horovodrun: it passes SIGTERM on and kills the workers 5 s later. The stop
    # checkpoint is written if it fits in that time (the stop watcher gives up at 3.5 s); the
    # record says `interrupted` either way.
    proc = start(cmd, tmp_path)
    wait_for_epochs(d, stop["epoch"], proc)
    os.kill(proc.pid, signal.SIGINT)
    second = finish(proc, JOB_END_LIMIT_S)
    assert second.returncode != 0
    s2 = summary(d)
    assert s2["status"] == "interrupted", f"{s2}\n{second.stderr[-6000:]}{second.stdout[-3000:]}"
    assert s2["resumed_from"] == s["last_checkpoint"]
    assert all(is_checkpoint(str(p)) for p in checkpoints(d))

    third = check(run(cmd, tmp_path))
    s3 = summary(d)
    assert s3["status"] == "completed" and s3["epochs_completed"] == 6
    assert "resuming from" in third.stdout
    assert epochs_in_csv(d) == [1, 2, 3, 4, 5, 6]
    # keep_last=2, plus the best by val_loss when it is not among them
    kept = checkpoints(d)
    assert 2 <= len(kept) <= 3, kept
    assert read_state(kept[-1])["epoch"] == 6


def test_exception_in_one_rank_ends_the_job_and_the_launcher_names_it(tmp_path) -> None:
    d = tmp_path / "run"
    env_cmd = ["env", "FAULTY_AFTER_STEPS=30", "FAULTY_RANK=1"]
    proc = run([*env_cmd, PYTHON, "-m", "hvd_train", "launch", "--np", "2",
                *BASE[:2], *_sets(f"run.dir={d}", "model.factory=faulty_models:error_on_one_rank")],
               cwd=WORKERS, timeout=300)  # fmt: skip
    assert proc.returncode != 0
    reports = [ln for ln in proc.stderr.splitlines() if "attempt 1 failed:" in ln]
    assert len(reports) == 1, proc.stderr[-3000:]
    assert "attempt 1 failed: rank 1 on localhost failed first: InvalidArgumentError" in reports[0]
    assert "planted failure on rank 1" in reports[0]
    s = summary(d)
    assert s["status"] == "failed" and s["failed_rank"] == 1, s


@pytest.mark.stack
@pytest.mark.parametrize("keras", BINDING_RUNS)
def test_an_infinite_gradient_on_one_rank_is_skipped_by_every_rank_under_mixed_float16(
    tmp_path, keras
) -> None:
    """mixed_float16: rank 1's gradients become infinite at step 6 (a float16 overflow in its
    backward pass; the loss stays finite). The loss scaler must see the averaged gradients, so
    that every rank skips that step: a rank that skipped alone would leave the others in its
    next all-reduce (a hang), or the replicas would part. The job completes, and every rank halved
    its loss scale once and holds the same weights."""
    _overflow_on_rank_1_is_skipped_by_every_rank(
        tmp_path / "out", "inf_gradient_on_one_rank", f"runtime.keras={keras}"
    )


def test_an_infinite_gradient_in_a_keras2_custom_train_step_is_skipped_by_every_rank(
    tmp_path,
) -> None:
    """The same overflow on rank 1, in a model whose train_step is Keras 2's guide's own (a
    GradientTape, then the LossScaleOptimizer's apply_gradients): every rank's loss scaler sees
    the averaged gradients, so all skip that step. Before, rank 1's scaler skipped it alone,
    with its all-reduce, and rank 0 waited in its own."""
    _overflow_on_rank_1_is_skipped_by_every_rank(
        tmp_path / "out", "custom_step_inf_gradient_on_one_rank", "runtime.keras=tf_keras",
        "horovod.stall_warning_s=10", "horovod.stall_shutdown_s=30",
    )  # fmt: skip


def _overflow_on_rank_1_is_skipped_by_every_rank(out, factory: str, *more: str) -> None:
    """Trains `faulty_models:<factory>` under mixed_float16 at 2 workers, rank 1's gradients
    infinite at step 6: the job completes, and every rank halved its loss scale once and holds
    the same weights."""
    sets = [f"run.dir={out}", f"model.factory=faulty_models:{factory}",
            "runtime.mixed_precision=mixed_float16", "train.epochs=1", "train.verbose=false",
            "logging.tensorboard=false", "model.dropout=0", *more]  # fmt: skip
    proc = check(run(["env", "FAULTY_AFTER_STEPS=5", "horovodrun", "-np", "2", "-H", "localhost:2",
                      "--gloo", PYTHON, str(WORKERS / "train_and_compare_weights.py"),
                      str(QUICKSTART), *sets], cwd=WORKERS, timeout=240))  # fmt: skip
    identical = re.findall(r"rank (\d): weights identical on 2 ranks", proc.stdout)
    assert sorted(identical) == ["0", "1"], proc.stdout[-3000:]
    steps = summary(out)["steps_per_epoch"]
    updates = re.findall(r"rank (\d): iterations (\d+), loss scale (\S+)", proc.stdout)
    assert sorted(r for r, _, _ in updates) == ["0", "1"], proc.stdout[-3000:]
    # Keras' dynamic scale starts at 2^15 and doubles only after 2000 finite steps: halved once,
    # on every rank, each rank saw the same non-finite gradients. Both Kerases count every
    # step, the skipped one too (the schedule and the checkpoints count batches).
    assert {(int(n), float(scale)) for _, n, scale in updates} == {(steps, 2.0**14)}, updates
    assert summary(out)["status"] == "completed"


@pytest.mark.stack
def test_nan_loss_stops_every_worker_with_exit_1_and_keeps_the_last_checkpoint(tmp_path) -> None:
    """NaN planted in rank 1's forward pass at step 30 (epoch 2 of 22-step epochs)."""
    d = tmp_path / "run"
    proc = run(["env", "FAULTY_AFTER_STEPS=30", "horovodrun", "-np", "2", "-H", "localhost:2",
                "--gloo", PYTHON, "-m", "hvd_train", *BASE[:2],
                *_sets(f"run.dir={d}", "model.factory=faulty_models:nan_on_one_rank",
                       "train.verbose=false", "logging.tensorboard=false",
                       "checkpoint.check_every_steps=1")],  # agree at every step: exact step
               cwd=WORKERS)  # fmt: skip
    assert proc.returncode == 1
    assert "exit with status code 1." in proc.stdout, proc.stdout[-3000:]  # a rank's own code
    # Every rank decided at the same step; whichever exits first ends the job (the other may be
    # terminated before it prints), each printing one line and no traceback.
    lines = [ln for ln in proc.stderr.splitlines()
             if "] failed: " in ln and "another worker ended first" not in ln]  # fmt: skip
    assert lines, proc.stderr[-3000:]
    assert all("loss became NaN or infinite at epoch 2, step 9;" in ln for ln in lines), lines
    assert "]<stderr>:Traceback" not in proc.stderr  # (horovodrun prints its own)
    s = summary(d)
    assert s["status"] == "failed" and s["error"].startswith("TrainingError"), s
    assert s["error_type"] == "TrainingError", s  # what the launcher reads (next test)
    kept = checkpoints(d)
    assert [read_state(p)["epoch"] for p in kept] == [1]  # the one from before the NaN
    reader = tf.train.load_checkpoint(str(kept[0] / "ckpt"))
    for name in reader.get_variable_to_shape_map():
        value = reader.get_tensor(name)
        if isinstance(value, np.ndarray) and value.dtype.kind == "f":
            assert np.isfinite(value).all(), name


def test_launcher_does_not_restart_after_a_nan_loss(tmp_path) -> None:
    """The same NaN through `hvd-train launch --max-restarts 2`: summary.json's error_type says
    TrainingError, so the launcher names the reason and starts no second attempt."""
    d = tmp_path / "run"
    proc = run(["env", "FAULTY_AFTER_STEPS=30", PYTHON, "-m", "hvd_train", "launch", "--np", "2",
                "--gloo", "--max-restarts", "2", *BASE[:2],
                *_sets(f"run.dir={d}", "model.factory=faulty_models:nan_on_one_rank",
                       "train.verbose=false", "logging.tensorboard=false",
                       "checkpoint.check_every_steps=1")],
               cwd=WORKERS)  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    said = [ln for ln in proc.stderr.splitlines() if ln.startswith("[hvd_train launch] ")]
    assert said[-1] == (
        "[hvd_train launch] not restarting: a non-finite loss would recur from the same "
        "checkpoint and data"
    ), said
    assert not any(ln.startswith("[hvd_train launch] attempt 2 ") for ln in said), said
    s = summary(d)
    assert (s["status"], s["error_type"], s["launch"]["restarts"]) == ("failed", "TrainingError", 0)


def test_failing_checkpoint_write_ends_the_run_and_keeps_the_previous_one(tmp_path) -> None:
    """After the first checkpoint, rank 0 may write no file over 16 KiB (what a full disk
    does to the next write): the next checkpoint fails, the run ends with exit code 1 and
    one line naming it, summary.json says `failed`, and the first checkpoint survives."""
    d = tmp_path / "run"
    proc = start(train_cmd(f"run.dir={d}", "train.epochs=6"), tmp_path)
    deadline = time.monotonic() + 240
    while not checkpoints(d):
        assert proc.poll() is None and time.monotonic() < deadline, "no first checkpoint"
        time.sleep(0.02)
    resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (16 << 10, 16 << 10))
    result = finish(proc, 240)
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("[rank 0] failed:")]
    assert len(errors) == 1 and "File too large" in errors[0], result.stderr[-3000:]
    assert errors[0].endswith(f"; full log: {d / 'logs' / 'rank-0.log'}"), errors
    s = summary(d)
    assert s["status"] == "failed", s
    assert s["error"].startswith("CheckpointError: cannot write") and "File too large" in s["error"]
    assert s["error_type"] == "CheckpointError"
    kept = checkpoints(d)
    assert kept and all(is_checkpoint(str(p)) for p in kept)
    assert not list((d / "checkpoints").glob(".tmp*"))
    assert read_state(kept[-1])["epoch"] < 6


@pytest.mark.timeout(1200)  # two jobs, each bounded on its own below
def test_launcher_restarts_after_a_killed_worker_and_completes(tmp_path) -> None:
    d = tmp_path / "run"
    proc = start([PYTHON, "-m", "hvd_train", "launch", "--np", "2", "--max-restarts", "2",
                  *LONG, *_sets(f"run.dir={d}")], tmp_path)  # fmt: skip
    wait_for_epochs(d, 2, proc)
    os.kill(workers(str(d))[1], signal.SIGKILL)
    result = check(finish(proc, 400))
    assert (
        "attempt 1 failed: rank 1 on localhost failed first (exit code 137, killed by SIGKILL)"
        in result.stderr
    )
    assert "restarting (1 of 2) from the newest checkpoint" in result.stderr
    s = summary(d)
    assert s["status"] == "completed" and s["epochs_completed"] == 6, s
    assert s["launch"]["restarts"] == 1 and s["launch"]["failures"][0]["rank"] == 1
    assert s["resumed_from"] is not None
    assert epochs_in_csv(d) == [1, 2, 3, 4, 5, 6]


def test_resume_from_a_missing_checkpoint_is_a_one_line_error(tmp_path) -> None:
    proc = run(train_cmd(f"run.dir={tmp_path}", f"train.resume={tmp_path}/nope"), tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"[rank 0] failed: train.resume: {tmp_path}/nope is not a checkpoint folder (expected "
        f"state.json and ckpt.index in it, as in {tmp_path}/checkpoints/ckpt-*); full log: "
        f"{tmp_path}/logs/rank-0.log"
    )


def _sets(*overrides: str) -> list[str]:
    return [x for o in overrides for x in ("--set", o)]


@pytest.mark.stack
@pytest.mark.timeout(1200)  # a wait and a job, each bounded on its own below
@pytest.mark.parametrize(
    ("keras", "rank"),
    # Rank 0, Horovod's coordinator, lost; rank 1 lost is CI's (harness.variant).
    [(KERASES[0], 0), variant(KERASES[0], 1),
     *([pytest.param("tf_keras", 1, marks=pytest.mark.second_keras)] if len(KERASES) > 1 else [])],
)  # fmt: skip
def test_elastic_goes_on_with_one_worker_after_one_is_killed(tmp_path, keras, rank) -> None:
    """Horovod Elastic on Gloo: two one-slot 'hosts' (localhost and 127.0.0.1, both this
    machine). The worker of `rank` is killed; Horovod blacklists its host and the survivor
    finishes alone, its learning rate rescaled for one worker and its cosine schedule at its
    floor on the last step (the schedule lives in epochs). When rank 0 was the one lost,
    the survivor, rank 0 now, ends the record. On each Keras (ElasticState serves both; the
    tf_keras run is CI's, on Python 3.13)."""
    discover = two_local_hosts(tmp_path)
    d = tmp_path / "run"
    proc = start([PYTHON, "-m", "hvd_train", "launch", "--np", "2", *LONG,
                  *_sets(f"run.dir={d}", "elastic.enabled=true", "elastic.min_workers=1",
                         f"elastic.discovery_script={discover}", "elastic.commit_every_steps=10",
                         "optimizer.warmup_epochs=0", "optimizer.schedule=cosine",
                         "optimizer.min_lr_fraction=0.5", f"runtime.keras={keras}")],
                 tmp_path)  # fmt: skip
    wait_for_epochs(d, 1, proc)
    os.kill(workers(str(d))[rank], signal.SIGKILL)
    check(finish(proc, 400))
    s = summary(d)
    assert s["status"] == "completed" and s["epochs_completed"] == 6, s
    # The reset itself, from the record: rank 0's "elastic reset" log line was missing from
    # horovodrun's output in one loaded run (cause not found); the log is not the contract.
    assert s["elastic"]["resets"] >= 1, s
    assert s["elastic"]["world_sizes"] == [2, 1] and s["world_size"] == 1
    # The schedule went on at the committed epoch for one worker: cosine ends at its floor,
    # half of one worker's rate (0.001; 0.002 at 2 workers), on the last epoch's last step.
    assert s["final_metrics"]["learning_rate"] == pytest.approx(0.0005)
    assert epochs_in_csv(d) == [1, 2, 3, 4, 5, 6]
