"""Learning-rate schedules: values at chosen steps equal hand-computed ones; `lr-plot`.

The common setting: learning_rate 0.1 for one worker's batch of 10, 4 workers with linear
scaling (0.4), 400 examples (10 steps an epoch), a 1-epoch warm-up (10 steps), 11 epochs
(110 steps). So the warm-up covers steps 0-9 and the decay spans 100 steps after it.
"""

from __future__ import annotations

import math
import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf
from harness import PYTHON, QUICKSTART, check, run, start_up_lines

from hvd_train.base.errors import ConfigError
from hvd_train.config import check as check_config
from hvd_train.config import derive, load_config
from hvd_train.data.job import Job
from hvd_train.data.sources import Source
from hvd_train.runtime import distributed
from hvd_train.runtime.keras import binding
from hvd_train.runtime.schedules import WarmupScaledMath, learning_rate_schedule, rates
from hvd_train.train.checkpoint import CheckpointStore
from hvd_train.train.run import resume as resuming

COMMON = ["optimizer.learning_rate=0.1", "optimizer.lr_scaling=linear", "train.batch_size=10",
          "optimizer.warmup_epochs=1", "train.epochs=11"]  # fmt: skip


def schedule(*overrides: str) -> WarmupScaledMath:
    cfg = load_config(None, [*COMMON, *overrides])
    plan = derive(cfg, world_size=4, num_train=400)
    assert (plan.scaled_lr, plan.steps_per_epoch, plan.warmup_steps) == (pytest.approx(0.4), 10, 10)
    return learning_rate_schedule(cfg, plan)


def at(s: WarmupScaledMath, *steps: int) -> list[float]:
    return [float(s(tf.constant(step))) for step in steps]


def cos_(t: float, span: float = 99, top: float = 0.4, floor: float = 0.0) -> float:
    """Half a cosine from `top` at t = 0 to `floor` at t = span."""
    return floor + (top - floor) * (1 + math.cos(math.pi * t / span)) / 2


CASES = {
    # the warm-up: 0.1 -> 0.4 linearly over steps 0..10, then the scaled rate
    "constant": ([], {0: 0.1, 5: 0.25, 9: 0.37, 10: 0.4, 109: 0.4}),
    # x0.1 from epoch 3 (step 30), x0.01 from epoch 6 (step 60)
    "step": (["optimizer.step_boundaries_epochs=[3, 6]"],
             {5: 0.25, 10: 0.4, 29: 0.4, 30: 0.04, 59: 0.04, 60: 0.004, 109: 0.004}),
    # 0.4 x (1 + cos(pi t / 99)) / 2, t = step - 10: 0 at step 109, the run's last
    "cosine": ([], {5: 0.25, 10: 0.4, 35: cos_(25), 60: cos_(50), 85: cos_(75), 109: 0.0}),
    # floor 0.04: 0.04 + 0.36 x (1 + cos(pi t / 99)) / 2
    "cosine_floor": (["optimizer.min_lr_fraction=0.1"],
                     {10: 0.4, 60: cos_(50, floor=0.04), 109: 0.04}),
    # 0.4 x 0.5^(t / 20)
    "exponential": (["optimizer.decay_rate=0.5", "optimizer.decay_epochs=2"],
                    {5: 0.25, 10: 0.4, 20: 0.4 * 0.5**0.5, 30: 0.2, 50: 0.1, 70: 0.05}),
    # ... never below 0.3 x 0.4 = 0.12
    "exponential_floor": (["optimizer.decay_rate=0.5", "optimizer.decay_epochs=2",
                           "optimizer.min_lr_fraction=0.3"], {30: 0.2, 50: 0.12, 100: 0.12}),
    # 0.04 + 0.36 x (1 - t / 99): 0.04 at step 109, the run's last
    "warmup_decay": (["optimizer.min_lr_fraction=0.1"],
                     {0: 0.1, 5: 0.25, 10: 0.4, 35: 0.04 + 0.36 * 74 / 99,
                      60: 0.04 + 0.36 * 49 / 99, 109: 0.04}),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_rate_at_chosen_steps_equals_hand_computed(case: str) -> None:
    overrides, expected = CASES[case]
    s = schedule(f"optimizer.schedule={case.removesuffix('_floor')}", *overrides)
    assert at(s, *expected) == pytest.approx(list(expected.values()), rel=1e-5, abs=1e-7)


def test_vector_of_steps_gives_the_same_rates_as_one_step_at_a_time() -> None:
    s = schedule("optimizer.schedule=step", "optimizer.step_boundaries_epochs=[3, 6]")
    assert rates(s, 110) == pytest.approx(at(s, *range(110)), rel=1e-6)


def test_no_warmup_starts_at_the_scaled_rate() -> None:
    cfg = load_config(None, [*COMMON, "optimizer.warmup_epochs=0", "optimizer.schedule=cosine"])
    s = learning_rate_schedule(cfg, derive(cfg, world_size=4, num_train=400))
    assert at(s, 0, 55, 109) == pytest.approx([0.4, cos_(55, span=109), 0.0], abs=1e-7)


@pytest.mark.parametrize("decay", ["warmup_decay", "cosine"])
@pytest.mark.parametrize(
    ("workers", "examples", "epochs"), [(1, 400, 11), (2, 1438, 12), (3, 999, 5)]
)
def test_last_step_of_the_run_trains_at_min_lr_fraction(decay, workers, examples, epochs) -> None:
    cfg = load_config(None, ["optimizer.learning_rate=0.001", "optimizer.warmup_epochs=2",
                             f"optimizer.schedule={decay}", "optimizer.min_lr_fraction=0.05",
                             "train.batch_size=32", f"train.epochs={epochs}"])  # fmt: skip
    plan = derive(cfg, world_size=workers, num_train=examples)
    values = rates(learning_rate_schedule(cfg, plan), epochs * plan.steps_per_epoch)
    assert values[-1] == pytest.approx(0.05 * plan.scaled_lr, rel=1e-6)
    assert min(values) == pytest.approx(values[-1], rel=1e-6)  # never below the floor before


def test_schedule_round_trips_through_a_saved_model_with_its_optimizer(
    tmp_path, each_keras
) -> None:
    keras = each_keras.keras
    s = schedule("optimizer.schedule=warmup_decay", "optimizer.min_lr_fraction=0.1")
    assert isinstance(s, keras.optimizers.schedules.LearningRateSchedule)  # the active Keras'
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(s), loss="mse")
    model.fit(tf.ones((8, 3)), tf.ones((8, 2)), epochs=1, batch_size=4, verbose=0)  # 2 steps
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    restored = loaded.optimizer._learning_rate
    assert isinstance(restored, WarmupScaledMath)
    assert restored.get_config() == s.get_config()
    assert int(loaded.optimizer.iterations) == 2
    # the rate the next step will use: step 2 of the warm-up, 0.1 + 0.3 x 2/10
    assert float(restored(loaded.optimizer.iterations)) == pytest.approx(0.16)


def test_a_schedule_saved_as_its_flat_config_is_rebuilt_as_it_was() -> None:
    """A saved optimizer keeps the schedule as get_config's flat fields, as every version has
    written them: Keras rebuilds it through from_config."""
    saved = {"base_lr": 0.1, "scaled_lr": 0.4, "warmup_steps": 10, "decay": "step",
             "total_steps": 110, "boundaries": [30, 60], "factor": 0.5, "decay_rate": 1.0,
             "decay_steps": 1.0, "min_fraction": 0.0, "steps_per_epoch": 10}  # fmt: skip
    restored = WarmupScaledMath.from_config(saved)
    assert restored.get_config() == saved
    assert at(restored, 0, 10, 30, 60) == pytest.approx([0.1, 0.4, 0.2, 0.1])


@pytest.mark.parametrize("case", CASES)
def test_a_fresh_schedule_is_at_the_step_counter_bit_for_bit(case: str) -> None:
    """Its position is the step counter as float32, as the rates were computed before the
    schedule lived in epochs; re-based at the same steps per epoch (a resume at the same
    worker count), it still is."""
    s = schedule(f"optimizer.schedule={case.removesuffix('_floor')}", *CASES[case][0])
    counters = [0, 1, 9, 10, 109, 10**6 + 7, 2**24 + 1, 2**25 + 3]  # float32 rounds the last two
    as_before = [float(tf.cast(tf.constant(c, tf.int64), tf.float32)) for c in counters]
    assert [float(s.position(tf.constant(c, tf.int64))) for c in counters] == as_before
    before = rates(s, 110)
    assert before == (s._unscaled(tf.range(110, dtype=tf.float32)) * s.multiplier).numpy().tolist()
    s.continue_at(2.0, 20)  # 10 steps an epoch: step 20 starts epoch 2
    assert rates(s, 110) == before


# Resumed after 2 epochs of 6, inside a 3-epoch warm-up: 400 examples, 10 per worker, so 20
# steps an epoch at 2 workers, 40 at one, 12 at 3 with 2 batches per update.
RESUMED = ["optimizer.learning_rate=0.1", "optimizer.lr_scaling=linear", "train.batch_size=10",
           "optimizer.warmup_epochs=3", "train.epochs=6", "optimizer.min_lr_fraction=0.05"]  # fmt: skip


@pytest.mark.parametrize("decay", ["cosine", "warmup_decay"])
# (one worker accumulating 2 batches: its rate is scaled x2, so it has a warm-up to end)
@pytest.mark.parametrize(("before", "after", "accumulation"), [(2, 1, 2), (1, 2, 1), (2, 3, 2)])
def test_a_schedule_resumed_at_another_worker_count_continues_at_its_epoch(
    decay, before, after, accumulation
) -> None:
    """Re-based at epoch 2 (the step counter as `before` workers left it), the schedule of
    `after` workers ends its warm-up at epoch 3 and trains the last step of epoch 6, and no
    step before it, at the floor. Read at its own steps per epoch, the counter would end the
    run above the floor (fewer steps an epoch before) or reach it epochs early (more)."""
    cfg = load_config(None, [*RESUMED, f"optimizer.schedule={decay}",
                             f"train.gradient_accumulation_steps={accumulation}"])  # fmt: skip
    old, new = derive(cfg, before, 400), derive(cfg, after, 400)
    assert old.steps_per_epoch != new.steps_per_epoch
    counter, spe = 2 * old.steps_per_epoch, new.steps_per_epoch
    s = learning_rate_schedule(cfg, new)
    s.continue_at(2.0, counter)
    assert float(s.position(counter)) == 2 * spe
    ramp = new.base_lr + (new.scaled_lr - new.base_lr) * 2 / 3  # 2 of the 3 warm-up epochs
    assert at(s, counter) == pytest.approx([ramp], rel=1e-6)
    assert float(s.position(counter + spe)) == new.warmup_steps  # epoch 3's first step
    assert float(s(counter + spe - 1)) < new.scaled_lr  # the warm-up's last step
    assert float(s(counter + spe)) == pytest.approx(new.scaled_lr, rel=1e-6)
    left = s(tf.range(counter, counter + 4 * spe)).numpy()  # epochs 3 to 6
    floor = float(tf.constant(0.05 * new.scaled_lr, tf.float32))
    assert float(left[-1]) == floor
    assert float(left[:-1].min()) > floor


def _old_state(epoch: int, step: int, global_step: int, plan) -> dict:
    """state.json as hvd_train wrote it before the schedule lived in epochs."""
    return {"global_step": global_step, "epoch": epoch, "step": step,
            "examples_in_epoch": step * plan.global_batch, "epochs": 6,
            "steps_per_epoch": plan.steps_per_epoch, "world_size": plan.world_size,
            "per_worker_batch": plan.per_worker_batch, "global_batch": plan.global_batch,
            "seed": 0, "reason": "epoch_end" if not step else "steps", "metrics": {},
            "lr_multiplier": 0.5, "keras": binding.active().describe(), "random_states": None,
            "time": 0.0}  # fmt: skip


@pytest.mark.parametrize(
    ("epoch", "step", "position"),
    # 20 steps an epoch at 2 workers, 40 at one: step 5 of 20 is step 10 of 40
    [(2, 0, 80), (2, 5, 90)],
)
def test_an_old_checkpoint_resumes_at_its_epoch_at_another_worker_count(
    tmp_path, monkeypatch, each_keras, epoch, step, position
) -> None:
    """A checkpoint of 2 workers whose state.json has no key of the schedule's, resumed by
    train/run/resume.py at one worker (one process, Horovod's collectives stood in for): the
    schedule continues at the checkpoint's epoch and ends the run at the floor."""
    keras = each_keras.keras
    cfg = load_config(None, [*RESUMED, "optimizer.schedule=cosine", f"run.dir={tmp_path}"])
    two, one = derive(cfg, 2, 400), derive(cfg, 1, 400)

    def model_with_schedule():
        s = learning_rate_schedule(cfg, one)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.SGD(s), loss="mse")
        model.optimizer.build(model.trainable_variables)
        return model, s

    saved, _ = model_with_schedule()
    counter = epoch * two.steps_per_epoch + step
    saved.optimizer.iterations.assign(counter)
    path = CheckpointStore(str(tmp_path), cfg.checkpoint).save(
        saved, _old_state(epoch, step, counter, two)
    )
    names = [name for name, _ in tf.train.list_variables(f"{path}/ckpt")]
    # The schedule's variables are not in it (its origin, as the multiplier, is set on resume)
    assert not [n for n in names if "origin" in n or "multiplier" in n], names

    for name, stand_in in [("is_chief", lambda: True), ("rank", lambda: 0),
                           ("broadcast_object", lambda obj, name: obj), ("log", print)]:  # fmt: skip
        monkeypatch.setattr(distributed, name, stand_in)
    monkeypatch.setattr(each_keras, "broadcast_model", lambda model: None)
    model, s = model_with_schedule()
    no_data = Source(*[np.zeros(0, np.float32)] * 4, num_classes=2)  # resume reads none
    start = resuming.resume(Job(cfg, one, no_data), model)
    assert (start.epoch, start.step) == (epoch, position - epoch * one.steps_per_epoch)
    assert int(model.optimizer.iterations.numpy()) == counter
    assert float(s.position(counter)) == position
    assert float(s.multiplier.numpy()) == 0.5
    last = counter + 6 * one.steps_per_epoch - position - 1  # the counter at epoch 6's last step
    assert float(s(last)) == float(tf.constant(0.05 * one.scaled_lr * 0.5, tf.float32))
    assert float(s(last - 1)) > float(s(last))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["optimizer.schedule=step"], "optimizer.step_boundaries_epochs: schedule 'step' needs at least one epoch at which to multiply the rate by step_factor, for example [30, 60]"),
        (["optimizer.step_boundaries_epochs=[6, 3]"], "optimizer.step_boundaries_epochs: expected increasing epochs, got [6, 3]"),
        (["optimizer.schedule=step", "optimizer.warmup_epochs=5", "optimizer.step_boundaries_epochs=[3]"], "optimizer.step_boundaries_epochs: epoch 3 falls inside the warm-up of 5 epochs; boundaries count from the start and must come after it"),
        (["optimizer.schedule=warmup_decay", "optimizer.warmup_epochs=0"], "optimizer.warmup_epochs: schedule 'warmup_decay' ramps up over warmup_epochs, then decays until train.epochs (10); expected 0 < warmup_epochs < 10, got 0"),
    ],
)  # fmt: skip
def test_inconsistent_schedule_settings_are_config_errors(overrides, message) -> None:
    with pytest.raises(ConfigError) as info:
        check_config(load_config(None, overrides), world_size=1)
    assert str(info.value) == message


NO_HOROVOD = "import sys; sys.modules['horovod'] = None; from hvd_train.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.mark.processes
def test_lr_plot_draws_the_schedule_without_horovod(tmp_path: pathlib.Path) -> None:
    """The quickstart at 2 workers: digits (1,438 training examples), batch 32 x 2 = 64, so
    22 steps an epoch; the rate ramps from 0.001 to 0.002 over 2 epochs, then down to 0.0001."""
    out = tmp_path / "plots" / "lr.png"
    proc = check(run([PYTHON, "-c", NO_HOROVOD, "lr-plot", "--config", str(QUICKSTART),
                      "--workers", "2", "--set", "optimizer.schedule=warmup_decay",
                      "--set", "optimizer.min_lr_fraction=0.05", "--out", str(out)],
                     cwd=tmp_path, timeout=120))  # fmt: skip
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert start_up_lines(proc.stdout + proc.stderr) == [], proc.stderr  # TensorFlow's own
    assert "2 worker(s), global batch 64, 22 steps/epoch x 12 epochs = 264 steps" in proc.stdout
    assert "first step 0.001, highest 0.002 (step 44), last step " in proc.stdout
    last = float(re.search(r"last step (\S+)", proc.stdout).group(1))
    assert last == pytest.approx(0.05 * 0.002)  # step 263, the last, at min_lr_fraction


@pytest.mark.processes
def test_lr_plot_needs_the_example_count_only_when_it_cannot_know_it(tmp_path) -> None:
    args = [PYTHON, "-m", "hvd_train", "lr-plot", "--config", str(QUICKSTART),
            "--train-examples", "640", "--workers", "2", "--out", str(tmp_path / "a.png")]  # fmt: skip
    assert "10 steps/epoch" in check(run(args, cwd=tmp_path, timeout=120)).stdout
    bad = run([*args[:-2], "--out", str(tmp_path / "b.png"), "--train-examples", "0"], tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1] == (
        "hvd_train: error: --train-examples: expected a count >= 1, got 0"
    )
