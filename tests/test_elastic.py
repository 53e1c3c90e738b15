"""Horovod Elastic: the rescaling of the learning rate when the worker count changes, and the
run decorator's reading of errors, in a real elastic job (the trainer's elastic job, a worker
killed mid-run: tests/test_faults.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf
from harness import BIN, PYTHON, QUICKSTART, WORKERS, check, run, two_local_hosts

from hvd_train.config import derive, load_config
from hvd_train.data.job import plan_job
from hvd_train.data.sources import load_source
from hvd_train.runtime.schedules import lr_multiplier
from hvd_train.train.run.elastic import TrackPosition, rescale_learning_rate
from hvd_train.train.step import make_optimizer

WORKER = str(WORKERS / "elastic_collectives.py")
STEPS = 6  # the worker's


def test_a_smaller_world_trains_at_its_own_rate_and_keeps_the_multiplier() -> None:
    cfg = load_config(QUICKSTART, ["optimizer.warmup_epochs=0"])
    at_two = plan_job(cfg, load_source(cfg), 2)  # the quickstart's 1438 training examples
    at_one = at_two.resized(1)
    two, one = at_two.plan, at_one.plan
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer=make_optimizer(at_two), loss="mse")
    x, y = np.zeros((4, 3)), np.zeros((4, 2))
    model.fit(x, y, verbose=0)  # the step is traced with two workers' rates
    assert float(model.optimizer.learning_rate) == pytest.approx(two.scaled_lr)
    lr_multiplier(model.optimizer).assign(0.5)  # as ReduceLROnPlateau, or a resumed run, left it
    rescale_learning_rate(model, at_one, 1 / two.steps_per_epoch)  # one step of 2 workers
    assert float(model.optimizer._learning_rate.position(1)) == 2  # 2 steps of one worker
    model.fit(x, y, verbose=0)
    assert one.scaled_lr == pytest.approx(two.scaled_lr / 2)
    assert float(model.optimizer.learning_rate) == pytest.approx(one.scaled_lr * 0.5)
    assert model.optimizer.iterations.numpy() == 2, "the step counter goes on"


def test_after_a_resize_the_schedule_trains_the_last_step_at_its_floor() -> None:
    """The step counter of 2 epochs at 2 workers (22 steps each), then one worker alone (44
    steps an epoch) from epoch 2: the cosine reaches 0 at epoch 4's last step, not before."""
    cfg = load_config(QUICKSTART, ["optimizer.schedule=cosine", "train.epochs=4"])
    at_two = plan_job(cfg, load_source(cfg), 2)  # the quickstart's 1438 training examples
    at_one = at_two.resized(1)
    two, one = at_two.plan, at_one.plan
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer=make_optimizer(at_two), loss="mse")
    model.optimizer.build(model.trainable_variables)
    model.optimizer.iterations.assign(2 * two.steps_per_epoch)  # as the last commit left it
    rescale_learning_rate(model, at_one, 2.0)
    model.optimizer.iterations.assign_add(2 * one.steps_per_epoch - 2)
    assert float(model.optimizer.learning_rate) > 0.0  # epoch 4's last step but one
    model.optimizer.iterations.assign_add(1)
    assert float(model.optimizer.learning_rate) == 0.0


class _State:
    """Horovod Elastic's state as the position callback sees it: the position, and commits."""

    def __init__(self, epoch: int, batch: int) -> None:
        self.epoch, self.batch, self.global_batch = epoch, batch, 0
        self.commits: list[tuple[int, int]] = []

    def commit(self) -> None:
        self.commits.append((self.epoch, self.batch))


@pytest.mark.parametrize("k", [1, 4])
def test_a_commit_holds_the_position_of_the_steps_it_holds(k: int) -> None:
    """Committed every 5 steps, `k` steps a call (train.steps_per_execution), in a part-done
    epoch from step 3 of 22 (Keras' index counts from the fit's first step; the last call's
    may run past the data's end): each commit's position is the steps done, the call that
    holds them included (a commit made before the position moved would redo a step after a
    reset), at the end of the call that reaches each 5th step, and at the epoch's end."""
    state = _State(epoch=1, batch=3)
    track = TrackPosition(state, derive(load_config(QUICKSTART), 2, 1438), every_steps=5)
    track.set_params({"steps": 19})
    track.on_epoch_begin(1)
    for last in range(k - 1, 19 + k - 1, k):
        track.on_train_batch_end(last)
        assert state.batch == 3 + min(last + 1, 19)
    track.on_epoch_end(1)
    if k == 1:
        assert state.commits == [(1, 5), (1, 10), (1, 15), (1, 20), (2, 0)]
    else:  # calls end at steps 7, 11, 15, 19, 22 of the epoch
        assert state.commits == [(1, 7), (1, 11), (1, 15), (1, 22), (2, 0)]


@pytest.mark.processes
@pytest.mark.stack
def test_a_worker_lost_in_a_grouped_all_reduce_resets_the_survivor(tmp_path) -> None:
    """Rank 1 exits between steps; rank 0's next collective, a grouped all-reduce as the
    gradients' is, fails. The survivor rolls back, resets to one worker and runs every step.
    (Horovod's own decorator returned quietly after 3 of 6 steps, with no reset: it reads only
    HorovodAllreduce, HorovodAllgather and HorovodBroadcast in the error as a collective's.)"""
    discover = two_local_hosts(tmp_path)
    ended = run([str(BIN / "horovodrun"), "-np", "2", "--min-np", "1", "--max-np", "2",
                 "--host-discovery-script", str(discover), "--gloo",
                 PYTHON, WORKER, "lost", str(tmp_path)], tmp_path, 300)  # fmt: skip
    check(ended)
    survivor = json.loads((tmp_path / "rank-0.json").read_text())
    assert survivor == {"resets": [1], "steps": STEPS, "size": 1}, survivor


@pytest.mark.processes
@pytest.mark.stack
def test_an_error_in_an_elastic_run_that_is_not_a_collectives_ends_it(tmp_path) -> None:
    """A TensorFlow UnknownError from anything but a collective ends the run with that error:
    an image read over the network whose connection was reset (Horovod's decorator returned
    None; reading the lost connection as a lost worker would have reset forever)."""
    check(run([PYTHON, WORKER, "unreadable", str(tmp_path)], tmp_path, 120))
    report = json.loads((tmp_path / "rank-0.json").read_text())
    assert report == {"resets": [], "raised": "UnknownError", "steps": 2, "size": 1}, report
