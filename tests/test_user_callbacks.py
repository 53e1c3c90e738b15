"""Users' own Keras callbacks (`callbacks:`): checked at load, built with their args, run on
the right ranks, and a stop one rank asks for ends the job on every rank, recorded as such."""

from __future__ import annotations

import csv
import json
import pathlib
import types

import numpy as np
import pytest
from harness import PYTHON, QUICKSTART, WORKERS, check, horovodrun, run

from hvd_train import config as config_module
from hvd_train.base.errors import ConfigError
from hvd_train.config import CallbackConfig, dump_yaml, load_config
from hvd_train.runtime.keras import binding
from hvd_train.runtime.schedules import rates, warmup_scaled
from hvd_train.train.callbacks.user_callbacks import construct
from hvd_train.train.checkpoint import read_state
from hvd_train.train.run.outcome import results

PROBES = WORKERS / "probe_callbacks.py"


def callbacks_set(items: list[dict]) -> str:
    return "callbacks=" + json.dumps(items)  # JSON is YAML: one --set holds the whole list


def test_callbacks_load_in_order_and_round_trip_through_yaml(tmp_path) -> None:
    items = [
        {"class": "tensorflow.keras.callbacks:EarlyStopping", "args": {"patience": 2}},
        {"class": "my_pkg.cbs:MyCallback", "args": {"every": [1, 2]}, "ranks": "chief"},
        {"class": "TerminateOnNaN"},
    ]
    cfg = load_config(QUICKSTART, [callbacks_set(items)])
    assert [c.cls for c in cfg.callbacks] == [i["class"] for i in items]
    assert cfg.callbacks[1].kwargs() == {"every": [1, 2]} and cfg.callbacks[1].ranks == "chief"
    assert cfg.callbacks[2].kwargs() == {} and cfg.callbacks[2].ranks is None
    path = tmp_path / "resolved.yaml"
    path.write_text(dump_yaml(cfg))
    assert load_config(path) == cfg


def test_callbacks_given_as_a_mapping_are_refused() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, ["callbacks.class=EarlyStopping"])
    assert str(info.value) == (
        "--set callbacks.class=EarlyStopping: callbacks: expected a list of "
        "{class: 'module:Name', args: {...}} mappings, got a mapping"
    )


# How the default Keras is named in messages: Keras 3's `keras`, or TensorFlow 2.15's tf.keras.
KERAS = "keras" if binding.has_keras3() else "tf.keras"


@pytest.mark.parametrize(
    ("cls", "args", "message"),
    [
        ("no_such_module_xyz:Foo", {}, "callbacks[3].class: cannot import module 'no_such_module_xyz' (No module named 'no_such_module_xyz'); it must be importable from the working directory or PYTHONPATH, or be given as path/to/file.py"),
        ("EarlyStoping", {}, f"callbacks[3].class: {KERAS}.callbacks has no 'EarlyStoping'; name a subclass of {KERAS}.callbacks.Callback as 'module:Name' (or a {KERAS}.callbacks name)"),
        ("tensorflow.keras.layers:Dense", {}, f"callbacks[3].class: tensorflow.keras.layers has no Keras callback class 'Dense'; name a subclass of {KERAS}.callbacks.Callback as 'module:Name' (or a {KERAS}.callbacks name)"),
        (f"{PROBES}:MyPlateau", {}, "callbacks[3].class: MyPlateau is a subclass of Keras' ReduceLROnPlateau, which sets optimizer.lr, and our rate is a schedule; use ReduceLROnPlateau itself (hvd_train runs its own version, which scales the schedule)"),
        (f"{PROBES}:MyBackup", {}, "callbacks[3].class: MyBackup is a BackupAndRestore: hvd_train already checkpoints and resumes exactly (checkpoint.*, train.resume); remove it"),
        ("EarlyStopping", {"patiense": 2}, "callbacks[3].args: EarlyStopping rejected ['patiense']: EarlyStopping.__init__() got an unexpected keyword argument 'patiense'; its arguments are: monitor, min_delta, patience, verbose, mode, baseline, restore_best_weights, start_from_epoch"),
    ],
)  # fmt: skip
def test_a_callback_that_cannot_be_built_names_its_item(cls, args, message) -> None:
    with pytest.raises(ConfigError) as info:
        construct(CallbackConfig(cls, tuple(args.items())), 3)
    assert str(info.value) == message


def test_a_users_callback_is_built_with_its_args() -> None:
    callback = construct(CallbackConfig(f"{PROBES}:StopOnOneRank", (("rank", 1), ("epoch", 2), ("step", 5))), 0)  # fmt: skip
    assert (type(callback).__name__, callback.rank, callback.epoch, callback.step) == (
        "StopOnOneRank", 1, 2, 5
    )  # fmt: skip


@pytest.mark.parametrize(
    "name", ["ReduceLROnPlateau", "tensorflow.keras.callbacks:ReduceLROnPlateau"]
)
def test_keras_reduce_lr_on_plateau_becomes_ours_with_its_args(name) -> None:
    callback = construct(CallbackConfig(name, (("factor", 0.5), ("patience", 3))), 0)
    assert (type(callback).__mro__[1], callback.factor, callback.patience) == (
        binding.keras().callbacks.ReduceLROnPlateau,
        0.5,
        3,
    )
    assert type(callback).__module__ == "hvd_train.train.callbacks.user_callbacks"  # ours


def test_the_schedule_multiplier_scales_warm_up_and_decay_alike() -> None:
    s = warmup_scaled(None, 0.1, 0.4, warmup_steps=10, decay="cosine", total_steps=110)
    before = rates(s, 110)
    s.multiplier.assign(0.25)
    assert rates(s, 110) == [r * np.float32(0.25) for r in before]


def test_reduce_lr_on_plateau_is_refused_with_elastic() -> None:
    cfg = load_config(None, [callbacks_set([{"class": "ReduceLROnPlateau"}]),
                             "elastic.enabled=true", "elastic.discovery_script=/bin/true"])  # fmt: skip
    with pytest.raises(ConfigError, match="^callbacks: ReduceLROnPlateau's factor is not part"):
        config_module.check(cfg, world_size=2)


def _control(stopped_at=None, signum=0) -> types.SimpleNamespace:
    return types.SimpleNamespace(stopped_at=stopped_at, stopping=stopped_at is not None,
                                 stop_signal=signum)  # fmt: skip


def test_record_of_an_early_stop_and_of_a_signal_at_the_same_epoch() -> None:
    cfg = load_config(None, ["train.epochs=10"])
    early = types.SimpleNamespace(stopped_early={"epoch": 3, "by": "EarlyStopping"})
    history = {"epoch_time_s": [1.0, 1.0, 1.0], "epoch_examples": [10, 10, 10]}
    ended = results(history, cfg.train, _control(), early)
    assert (ended["status"], ended["epochs_completed"], ended["stopped_early"]) == (
        "completed", 3, {"epoch": 3, "by": "EarlyStopping"}
    )  # fmt: skip
    for user in (None, types.SimpleNamespace(stopped_early={"epoch": 10, "by": "X"})):
        full = results(
            history, cfg.train, _control(), user
        )  # a stop at the last epoch is no early one
        assert (full["status"], full["epochs_completed"], "stopped_early" in full) == (
            "completed", 10, False
        )  # fmt: skip
    # SIGTERM (15) agreed at the same epoch end: the run was stopped, not finished.
    stopped = results(history, cfg.train, _control(stopped_at=(3, 0), signum=15), early)
    assert (stopped["status"], stopped["stopped_by"], "stopped_early" in stopped) == (
        "interrupted", "SIGTERM", False
    )  # fmt: skip


@pytest.mark.processes
def test_bad_callback_args_end_the_run_in_one_line_with_exit_code_2(tmp_path) -> None:
    bad = callbacks_set([{"class": "EarlyStopping", "args": {"patiense": 2}}])
    proc = run([PYTHON, "-m", "hvd_train", "--config", str(QUICKSTART), "--set", bad,
                "--set", f"run.dir={tmp_path / 'run'}"], tmp_path)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    # Found after run.dir was claimed: the rank's one failure line, which points to its log.
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "[rank 0] failed: callbacks[0].args: EarlyStopping rejected ['patiense']"
    ), proc.stderr[-3000:]
    assert last.endswith(f"; full log: {tmp_path / 'run' / 'logs' / 'rank-0.log'}"), last


@pytest.mark.processes
def test_an_epoch_keras_ends_early_on_an_end_of_data_error_fails_the_run(tmp_path) -> None:
    """TensorFlow's end-of-data error raised mid-epoch (here by a callback) makes Keras end the
    epoch quietly, with a warning, and leave the later epochs empty. The run is not complete:
    it fails, the record says where, and never says completed."""
    run_dir = tmp_path / "run"
    items = [{"class": "probe_callbacks:EndOfDataAt", "args": {"epoch": 2, "step": 3}}]
    cmd = [PYTHON, "-m", "hvd_train", "--config", str(QUICKSTART), "--set", callbacks_set(items),
           *(x for s in ("train.verbose=false", "logging.tensorboard=false", "train.epochs=4",
                         f"run.dir={run_dir}") for x in ("--set", s))]  # fmt: skip
    proc = run(cmd, WORKERS)
    assert proc.returncode == 1, proc.stderr[-3000:]
    s = json.loads((run_dir / "summary.json").read_text())
    assert (s["status"], s["epochs_completed"]) == ("failed", 1), s
    assert "epoch 2 ended after 3 of its" in s["error"], s


def _job(tmp_path: pathlib.Path, items: list[dict], *sets: str) -> dict:
    """A 2-worker Gloo job on the quickstart; returns its summary.json."""
    run_dir = tmp_path / "run"
    cmd = [PYTHON, "-m", "hvd_train", "--config", str(QUICKSTART), "--set", callbacks_set(items),
           *(x for s in ("train.verbose=false", "logging.tensorboard=false", f"run.dir={run_dir}",
                         *sets) for x in ("--set", s))]  # fmt: skip
    check(horovodrun(2, cmd, WORKERS, timeout=300))  # a hang fails here, with every rank's output
    return json.loads((run_dir / "summary.json").read_text())


def _lines(path: pathlib.Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()]


@pytest.mark.processes
@pytest.mark.multiworker
def test_a_stop_on_one_rank_mid_epoch_ends_every_rank_at_that_epochs_end(tmp_path) -> None:
    """Rank 1 alone sets stop_training after step 5 of epoch 2 (of 6): both ranks finish epoch
    2, stop together, and the record says completed, stopped early by that callback, with the
    checkpoint and model.keras of a normal end (checkpoint.every_epochs=0: only at the end).
    Without the agreement this job hangs (seen: the harness's 300 s timeout)."""
    out = tmp_path / "counts"
    out.mkdir()
    items = [
        {"class": "probe_callbacks:StopOnOneRank", "args": {"rank": 1, "epoch": 2, "step": 5}},
        {"class": "probe_callbacks:CountEpochs", "args": {"out_dir": str(out), "tag": "all"}},
        {"class": "probe_callbacks:CountEpochs", "args": {"out_dir": str(out), "tag": "chief"},
         "ranks": "chief"},
        {"class": "probe_callbacks:RankedCSVLogger", "args": {"filename": str(out / "log")}},
    ]  # fmt: skip
    s = _job(tmp_path, items, "train.epochs=6", "checkpoint.every_epochs=0")
    assert (s["status"], s["epochs_completed"], s["stopped_at"]) == ("completed", 2, None), s
    assert s["stopped_early"] == {"epoch": 2, "by": "StopOnOneRank"}, s
    assert s["model_path"] and pathlib.Path(s["model_path"]).is_file(), s
    assert (
        read_state(s["last_checkpoint"])["epoch"],
        read_state(s["last_checkpoint"])["step"],
    ) == (2, 0)
    steps = str(s["steps_per_epoch"])
    rank0, rank1 = _lines(out / "all.rank0"), _lines(out / "all.rank1")
    # Every step of epoch 2 ran on rank 1 too, and both ranks' callbacks saw the same numbers.
    assert [line[:2] for line in rank1] == [["1", steps], ["2", steps]], rank1
    assert rank0 == rank1
    assert _lines(out / "chief.rank0") == rank0
    assert not (out / "chief.rank1").exists()  # ranks: chief
    # A subclass of Keras' CSVLogger writes files: rank 0 only, without being told.
    assert len((out / "log.rank0").read_text().splitlines()) == 1 + 2
    assert not (out / "log.rank1").exists()


@pytest.mark.processes
@pytest.mark.multiworker
def test_early_stopping_ends_the_job_on_every_rank_and_the_record_says_so(tmp_path) -> None:
    """EarlyStopping, by its bare Keras name, with a min_delta no epoch can reach: it stops
    after epoch 2 (the first sets the best; patience 0)."""
    items = [{"class": "EarlyStopping",
              "args": {"monitor": "val_accuracy", "min_delta": 1.0, "patience": 0}}]  # fmt: skip
    s = _job(tmp_path, items, "train.epochs=5")
    assert (s["status"], s["epochs_completed"]) == ("completed", 2), s
    assert s["stopped_early"] == {"epoch": 2, "by": "EarlyStopping"}, s
    assert pathlib.Path(s["model_path"]).is_file(), s
    assert read_state(s["last_checkpoint"])["epoch"] == 2
    assert len((tmp_path / "run" / "metrics.csv").read_text().splitlines()) == 1 + 2


def _rates_in_csv(run_dir: pathlib.Path) -> list[float]:
    with open(run_dir / "metrics.csv") as f:
        return [float(row["learning_rate"]) for row in csv.DictReader(f)]


@pytest.mark.processes
@pytest.mark.multiworker
def test_reduce_lr_on_plateau_scales_the_schedule_and_a_resume_keeps_the_factor(tmp_path) -> None:
    """ReduceLROnPlateau with a min_delta no epoch reaches and patience 0 halves the rate after
    epochs 2 and 3 (the first sets the best). No warm-up: the quickstart's rate is then
    0.001 x 2 workers throughout. metrics.csv gives each epoch's rate (6 significant digits:
    the tolerance). The same command with train.epochs=4 resumes with the factor 0.25 kept
    (its fresh ReduceLROnPlateau takes epoch 4 as its best: no reduction there)."""
    items = [{"class": "ReduceLROnPlateau",
              "args": {"monitor": "val_accuracy", "mode": "max", "min_delta": 1.0,
                       "patience": 0, "factor": 0.5}}]  # fmt: skip
    s = _job(tmp_path, items, "train.epochs=3", "optimizer.warmup_epochs=0")
    assert s["status"] == "completed" and "stopped_early" not in s, s
    assert read_state(s["last_checkpoint"])["lr_multiplier"] == 0.25
    assert _rates_in_csv(tmp_path / "run") == pytest.approx([0.002, 0.002, 0.001], rel=1e-5)
    s = _job(tmp_path, items, "train.epochs=4", "optimizer.warmup_epochs=0")
    assert s["resumed_from"] and s["epochs_completed"] == 4, s
    assert _rates_in_csv(tmp_path / "run") == pytest.approx([0.002, 0.002, 0.001, 0.0005], rel=1e-5)
    assert read_state(s["last_checkpoint"])["lr_multiplier"] == 0.25
