"""run.dir is owned by one job: the lock, the refusals (one line, exit code 2), the input config
left alone; then real jobs: a single process refused, and a second job refused while a real
2-worker job runs on the same run.dir, which completes with its files untouched."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import pathlib
import socket
import subprocess
import time

import pytest
from harness import BIN, PYTHON, QUICKSTART, WORKERS, check, finish, run, start

from hvd_train.base.errors import ConfigError, UserError
from hvd_train.config import check as check_config
from hvd_train.config import load_config
from hvd_train.record import rundir
from hvd_train.record.rundir import LOCK_NAME, InUse, NotARunDir, NotWritable

HOST = socket.gethostname()


def start_time(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat, read here independently of rundir."""
    text = pathlib.Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2 :].split()[19])


def write_lock(run_dir: pathlib.Path, **record) -> pathlib.Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = run_dir / LOCK_NAME
    lock.write_text(json.dumps({"time": "2024-01-01T00:00:00+0000", **record}))
    return lock


@pytest.fixture
def sleeper():
    """A live child process whose pid a test can write into a lock."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()  # reaped: its pid names no process now
    return proc.pid


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text, text
    return text


# --------------------------------------------------------------------------- the lock


def test_claim_creates_the_folder_and_a_lock_naming_this_process(tmp_path) -> None:
    d = tmp_path / "a" / "run"
    claim = rundir.claim(str(d), overwrite=False, config_path=None)
    lock = json.loads((d / LOCK_NAME).read_text())
    assert (lock["pid"], lock["host"]) == (os.getpid(), HOST)
    assert lock["start_time"] == start_time(os.getpid())
    assert lock["time"]
    claim.release()
    assert not (d / LOCK_NAME).exists()
    claim.release()  # idempotent
    assert sorted(os.listdir(d)) == []


def test_a_live_process_holding_run_dir_refuses_the_claim(tmp_path, sleeper) -> None:
    d = tmp_path / "run"
    lock = write_lock(d, pid=sleeper.pid, host=HOST, start_time=start_time(sleeper.pid))
    before = lock.read_text()
    with pytest.raises(InUse) as e:
        rundir.claim(str(d), overwrite=False, config_path=None)
    assert one_line(e) == (
        f"run.dir {d} is in use by another job (pid {sleeper.pid} on this host, since "
        "2024-01-01T00:00:00+0000); wait for it to end, or choose another run.dir"
    )
    assert lock.read_text() == before
    assert rundir.alive_here(json.loads(before))


def test_this_process_cannot_claim_run_dir_twice(tmp_path) -> None:
    first = rundir.claim(str(tmp_path), overwrite=False, config_path=None)
    lock = (tmp_path / LOCK_NAME).read_text()
    assert json.loads(lock)["pid"] == os.getpid()
    with pytest.raises(InUse):
        rundir.claim(str(tmp_path), overwrite=False, config_path=None)
    # The refused claim left the first one's lock as it was, and wrote nothing else.
    assert (tmp_path / LOCK_NAME).read_text() == lock
    assert os.listdir(tmp_path) == [LOCK_NAME]
    first.release()
    assert os.listdir(tmp_path) == []


def test_a_stale_lock_from_a_dead_process_is_taken_over_with_one_log_line(tmp_path) -> None:
    pid = dead_pid()
    write_lock(tmp_path, pid=pid, host=HOST, start_time=123)
    lines: list[str] = []
    claim = rundir.claim(str(tmp_path), overwrite=False, config_path=None, log=lines.append)
    assert lines == [
        f"run.dir {tmp_path}: took over a stale lock (pid {pid} on this host, since "
        "2024-01-01T00:00:00+0000, is no longer running)"
    ]
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert sorted(os.listdir(tmp_path)) == [LOCK_NAME]  # nothing set aside is left
    claim.release()


def test_a_reused_pid_is_not_taken_for_the_holder(tmp_path, sleeper) -> None:
    """The lock names a live pid, but that process started at another time: the holder died
    and its pid was given to another process."""
    write_lock(tmp_path, pid=sleeper.pid, host=HOST, start_time=start_time(sleeper.pid) - 1)
    lines: list[str] = []
    rundir.claim(str(tmp_path), overwrite=False, config_path=None, log=lines.append).release()
    assert len(lines) == 1 and f"took over a stale lock (pid {sleeper.pid}" in lines[0]


def test_a_lock_from_another_host_is_refused_naming_host_pid_and_the_fix(tmp_path) -> None:
    lock = write_lock(tmp_path, pid=4242, host="node-7", start_time=1)
    with pytest.raises(InUse) as e:
        rundir.claim(str(tmp_path), overwrite=False, config_path=None)
    assert one_line(e) == (
        f"run.dir {tmp_path} is held by pid 4242 on node-7 since 2024-01-01T00:00:00+0000; if "
        f"that job is gone, delete {lock} and run again, else choose another run.dir"
    )
    assert lock.exists()


def test_an_unreadable_lock_is_refused_with_how_to_clear_it(tmp_path) -> None:
    lock = tmp_path / LOCK_NAME
    lock.write_text("")  # as a job that died between creating and writing it leaves it
    with pytest.raises(InUse) as e:
        rundir.claim(str(tmp_path), overwrite=False, config_path=None)
    assert one_line(e) == (
        f"run.dir {tmp_path}: its lock {lock} is unreadable; if no job is using {tmp_path}, "
        "delete the lock and run again"
    )


def test_release_leaves_a_lock_that_is_no_longer_this_claims(tmp_path) -> None:
    claim = rundir.claim(str(tmp_path), overwrite=False, config_path=None)
    (tmp_path / LOCK_NAME).unlink()  # deleted by hand, then another job claimed run.dir
    other = write_lock(tmp_path, pid=4242, host="node-7", start_time=1)
    claim.release()
    assert other.exists()


def test_release_stale_removes_only_the_lock_that_names_that_pid_on_that_host(tmp_path) -> None:
    lock = write_lock(tmp_path, pid=4242, host="node-7", start_time=1)
    assert not rundir.release_stale(str(tmp_path), 4242, "node-8")
    assert not rundir.release_stale(str(tmp_path), 4243, "node-7")
    assert lock.exists()
    assert rundir.release_stale(str(tmp_path), 4242, "node-7")
    assert not lock.exists()
    assert not rundir.release_stale(str(tmp_path), 4242, "node-7")


def _claim_at_once(run_dir: str, barrier, results) -> None:
    barrier.wait()
    try:
        claim = rundir.claim(run_dir, overwrite=False, config_path=None, log=lambda m: None)
        results.put("claimed")
    except InUse:
        claim = None
        results.put("refused")
    barrier.wait()  # the winner holds run.dir until every process has tried
    if claim:
        claim.release()


def test_of_processes_taking_over_one_stale_lock_at_once_exactly_one_wins(tmp_path) -> None:
    write_lock(tmp_path, pid=dead_pid(), host=HOST, start_time=1)
    ctx = multiprocessing.get_context("fork")
    n = 8
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_claim_at_once, args=(str(tmp_path), barrier, results))
             for _ in range(n)]  # fmt: skip
    for p in procs:
        p.start()
    outcomes = sorted(results.get(timeout=60) for _ in range(n))
    for p in procs:
        p.join(60)
    assert outcomes == ["claimed"] + ["refused"] * (n - 1)
    assert not (tmp_path / LOCK_NAME).exists()
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------- the folder


def test_an_earlier_runs_folder_is_claimed(tmp_path) -> None:
    """Every file a run writes (and its temporary names) is a run's: the claim takes the lock
    without run.overwrite, touches none of them, and its release gives the folder back."""
    for name in ("summary.json", "metrics.csv", "config.yaml", "model.keras", "best.keras",
                 "timeline.json", "log.txt", "summary.json.tmp", "model.tmp-12.keras"):  # fmt: skip
        (tmp_path / name).write_text("x")
    for name in ("checkpoints", "tensorboard", "model", "best", "logs", "model.old-12"):
        (tmp_path / name).mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    claim = rundir.claim(str(tmp_path), overwrite=False, config_path=None)  # no NotARunDir
    lock = json.loads((tmp_path / LOCK_NAME).read_text())
    assert (lock["pid"], lock["host"]) == (os.getpid(), HOST), lock
    claim.release()
    assert not (tmp_path / LOCK_NAME).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert all(p.read_text() == "x" for p in tmp_path.iterdir() if p.is_file())


def test_files_that_are_not_a_runs_are_refused_and_overwrite_allows_them(tmp_path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "data").mkdir()
    (tmp_path / "metrics.csv").write_text("epoch\n")
    with pytest.raises(NotARunDir) as e:
        rundir.claim(str(tmp_path), overwrite=False, config_path=None)
    assert one_line(e) == (
        f"run.dir {tmp_path} holds files that are not a run's (data/, notes.txt); choose an "
        "empty or new folder, or set run.overwrite=true to write the run's files beside them"
    )
    assert not (tmp_path / LOCK_NAME).exists()
    claim = rundir.claim(str(tmp_path), overwrite=True, config_path=None)
    claim.release()
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / "data").is_dir()


def test_many_foreign_files_are_summed_up_in_one_line(tmp_path) -> None:
    for i in range(5):
        (tmp_path / f"f{i}").write_text("")
    with pytest.raises(NotARunDir) as e:
        rundir.claim(str(tmp_path), overwrite=False, config_path=None)
    assert "(f0, f1, f2 and 2 more)" in one_line(e)


def test_a_run_dir_that_is_a_file_is_refused(tmp_path) -> None:
    f = tmp_path / "results"
    f.write_text("not a folder")
    with pytest.raises(NotWritable) as e:
        rundir.claim(str(f), overwrite=True, config_path=None)
    assert one_line(e) == (
        f"run.dir {f} exists and is not a folder; choose another run.dir, or move the file away"
    )


def test_a_run_dir_through_a_file_is_refused(tmp_path) -> None:
    (tmp_path / "file").write_text("")
    d = tmp_path / "file" / "run"
    with pytest.raises(NotWritable) as e:
        rundir.claim(str(d), overwrite=False, config_path=None)
    assert one_line(e) == (
        f"run.dir {d}: cannot create the folder (a part of the path is a file); choose a "
        "run.dir in a writable place"
    )


@pytest.fixture
def read_only_dir(tmp_path):
    """A read-only tmpfs (tests run as root, which file permissions do not stop)."""
    mnt = tmp_path / "ro"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mnt)],
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {proc.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def test_a_read_only_run_dir_is_refused_in_one_line(read_only_dir) -> None:
    with pytest.raises(NotWritable) as e:
        rundir.claim(str(read_only_dir), overwrite=False, config_path=None)
    assert one_line(e) == (
        f"run.dir {read_only_dir}: cannot write in it (Read-only file system); choose a run.dir "
        "this user may write in"
    )
    d = read_only_dir / "run"
    with pytest.raises(NotWritable) as e:
        rundir.claim(str(d), overwrite=False, config_path=None)
    assert one_line(e) == (
        f"run.dir {d}: cannot create the folder (Read-only file system); choose a run.dir in a "
        "writable place"
    )


def test_refusals_are_user_errors() -> None:
    assert all(issubclass(c, UserError) for c in (InUse, NotWritable, NotARunDir))


# --------------------------------------------------------------------------- config.yaml


def test_the_input_config_is_never_overwritten(tmp_path) -> None:
    earlier = "run:\n  dir: x\n"
    (tmp_path / "config.yaml").write_text(earlier)
    link = tmp_path.parent / f"{tmp_path.name}-link.yaml"
    link.symlink_to(tmp_path / "config.yaml")
    for given in (tmp_path / "config.yaml", link):
        lines: list[str] = []
        claim = rundir.claim(
            str(tmp_path), overwrite=False, config_path=str(given), log=lines.append
        )
        claim.write_config("run:\n  dir: y\n")
        claim.release()
        assert (tmp_path / "config.yaml").read_text() == earlier
        assert lines == [
            f"{tmp_path / 'config.yaml'} is the --config file: left as it is (this run's "
            "resolved config differs: --set overrides or edits)"
        ]


def test_the_resolved_config_is_written_atomically_beside_another_input(tmp_path) -> None:
    given = tmp_path / "given.yaml"
    given.write_text("train:\n  epochs: 1\n")
    d = tmp_path / "run"
    claim = rundir.claim(str(d), overwrite=False, config_path=str(given))
    claim.write_config("resolved\n")
    claim.release()
    assert (d / "config.yaml").read_text() == "resolved\n"
    assert given.read_text() == "train:\n  epochs: 1\n"
    assert sorted(os.listdir(d)) == ["config.yaml"]  # no temporary file left


@pytest.mark.parametrize(
    "value, message",
    [
        ('""', "run.dir: expected the folder for the run's results, got ''; set it, for example "
               "run.dir=runs/my_run"),
        ('"runs/a\\0b"', "run.dir: 'runs/a\\x00b' holds a NUL byte, which no file system "
                         "accepts in a path; remove it"),
    ],
    ids=["empty", "nul"],
)  # fmt: skip
def test_invalid_run_dir_values_fail_the_config_checks(tmp_path, value, message) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"run:\n  dir: {value}\n")
    with pytest.raises(ConfigError) as e:
        check_config(load_config(path), world_size=1)
    assert str(e.value) == message


# --------------------------------------------------------------------------- real jobs

ONE_EPOCH = ["train.epochs=1", "train.verbose=false", "logging.tensorboard=false"]


def train_cmd(*overrides: str, config: pathlib.Path = QUICKSTART) -> list[str]:
    sets = [*ONE_EPOCH, *overrides]
    return [PYTHON, "-m", "hvd_train", "--config", str(config), *_sets(*sets)]


def _sets(*overrides: str) -> list[str]:
    return [x for o in overrides for x in ("--set", o)]


def errors_in(proc: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return [ln for ln in proc.stderr.splitlines() if ln.startswith("hvd_train: error:")]


@pytest.mark.processes
def test_a_single_process_on_a_refused_run_dir_exits_2_with_one_line(tmp_path, sleeper) -> None:
    """Three refusals in one test (each a real process: TensorFlow, data, Horovod started)."""
    held = tmp_path / "held"
    write_lock(held, pid=sleeper.pid, host=HOST, start_time=start_time(sleeper.pid))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    expected = {
        held: f"run.dir {held} is in use by another job (pid {sleeper.pid} on this host",
        foreign: f"run.dir {foreign} holds files that are not a run's (notes.txt);",
        a_file: f"run.dir {a_file} exists and is not a folder;",
    }
    for d, begins in expected.items():
        proc = run(train_cmd(f"run.dir={d}"), tmp_path)
        assert proc.returncode == 2, proc.stderr[-3000:]
        lines = errors_in(proc)
        assert len(lines) == 1 and lines[0].startswith(f"hvd_train: error: {begins}"), lines
    assert sorted(os.listdir(held)) == [LOCK_NAME]
    assert sorted(os.listdir(foreign)) == ["notes.txt"]


@pytest.mark.processes
def test_a_run_started_from_its_run_dirs_config_leaves_it_as_it_is(tmp_path) -> None:
    """The earlier run's resolved config given back as --config (how a run is repeated)."""
    d = tmp_path / "run"
    d.mkdir()
    resolved = check(run([PYTHON, "-m", "hvd_train.config", "--config", str(QUICKSTART),
                          *_sets(*ONE_EPOCH, f"run.dir={d}")], tmp_path)).stdout  # fmt: skip
    (d / "config.yaml").write_text(resolved)
    proc = check(run(train_cmd(config=d / "config.yaml"), tmp_path))
    assert f"{d / 'config.yaml'} is the --config file: left as it is\n" in proc.stdout
    assert (d / "config.yaml").read_text() == resolved
    assert json.loads((d / "summary.json").read_text())["status"] == "completed"
    assert not (d / LOCK_NAME).exists()


def snapshot(d: pathlib.Path) -> dict[str, str]:
    return {
        str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(d.rglob("*"))
        if p.is_file()
    }


def rank_of(pid: int) -> str:
    environ = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return next(e for e in environ if e.startswith(b"HOROVOD_RANK=")).decode()


@pytest.mark.processes
@pytest.mark.multiworker
def test_a_second_job_on_a_running_jobs_run_dir_is_refused_and_the_first_completes(
    tmp_path,
) -> None:
    d, gate = tmp_path / "run", tmp_path / "gate"
    gate.mkdir()
    # Rank 0 holds at the end of its epoch until `go`; rank 1 waits in a collective meanwhile.
    first = start([str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
                   PYTHON, str(WORKERS / "gated_chief.py"), str(gate), str(QUICKSTART),
                   *ONE_EPOCH, f"run.dir={d}", "horovod.stall_shutdown_s=0"], tmp_path)  # fmt: skip
    try:
        deadline_wait(lambda: (gate / "waiting").exists(), first)
        lock = json.loads((d / LOCK_NAME).read_text())
        assert rank_of(lock["pid"]) == "HOROVOD_RANK=0"
        before = snapshot(d)
        assert {"config.yaml", "metrics.csv", "summary.json", LOCK_NAME} <= set(before), before

        second = run(train_cmd(f"run.dir={d}", "runtime.seed=7"), tmp_path)
        assert second.returncode == 2, second.stderr[-3000:]
        assert errors_in(second) == [
            f"hvd_train: error: run.dir {d} is in use by another job (pid {lock['pid']} on this "
            f"host, since {lock['time']}); wait for it to end, or choose another run.dir"
        ]
        # Through the supervisor: no restart, and the running job's summary.json is not marked.
        third = run([PYTHON, "-m", "hvd_train", "launch", "--np", "2", "--max-restarts", "1",
                     "--config", str(QUICKSTART), *_sets(*ONE_EPOCH, f"run.dir={d}")], tmp_path)  # fmt: skip
        assert third.returncode != 0
        assert f"hvd_train: error: run.dir {d} is in use by another job" in third.stderr
        assert "not restarting: a bad config, bad input or an unusable run.dir" in third.stderr
        assert snapshot(d) == before
    finally:
        (gate / "go").touch()
        done = finish(first, 300)
    check(done)
    s = json.loads((d / "summary.json").read_text())
    assert s["status"] == "completed" and s["world_size"] == 2, s
    assert "launch" not in s and "failed_rank" not in s
    assert [ln.split(",")[0] for ln in (d / "metrics.csv").read_text().splitlines()] == [
        "epoch",
        "1",
    ]
    assert "seed: 42" in (d / "config.yaml").read_text()
    assert not (d / LOCK_NAME).exists()


def deadline_wait(ready, proc, timeout: float = 300) -> None:
    """Blocks until `ready()`; fails if the job ends first or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the job ended first:\n{out[-3000:]}\n{err[-3000:]}")
        assert time.monotonic() < deadline, f"not ready within {timeout} s"
        time.sleep(0.1)
