"""What a person reads while training: rank 0's lines, Keras' bar only on a terminal, no
warnings to act on, and the bookkeeping numbers in the files and TensorBoard, not on screen.

The end-to-end checks run the quickstart as its README command does (horovodrun, Gloo, 2
workers: stdout is a pipe) and under a pseudo-terminal; the line rules run on a fake clock.
"""

from __future__ import annotations

import csv
import io
import json
import os
import pathlib
import pty
import re
import select
import subprocess
import sys
from types import SimpleNamespace

import pytest
from harness import BIN, PYTHON, QUICKSTART, ROOT, check, horovodrun

from hvd_train.base import logs
from hvd_train.config import TrainConfig, derive, load_config
from hvd_train.record.summary import problems
from hvd_train.train.callbacks import progress_bar
from hvd_train.train.callbacks.bookkeeping import BOOKKEEPING, BOOKKEEPING_TAGS
from hvd_train.train.callbacks.epoch_lines import EpochLines
from hvd_train.train.callbacks.progress_bar import ProgressBar
from hvd_train.train.run import fitting

EPOCHS = 2
LONGEST_LINE = 300  # characters: a line a terminal shows whole, prefixes included


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory) -> tuple[subprocess.CompletedProcess, pathlib.Path]:
    """The quickstart, two epochs, with horovodrun's whole output (stdout and stderr)."""
    run_dir = tmp_path_factory.mktemp("console") / "run"
    proc = horovodrun(
        2,
        [PYTHON, "-m", "hvd_train", "--config", str(QUICKSTART),
         "--set", f"run.dir={run_dir}", "--set", f"train.epochs={EPOCHS}"],
        ROOT,
    )  # fmt: skip
    return check(proc), run_dir


@pytest.mark.processes
@pytest.mark.multiworker
def test_quickstart_prints_one_short_line_per_epoch_and_no_warning(quickstart) -> None:
    proc, _ = quickstart
    lines = (proc.stdout + proc.stderr).splitlines()
    whole = "\n".join(lines)[-8000:]
    assert [ln for ln in lines if "warning" in ln.lower()] == [], whole
    long = [ln[:120] + "..." for ln in lines if len(ln) > LONGEST_LINE]
    assert long == [], whole  # progress-bar frames glued into one line
    for n in range(1, EPOCHS + 1):
        mine = [ln for ln in lines if re.search(rf"\[hvd_train\] epoch {n}/{EPOCHS}\b", ln)]
        assert len(mine) == 1 and mine[0].startswith("[0]<stdout>:[hvd_train] "), whole
        assert re.search(
            r": loss [\d.]+, accuracy [\d.]+, val_loss [\d.]+, val_accuracy [\d.]+, lr [\d.e-]+, "
            r"\d+ examples/s, step [\d.]+ ms, [\d.]+ s$",
            mine[0],
        ), mine[0]
    shown = [key for key in BOOKKEEPING if key in whole]
    assert shown == [], whole


@pytest.mark.processes
@pytest.mark.multiworker
def test_the_record_says_where_start_up_went(quickstart) -> None:
    """summary.json's startup_s: rank 0's phases in the order they run, each ending after the
    one before, from its process's start (no `process` phase: no `hvd-train launch` here)."""
    _, run_dir = quickstart
    startup = json.loads((run_dir / "summary.json").read_text())["startup_s"]
    phases = ["config", "imports", "horovod_init", "data", "run_dir", "model", "first_step"]
    assert list(startup) == phases, startup
    ends = [startup[p] for p in phases]
    assert 0 < ends[0] and ends == sorted(ends), startup


@pytest.mark.processes
@pytest.mark.multiworker
def test_the_record_holds_only_declared_fields_of_declared_types(quickstart) -> None:
    """summary.json of the finished run against record/summary.py's `Summary`: no field it
    does not declare, each value of its declared type; and every field of a completed run's
    start, results and figures is there."""
    _, run_dir = quickstart
    s = json.loads((run_dir / "summary.json").read_text())
    assert problems(s) == [], problems(s)
    completed = {
        "status", "started_at", "world_size", "controller", "device", "per_worker_batch_size",
        "global_batch_size", "steps_per_epoch", "base_learning_rate", "scaled_learning_rate",
        "batch_size_mode", "epochs", "epochs_completed", "resumed_from", "last_checkpoint",
        "model_path", "versions", "trainable_parameters", "gradient_dtype", "gradient_bytes",
        "trained_from", "earlier_jobs", "stopped_at", "train_examples_per_sec", "final_metrics",
        "input_wait_fraction", "skipped_files", "train_examples_per_sec_per_worker",
        "step_time_ms", "warmup_excluded", "accumulation_steps", "effective_batch_size",
        "allreduce_time_share", "negotiation_time_share", "startup_s", "wall_time_s",
        "best_model_path", "nccl_network",
    }  # fmt: skip
    assert completed <= set(s), sorted(completed - set(s))
    assert s["status"] == "completed" and s["world_size"] == 2, s
    assert s["nccl_network"] is None, s  # a CPU run: no NCCL


@pytest.mark.processes
@pytest.mark.multiworker
def test_bookkeeping_reaches_metrics_csv_and_tensorboard_under_clear_tags(quickstart) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, run_dir = quickstart
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == EPOCHS
    for key in ("examples_per_sec", "input_wait_fraction", "step_time_ms", "epoch_time_s"):
        assert all(float(row[key]) >= 0 for row in rows), (key, rows)
    train = EventAccumulator(str(run_dir / "tensorboard" / "train")).Reload()
    tags = set(train.Tags()["tensors"])
    assert set(BOOKKEEPING_TAGS.values()) <= tags, tags
    assert {"epoch_loss", "epoch_accuracy", "epoch_learning_rate"} <= tags, tags
    doubled = {t for t in tags if t.startswith("epoch_") and t[len("epoch_") :] in BOOKKEEPING}
    assert doubled <= {"epoch_learning_rate"}, doubled  # Keras' own, from the schedule
    assert len(train.Tensors("throughput/examples_per_sec")) == EPOCHS


@pytest.mark.processes
def test_progress_bar_on_a_terminal_without_bookkeeping(tmp_path) -> None:
    """One worker, stdout a pseudo-terminal, `train.verbose: 2`: Keras' bar, not the lines."""
    overrides = [f"run.dir={tmp_path / 'run'}", "train.epochs=1", "train.steps_per_epoch=5",
                 "train.verbose=2", "logging.tensorboard=false"]  # fmt: skip
    sets = [arg for o in overrides for arg in ("--set", o)]
    out = _run_in_terminal([PYTHON, "-m", "hvd_train", "--config", str(QUICKSTART), *sets])
    # The full bar of the epoch's 5 steps: Keras 2 draws it with "=", Keras 3 with "━" (in
    # colour on a terminal).
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert re.search(r"5/5 (\[=+\]|━+)", plain) and " - val_accuracy: " in plain, out
    assert "[hvd_train] epoch 1/1" not in out, out  # it would land inside the bar's line
    assert [key for key in BOOKKEEPING if key in out] == [], out


def _run_in_terminal(cmd: list[str], timeout: float = 300) -> str:
    main, child = pty.openpty()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=child, stderr=child)
    os.close(child)
    chunks = []
    try:
        while select.select([main], [], [], timeout)[0]:
            try:
                data = os.read(main, 65536)
            except OSError:  # Linux: EIO once the child's side is closed
                break
            if not data:
                break
            chunks.append(data)
    finally:
        proc.kill()
        proc.wait()
        os.close(main)
    out = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0, f"exit code {proc.returncode}\n{out[-8000:]}"
    return out


# --------------------------------------------------------------------------- the lines


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_lines(every_s: float, step_in_epoch: int = 0):
    plan = derive(load_config(QUICKSTART), 2, 1438)  # 22 steps of 64 examples
    control = SimpleNamespace(epoch=0, step_in_epoch=step_in_epoch, stopped=False)
    control.stopped_mid_epoch = lambda: control.stopped
    logged: list[str] = []
    clock = FakeClock()
    train = TrainConfig(epochs=12, log_every_s=every_s)
    lines = EpochLines(train, plan, control, log=logged.append, clock=clock)
    return lines, control, clock, logged


def run_steps(lines: EpochLines, control, clock: FakeClock, steps: int, seconds: float) -> None:
    for _ in range(steps):
        clock.now += seconds
        control.step_in_epoch += 1  # RunControl, earlier in the list, counts the step
        lines.on_train_batch_end(0, {"loss": 0.5, "accuracy": 0.75, "step_time_ms": 3.0})


def test_a_progress_line_every_interval_inside_an_epoch() -> None:
    lines, control, clock, logged = make_lines(every_s=10.0)
    lines.on_epoch_begin(0)
    run_steps(lines, control, clock, 9, 1.0)
    assert logged == []
    run_steps(lines, control, clock, 12, 1.0)  # due after steps 10 and 20
    assert logged == [
        "epoch 1/12, step 10/22: loss 0.5000, accuracy 0.7500 (rank 0, so far), 64 examples/s",
        "epoch 1/12, step 20/22: loss 0.5000, accuracy 0.7500 (rank 0, so far), 64 examples/s",
    ]


def test_no_progress_line_with_zero_and_a_resumed_epoch_counts_its_own_steps() -> None:
    lines, control, clock, logged = make_lines(every_s=0.0)
    lines.on_epoch_begin(0)
    run_steps(lines, control, clock, 22, 100.0)
    assert logged == []
    lines, control, clock, logged = make_lines(every_s=5.0, step_in_epoch=15)
    lines.on_epoch_begin(0)
    run_steps(lines, control, clock, 5, 1.0)
    assert logged == [
        "epoch 1/12, step 20/22: loss 0.5000, accuracy 0.7500 (rank 0, so far), 64 examples/s"
    ]


def test_epoch_line_holds_the_metrics_and_a_few_rates_and_no_bookkeeping_names() -> None:
    lines, control, clock, logged = make_lines(every_s=0.0)
    lines.on_epoch_begin(2)
    logs = {"loss": 0.41234, "accuracy": 0.88123, "input_wait_fraction": 0.2,
            "epoch_examples": 1408, "epoch_time_s": 0.9738, "examples_per_sec": 1445.9,
            "learning_rate": 0.002, "step_time_ms": 28.64, "examples_per_sec_per_worker": 723.0,
            "val_loss": 0.30121, "val_accuracy": 0.91089}  # fmt: skip
    lines.on_epoch_end(2, logs)
    assert logged == [
        "epoch 3/12: loss 0.4123, accuracy 0.8812, val_loss 0.3012, val_accuracy 0.9109, "
        "lr 0.002, 1446 examples/s, step 28.6 ms, 1.0 s"
    ]


def test_an_epoch_a_stop_cut_short_says_so() -> None:
    lines, control, clock, logged = make_lines(every_s=0.0)
    lines.on_epoch_begin(0)
    run_steps(lines, control, clock, 5, 1.0)
    control.stopped = True
    lines.on_epoch_end(0, {"loss": 0.5, "accuracy": 0.75, "examples_per_sec": 320.0})
    assert logged == ["epoch 1/12 stopped after step 5/22: loss 0.5000, accuracy 0.7500"]


def test_keras_bar_leaves_out_the_bookkeeping(capsys, each_keras) -> None:
    import tensorflow as tf

    keras = each_keras.keras

    class Bookkeeping(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            logs.update({key: 1.0 for key in BOOKKEEPING})

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = tf.zeros([8, 2]), tf.zeros([8, 1])
    history = model.fit(x, y, epochs=1, batch_size=4, callbacks=[Bookkeeping(), ProgressBar()])
    out = capsys.readouterr().out
    assert "2/2" in out and "loss:" in out, out
    assert [key for key in BOOKKEEPING if key in out] == [], out
    assert set(BOOKKEEPING) <= set(history.history)  # still in the history and the files


@pytest.mark.parametrize(
    ("verbose", "tty", "controller", "bar"),
    [(2, True, "gloo", True), (2, True, "none", True), (2, False, "gloo", False),
     (1, True, "gloo", False), (0, True, "gloo", False),
     (2, True, "mpi", False)],  # mpirun's ranks write to its pseudo-terminal
)  # fmt: skip
def test_bar_only_with_verbose_2_on_a_terminal(monkeypatch, verbose, tty, controller, bar) -> None:
    monkeypatch.setattr(progress_bar.distributed, "is_chief", lambda: True)
    monkeypatch.setattr(progress_bar.distributed, "controller", lambda: controller)
    monkeypatch.setattr(sys, "stdout", SimpleNamespace(isatty=lambda: tty))
    assert progress_bar.wants_progress_bar(verbose) is bar


def test_only_keras_first_batch_timing_warning_is_dropped_and_only_during_fit() -> None:
    import logging

    import tensorflow as tf

    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    slow = fitting.SLOW_FIRST_BATCH + " (batch time: 0.0398s vs `on_train_batch_end` time: 0.1202s)"
    other = "Callback method `on_train_batch_begin` is slow compared to the batch time"
    tf.get_logger().addHandler(handler)
    try:
        with fitting.without_first_batch_timing_warning():
            tf.get_logger().warning(slow)
            tf.get_logger().warning(other)
        tf.get_logger().warning(slow)
    finally:
        tf.get_logger().removeHandler(handler)
    assert seen == [other, slow]


@pytest.mark.parametrize(
    ("metrics", "rate", "said"),
    [
        ({"loss": 0.1, "accuracy": 0.99, "val_loss": 0.2, "val_accuracy": 0.97771}, 2854.2,
         "val_accuracy 0.9777, 2854 examples/s"),
        ({"loss": 3.3285, "accuracy": 0.0}, 0.4384, "accuracy 0.0000, 0.44 examples/s"),
        ({"loss": 3.3285}, 12.4, "loss 3.3285, 12 examples/s"),
    ],
)  # fmt: skip
def test_the_closing_line_names_only_what_the_run_measured(metrics, rate, said) -> None:
    """A run without validation (data.val_examples: 0) or without an accuracy metric: the
    closing line names what there is, never a `val_accuracy 0.0000` nothing measured, and a
    rate under 10 examples/s keeps its digits (a one-step run of a big model: 0.44, not 0)."""
    from hvd_train.train.run.outcome import closing_figures

    summary = {"final_metrics": metrics, "train_examples_per_sec": rate}
    assert closing_figures(summary) == said


class _Writes(io.StringIO):
    """A stream that keeps each write() it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


def test_a_line_and_its_newline_leave_a_worker_in_one_write() -> None:
    """Under horovodrun every worker has PYTHONUNBUFFERED=1, so each write() of print() reaches
    the pipe on its own: the text, then its newline. Open MPI tags what it reads, so another
    rank's line could land between the two (seen: `[1,0]<stderr>:hvd_train: error: ...[1,1]<stderr>:
    hvd_train: error: ...`). The worker's one-line errors and notes go out in one write."""
    printed, said = _Writes(), _Writes()
    print("hvd_train: error: data: too few", file=printed, flush=True)
    logs.print_line("hvd_train: error: data: too few", said)
    assert printed.writes == ["hvd_train: error: data: too few", "\n"]
    assert said.writes == ["hvd_train: error: data: too few\n"]
