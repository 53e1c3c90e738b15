"""RunControl's agreement schedule, in one process with a fake clock (the 2-worker agreement
itself, signals and NaN, is run for real in test_faults.py)."""

from __future__ import annotations

import signal

import pytest
import tensorflow as tf

from hvd_train.record.stops import StopSignals
from hvd_train.runtime import distributed
from hvd_train.train import control
from hvd_train.train.control import RunControl


class FakeClock:
    def __init__(self, step_s: float):
        self.now, self.step_s = 1000.0, step_s

    def __call__(self) -> float:
        return self.now


def agreements(ctl: RunControl, clock: FakeClock, steps: int) -> list[int]:
    """Runs `steps` steps of `clock.step_s` each; returns the position steps agreed at."""
    seen = []
    sync = ctl.sync

    def noting(check_weights: bool = False) -> None:
        seen.append(ctl.position_step)
        sync(check_weights)

    ctl.sync = noting
    ctl.on_epoch_begin(0)
    for _ in range(steps):
        clock.now += clock.step_s
        ctl.on_train_batch_end(0, {"loss": 0.5})
        if ctl.stopping:
            break
    return seen


@pytest.fixture
def make(monkeypatch):
    monkeypatch.setattr(distributed, "size", lambda: 1)  # no Horovod job: one worker

    def make(every: int, step_s: float, checkpoint_every: int = 0, steps_per_epoch=10_000):
        clock = FakeClock(step_s)
        due = (lambda s: s % checkpoint_every == 0) if checkpoint_every else (lambda s: False)
        ctl = RunControl(StopSignals(), every, steps_per_epoch, due, clock=clock)
        ctl.set_model(tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1)]))
        return ctl, clock

    return make


def test_auto_agrees_about_once_a_second(make) -> None:
    ctl, clock = make(0, step_s=0.1)
    # First at step 1 (no step time known yet), then every 1 s / 0.1 s = 10 steps.
    assert agreements(ctl, clock, 45) == [1, 11, 21, 31, 41]
    ctl, clock = make(0, step_s=2.5)  # steps longer than a second: every step
    assert agreements(ctl, clock, 4) == [1, 2, 3, 4]
    ctl, clock = make(0, step_s=1e-5)  # very short steps: capped
    assert agreements(ctl, clock, 2500) == [1, 1001, 2001]


def test_auto_also_agrees_at_each_epochs_first_step(make) -> None:
    # A signal that came during the epoch-end work is acted on one step into the next epoch.
    ctl, clock = make(0, step_s=0.1, steps_per_epoch=15)
    assert agreements(ctl, clock, 15) == [1, 11]  # the whole of epoch 0; next due at step 21
    ctl.on_epoch_begin = lambda epoch, logs=None: RunControl.on_epoch_begin(ctl, 1)
    assert agreements(ctl, clock, 3) == [16]  # epoch 1's first step, not step 21


def test_fixed_interval_and_checkpoints_force_an_agreement(make) -> None:
    ctl, clock = make(4, step_s=0.1, checkpoint_every=6)
    assert agreements(ctl, clock, 13) == [4, 6, 8, 12]


def test_a_signal_stops_at_the_next_agreement(make, monkeypatch) -> None:
    monkeypatch.setattr(distributed, "is_chief", lambda: True)
    ctl, clock = make(0, step_s=0.1)
    ctl.on_epoch_begin(0)
    for step in range(1, 30):
        clock.now += clock.step_s
        if step == 5:
            ctl.signals.signum = int(signal.SIGTERM)  # what StopSignals records
        ctl.on_train_batch_end(0, {"loss": 0.5})
        if ctl.stopping:
            break
    assert ctl.stopped_at == (0, 11)  # agreed at steps 1 and 11: stops after step 11
    assert ctl.stop_signal == signal.SIGTERM and ctl.model.stop_training


def test_a_nan_loss_is_an_error_at_the_next_agreement(make) -> None:
    ctl, clock = make(0, step_s=0.1)
    ctl.on_epoch_begin(0)
    with pytest.raises(
        control.TrainingError, match="loss became NaN or infinite at epoch 1, step 11"
    ):
        for step in range(1, 30):
            clock.now += clock.step_s
            ctl.on_train_batch_end(0, {"loss": float("nan") if step >= 3 else 0.5})
