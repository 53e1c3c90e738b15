"""RunControl's agreement schedule, in one process with a fake clock (the 2-worker agreement
itself, signals and NaN, is run for real in test_faults.py)."""

from __future__ import annotations

import signal

import pytest
import tensorflow as tf

from hvd_train.config import CheckpointConfig
from hvd_train.record.stops import StopSignals
from hvd_train.runtime import distributed
from hvd_train.train.callbacks import stop as control
from hvd_train.train.callbacks.stop import RunControl


class FakeClock:
    def __init__(self, step_s: float):
        self.now, self.step_s = 1000.0, step_s

    def __call__(self) -> float:
        return self.now


def agreements(ctl: RunControl, clock: FakeClock, steps: int, k: int = 1) -> list[int]:
    """Runs `steps` steps of `clock.step_s` each, `k` a call (train.steps_per_execution, the
    hooks called with Keras' index of each call's last step); returns the position steps
    agreed at."""
    seen = []
    sync = ctl.sync

    def noting(check_weights: bool = False) -> None:
        seen.append(ctl.position_step)
        sync(check_weights)

    ctl.sync = noting
    ctl.on_epoch_begin(0)
    for last in range(k - 1, steps, k):
        clock.now += clock.step_s * k
        ctl.on_train_batch_end(last, {"loss": 0.5})
        if ctl.stopping:
            break
    return seen


@pytest.fixture
def make(monkeypatch):
    monkeypatch.setattr(distributed, "size", lambda: 1)  # no Horovod job: one worker

    def make(every: int, step_s: float, checkpoint_every: int = 0, steps_per_epoch=10_000):
        clock = FakeClock(step_s)
        k = CheckpointConfig(check_every_steps=every, every_steps=checkpoint_every or None)
        ctl = RunControl(StopSignals(), k, steps_per_epoch, clock=clock)
        ctl.set_model(tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1)]))
        ctl.set_params({"steps": steps_per_epoch})  # as fit sets them
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


def test_with_several_steps_a_call_each_interval_is_met_at_the_call_that_reaches_it(make) -> None:
    """train.steps_per_execution 3: the hooks run after steps 3, 6, 9, ...; an agreement every
    4 steps and a checkpoint every 5 come at the first call's end at or past each."""
    ctl, clock = make(4, step_s=0.1, checkpoint_every=5)
    assert agreements(ctl, clock, 21, k=3) == [6, 9, 12, 15, 18, 21]
    ctl, clock = make(4, step_s=0.1)
    assert agreements(ctl, clock, 21, k=3) == [6, 9, 12, 18, 21]
    assert ctl.signals.steps_run == 21 and ctl.step_in_epoch == 21
    # Auto: steps of 0.1 s, a call of 3 each 0.3 s: the first call, then once past a second.
    ctl, clock = make(0, step_s=0.1)
    assert agreements(ctl, clock, 30, k=3) == [3, 15, 27]


def test_a_part_done_epochs_short_last_call_counts_only_the_steps_it_ran(make) -> None:
    """A resume at step 4 of a 10-step epoch, 3 steps a call: Keras 3 gives the last call the
    index 8 (steps 6 to 8 of the 6 left), though it ran 0..5 and stopped at the data's end."""
    k = CheckpointConfig(check_every_steps=0, every_steps=None)
    ctl = RunControl(StopSignals(), k, 10, first_step_in_epoch=4, clock=FakeClock(0.1))
    ctl.set_params({"steps": 6})
    ctl.on_epoch_begin(0)
    for last in (2, 5, 8):
        ctl.on_train_batch_end(last, {"loss": 0.5})
    assert ctl.step_in_epoch == 10 and ctl.position_step == 10 and ctl.signals.steps_run == 6


def test_a_signal_stops_at_the_next_agreement(make, monkeypatch) -> None:
    monkeypatch.setattr(distributed, "is_chief", lambda: True)
    ctl, clock = make(0, step_s=0.1)
    ctl.on_epoch_begin(0)
    for step in range(1, 30):
        clock.now += clock.step_s
        if step == 5:
            ctl.signals.signum = int(signal.SIGTERM)  # what StopSignals records
        ctl.on_train_batch_end(step - 1, {"loss": 0.5})
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
            ctl.on_train_batch_end(step - 1, {"loss": float("nan") if step >= 3 else 0.5})
