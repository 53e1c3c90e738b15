"""A run's record can be trusted: failed writes end the run, damaged checkpoints are passed over.

Faults are real: a full disk is a small tmpfs mounted for the test (tests run as root, as in
CI), a damaged checkpoint is a real file cut short or overwritten. Most runs are one process
(`python -m hvd_train` without horovodrun); one 2-worker job shows that rank 0's failed write
ends the whole job.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import time

import numpy as np
import pytest
import tensorflow as tf
from harness import PYTHON, QUICKSTART, check, finish, horovodrun, run, start

from hvd_train.launcher.launch import first_failure
from hvd_train.record.summary import problems

pytestmark = pytest.mark.processes

# The quickstart (digits, 44 steps/epoch alone) without dropout: a resumed run repeats exactly
# what another run resumed from the same checkpoint does. A checkpoint is about 1.2 MB,
# best.keras and model.keras about 0.42 MB each.
BASE = ["--config", str(QUICKSTART), "--set", "model.dropout=0", "--set", "train.verbose=false",
        "--set", "logging.tensorboard=false", "--set", "train.epochs=2"]  # fmt: skip
NO_SPACE = "No space left on device"


def train_cmd(run_dir: pathlib.Path, *overrides: str) -> list[str]:
    sets = [x for o in (f"run.dir={run_dir}", *overrides) for x in ("--set", o)]
    return [PYTHON, "-m", "hvd_train", *BASE, *sets]


def summary(run_dir: pathlib.Path) -> dict:
    """run.dir's summary.json, which holds only declared fields (record/summary.py)."""
    s = json.loads((run_dir / "summary.json").read_text())
    assert problems(s) == [], problems(s)
    return s


def checkpoints(run_dir: pathlib.Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def errors(proc: subprocess.CompletedProcess) -> list[str]:
    """The CLI's one-line errors; asserts that no Python traceback came with them."""
    assert "Traceback" not in proc.stderr, proc.stderr[-6000:]
    starts = ("hvd_train: error:", "[rank 0] failed:")
    return [ln for ln in proc.stderr.splitlines() if ln.startswith(starts)]


def failed(run_dir: pathlib.Path, message: str) -> str:
    """Rank 0's failure line once run.dir is its job's (logs.failed)."""
    return f"[rank 0] failed: {message}; full log: {run_dir / 'logs' / 'rank-0.log'}"


def assert_readable(checkpoint: pathlib.Path) -> None:
    """Every tensor of the checkpoint reads back (a cut-short data file would not)."""
    reader = tf.train.load_checkpoint(str(checkpoint / "ckpt"))
    names = reader.get_variable_to_shape_map()
    assert names and all(reader.get_tensor(n) is not None for n in names)


def variables(checkpoint: pathlib.Path) -> dict[str, np.ndarray]:
    """The checkpoint's numbers: weights, optimizer slots and step counter (not the object
    graph it also stores, as bytes)."""
    reader = tf.train.load_checkpoint(str(checkpoint / "ckpt"))
    values = {n: np.asarray(reader.get_tensor(n)) for n in reader.get_variable_to_shape_map()}
    return {n: v for n, v in values.items() if v.dtype.kind in "fiu"}


def no_temporaries(run_dir: pathlib.Path) -> None:
    left = [*run_dir.glob("checkpoints/.tmp-ckpt-*"), *run_dir.glob("*.tmp-*")]
    assert not left, left


@pytest.fixture
def tmpfs(tmp_path):
    """`mount(size_kib)`: a fresh tmpfs of that size in tmp_path (a real disk that fills up);
    all are unmounted after the test."""
    mounted: list[pathlib.Path] = []

    def mount(size_kib: int) -> pathlib.Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(where)],
            capture_output=True, text=True,
        )  # fmt: skip
        denied = os.geteuid() != 0 or "permission denied" in proc.stderr.lower()
        if proc.returncode and denied:
            pytest.skip(f"mounting a tmpfs needs root (EPERM): {proc.stderr.strip()}")
        assert proc.returncode == 0, proc.stderr
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=True)


def assert_write_failed(result, d: pathlib.Path, message: str) -> dict:
    """Exit code 1, `message` as the one error line and the record's error, nothing half-written
    left; returns the summary."""
    assert result.returncode == 1, result.stderr[-6000:]
    assert errors(result) == [failed(d, f"CheckpointError: {message}")]
    s = summary(d)
    assert s["status"] == "failed" and s["error"] == f"CheckpointError: {message}", s
    no_temporaries(d)
    return s


def test_no_room_for_the_first_checkpoint_fails_with_exit_1_naming_it(tmp_path, tmpfs) -> None:
    """600 KiB: room for config.yaml, summary.json, metrics.csv, the 64 KiB reserve and
    best.keras (written before the epoch's checkpoint), not for the first checkpoint."""
    d = tmpfs(600) / "run"
    ckpt = d / "checkpoints" / "ckpt-00000044"
    s = assert_write_failed(
        run(train_cmd(d), tmp_path),
        d,
        f"cannot write checkpoint {ckpt}: {NO_SPACE}; free space in {d / 'checkpoints'}; no "
        "checkpoint was written before: a rerun starts afresh",
    )
    assert s["last_checkpoint"] is None and s["model_path"] is None
    assert checkpoints(d) == []


def test_a_disk_filling_mid_run_keeps_the_earlier_checkpoint_and_a_rerun_completes(
    tmp_path, tmpfs
) -> None:
    """A filler file leaves about 2.4 MB: epoch 1's checkpoint, best.keras and the reserve
    (1.7 MB) fit, epoch 2's checkpoint (1.2 MB more) does not. Deleting the filler frees the
    disk, and the same command resumes from epoch 1's checkpoint."""
    disk = tmpfs(8 << 10)
    filler = disk / "filler"
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    with open(filler, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, free - (2400 << 10))
    d = disk / "run"
    first = run(train_cmd(d), tmp_path)
    assert first.returncode == 1, first.stderr[-6000:]
    ckpts = d / "checkpoints"
    assert errors(first) == [
        failed(
            d,
            f"CheckpointError: cannot write checkpoint {ckpts / 'ckpt-00000088'}: {NO_SPACE}; "
            f"free space in {ckpts}; the newest checkpoint, {ckpts / 'ckpt-00000044'}, is intact "
            "and train.resume=auto resumes from it",
        )
    ]
    assert summary(d)["status"] == "failed"
    assert checkpoints(d) == ["ckpt-00000044"]
    assert_readable(ckpts / "ckpt-00000044")
    no_temporaries(d)

    filler.unlink()
    second = run(train_cmd(d), tmp_path)
    assert second.returncode == 0, second.stderr[-6000:]
    assert f"resuming from {ckpts / 'ckpt-00000044'}: epoch 2, step 0" in second.stdout
    s = summary(d)
    assert s["status"] == "completed" and s["epochs_completed"] == 2, s
    assert s["model_path"] == str(d / "model.keras") and os.path.exists(s["model_path"])
    assert not (d / ".hvd_train.reserve").exists()  # given back at the end


def test_no_room_for_model_keras_fails_and_a_rerun_writes_it(tmp_path, tmpfs) -> None:
    """One epoch on 1880 KiB: the checkpoint, best.keras and the reserve take about 1670 KiB,
    so the final model.keras (420 KiB) does not fit. After a remount with room, the same command
    resumes from the final checkpoint, has nothing left to train and writes model.keras."""
    disk = tmpfs(1880)
    d = disk / "run"
    cmd = train_cmd(d, "train.epochs=1")
    final = d / "checkpoints" / "ckpt-00000044"
    s = assert_write_failed(
        run(cmd, tmp_path),
        d,
        f"cannot write {d / 'model.keras'}: {NO_SPACE}; free space in {d}; the newest "
        f"checkpoint, {final}, is intact and train.resume=auto resumes from it",
    )
    assert s["model_path"] is None, s
    assert not (d / "model.keras").exists()

    subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)
    second = run(cmd, tmp_path)
    assert second.returncode == 0, second.stderr[-6000:]
    assert f"resuming from {final}: epoch 2, step 0" in second.stdout
    s = summary(d)
    assert s["status"] == "completed" and s["epochs_completed"] == 1, s
    assert {"loss", "val_loss", "val_accuracy"} <= set(s["final_metrics"]), s  # the checkpoint's
    assert tf.keras.models.load_model(d / "model.keras").count_params() > 0


def test_a_disk_filled_by_someone_else_still_gets_the_final_summary(tmp_path, tmpfs) -> None:
    """Once training has started, another writer takes every free byte. The next write fails
    having written nothing, so nothing partial is freed: only the 64 KiB the job reserved at
    its start, given back, lets summary.json say `failed`."""
    disk = tmpfs(8 << 10)
    d = disk / "run"
    proc = start(train_cmd(d, "train.epochs=3"), tmp_path)
    deadline = time.monotonic() + 240
    csv = d / "metrics.csv"  # the last file written before the first epoch: once it has its
    while not (csv.exists() and csv.stat().st_size):  # header, only training writes follow
        assert proc.poll() is None and time.monotonic() < deadline, "training did not start"
        time.sleep(0.02)
    filler = disk / "filler"
    with open(filler, "wb") as f:
        stat = os.statvfs(disk)
        os.posix_fallocate(f.fileno(), 0, stat.f_bavail * stat.f_frsize)
    assert os.statvfs(disk).f_bavail == 0
    result = finish(proc, 300)
    assert result.returncode == 1, result.stderr[-6000:]
    (line,) = errors(result)
    assert (
        line.startswith("[rank 0] failed: CheckpointError: cannot write ")
        and f": {NO_SPACE};" in line
    )
    s = summary(d)
    assert s["status"] == "failed" and s["error"].startswith("CheckpointError"), s
    no_temporaries(d)


@pytest.fixture(scope="module")
def two_epochs(tmp_path_factory) -> dict[str, pathlib.Path]:
    """A run of 2 epochs (checkpoints ckpt-00000044 and ckpt-00000088), the same run resumed
    directly from its older checkpoint, and ckpt-00000088 of a run with another model."""
    root = tmp_path_factory.mktemp("two_epochs")
    base, direct, other = root / "base", root / "direct", root / "other"
    check(run(train_cmd(base), root))
    shutil.copytree(base, direct)
    older = direct / "checkpoints" / "ckpt-00000044"
    check(run(train_cmd(direct, f"train.resume={older}"), root))
    check(run(train_cmd(other, "model.dense_units=[64]"), root))
    return {"base": base, "direct": direct, "other": other / "checkpoints" / "ckpt-00000088"}


def crashed_copy(run_dir: pathlib.Path, to: pathlib.Path) -> None:
    """A copy of the finished run as a crash while writing its last checkpoint leaves it:
    summary.json says failed (a completed run's rerun would have nothing to train)."""
    shutil.copytree(run_dir, to)
    s = summary(to)
    s.update(status="failed", epochs_completed=1, error="killed while writing its checkpoint")
    (to / "summary.json").write_text(json.dumps(s))


def _truncate_data(ckpt: pathlib.Path, other: pathlib.Path) -> str:
    data = next(ckpt.glob("ckpt.data-*"))
    os.truncate(data, data.stat().st_size // 2)
    return (
        "its variables cannot be read: ckpt.index or ckpt.data-* is truncated or corrupt "
        "(IndexError: Read less bytes than requested)"
    )


def _corrupt_state(ckpt: pathlib.Path, other: pathlib.Path) -> str:
    cut = '{"epoch": 2, "st'  # written over a crash, say
    (ckpt / "state.json").write_text(cut)
    with pytest.raises(json.JSONDecodeError) as e:
        json.loads(cut)
    return f"state.json is unreadable (JSONDecodeError: {e.value})"


def _another_model(ckpt: pathlib.Path, other: pathlib.Path) -> str:
    """A checkpoint whose convolutions fit and whose dense layer does not: when the restore
    fails, it has already overwritten 8 of the model's and optimizer's 37 variables."""
    shutil.rmtree(ckpt)
    shutil.copytree(other, ckpt)
    return "it does not match this model and optimizer (ValueError: Received incompatible tensor"


@pytest.mark.parametrize("damage", [_truncate_data, _corrupt_state, _another_model])
def test_resume_passes_over_a_damaged_newest_checkpoint_to_the_older_one(
    tmp_path, two_epochs, damage
) -> None:
    d = tmp_path / "run"
    crashed_copy(two_epochs["base"], d)
    newest = d / "checkpoints" / "ckpt-00000088"
    why = damage(newest, two_epochs["other"])
    proc = run(train_cmd(d), tmp_path)
    assert proc.returncode == 0, proc.stderr[-6000:]
    warnings = [ln for ln in proc.stdout.splitlines() if "warning: cannot resume" in ln]
    assert len(warnings) == 1, proc.stdout[-6000:]
    assert f"warning: cannot resume from {newest}: {why}" in warnings[0], warnings
    assert warnings[0].endswith("; trying the next older one"), warnings
    older = d / "checkpoints" / "ckpt-00000044"
    assert (
        f"resuming from {older}: epoch 2, step 0 (saved with 1 worker(s), global batch 32); "
        f"set aside as unloadable: {newest}.unloadable" in proc.stdout
    ), proc.stdout[-3000:]
    s = summary(d)
    assert s["status"] == "completed" and s["resumed_from"] == str(older), s
    assert checkpoints(d) == ["ckpt-00000044", "ckpt-00000088", "ckpt-00000088.unloadable"]
    # Weights and optimizer state equal those of the run resumed directly from the older
    # checkpoint: the failed restore left nothing behind. Tolerance as in test_faults.py (the
    # same operations in the same order; the margin covers multi-threaded summation order).
    got, want = variables(newest), variables(two_epochs["direct"] / "checkpoints" / newest.name)
    assert len(want) > 10 and got.keys() == want.keys(), (got.keys(), want.keys())
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, err_msg=name)


def test_resume_auto_fails_in_one_line_when_no_checkpoint_loads(tmp_path, two_epochs) -> None:
    """Rather than start afresh over the run's metrics.csv and checkpoints."""
    d = tmp_path / "run"
    crashed_copy(two_epochs["base"], d)
    newest = d / "checkpoints" / "ckpt-00000088"
    why = _truncate_data(newest, two_epochs["other"])
    _corrupt_state(d / "checkpoints" / "ckpt-00000044", two_epochs["other"])
    proc = run(train_cmd(d), tmp_path)
    assert proc.returncode == 2
    assert errors(proc) == [
        failed(
            d,
            f"train.resume: auto: none of the 2 checkpoint(s) in {d / 'checkpoints'} can be "
            f"loaded (the newest, {newest}: {why}); resume from a good copy with "
            "train.resume=PATH, or start afresh with another run.dir or train.resume=never",
        )
    ]
    warned = [ln for ln in proc.stdout.splitlines() if "warning: cannot resume" in ln]
    assert len(warned) == 2 and warned[1].endswith("; no older one"), warned
    assert checkpoints(d) == ["ckpt-00000044", "ckpt-00000088"]  # nothing renamed


def test_resume_from_a_named_damaged_checkpoint_is_a_one_line_error(tmp_path, two_epochs) -> None:
    d = tmp_path / "run"
    shutil.copytree(two_epochs["base"], d)
    newest = d / "checkpoints" / "ckpt-00000088"
    why = _truncate_data(newest, two_epochs["other"])
    proc = run(train_cmd(d, f"train.resume={newest}"), tmp_path)
    assert proc.returncode == 2
    assert errors(proc) == [
        failed(
            d,
            f"train.resume: cannot resume from {newest}: {why}; name another checkpoint, or use "
            "train.resume=auto for the newest that loads",
        )
    ]


def test_a_new_job_removes_what_a_killed_one_left_half_written(tmp_path) -> None:
    d = tmp_path / "run"
    strays = [d / "checkpoints" / ".tmp-ckpt-00000044-4242", d / "model.old-4242"]
    for folder in strays:
        folder.mkdir(parents=True)
        (folder / "part").write_bytes(b"x" * 100)
    for name in ("model.tmp-4242.keras", "best.tmp-4242.keras"):
        (d / name).write_bytes(b"x" * 100)
        strays.append(d / name)
    (d / "notes.tmp").write_text("not ours")  # not the pattern of a temporary file: kept
    proc = run(train_cmd(d, "train.epochs=1"), tmp_path)
    assert proc.returncode == 0, proc.stderr[-6000:]
    lines = [ln for ln in proc.stdout.splitlines() if "killed job left half-written" in ln]
    assert len(lines) == 1 and all(str(p) in lines[0] for p in strays), lines
    assert not any(p.exists() for p in strays)
    assert (d / "notes.tmp").exists()
    assert summary(d)["status"] == "completed"


@pytest.mark.multiworker
def test_rank_0s_failed_checkpoint_ends_the_2_worker_job_with_its_error(tmp_path, tmpfs) -> None:
    """Rank 0 raises at epoch 1's checkpoint; rank 1 waits in the next epoch's first collective
    and fails there when rank 0 exits, so the job ends (within the harness's timeout) and rank
    0's error is the one summary.json and the launcher's report name."""
    d = tmpfs(600) / "run"
    proc = horovodrun(2, train_cmd(d, "train.epochs=3"), tmp_path, timeout=300)
    assert proc.returncode == 1, proc.stderr[-6000:]
    ckpt = d / "checkpoints" / "ckpt-00000022"  # 22 steps/epoch at 2 workers
    assert f"[rank 0] failed: CheckpointError: cannot write checkpoint {ckpt}: {NO_SPACE}" in (
        proc.stderr
    )
    s = summary(d)
    assert s["status"] == "failed", s
    assert s["error"].startswith(f"CheckpointError: cannot write checkpoint {ckpt}: {NO_SPACE}")
    failure = first_failure(proc.stdout + proc.stderr)
    assert failure["rank"] == 0 and failure["error"].startswith("CheckpointError"), failure
    assert checkpoints(d) == []
    no_temporaries(d)
