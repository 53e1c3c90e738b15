"""Horovod Elastic's rescaling of the learning rate when the worker count changes (the real
elastic job, a worker killed mid-run: tests/test_faults.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from harness import QUICKSTART

from hvd_train.config import derive, load_config
from hvd_train.runtime.schedules import lr_multiplier
from hvd_train.train.elastic import rescale_learning_rate
from hvd_train.train.step import make_optimizer


def test_a_smaller_world_trains_at_its_own_rate_and_keeps_the_multiplier() -> None:
    cfg = load_config(QUICKSTART, ["optimizer.warmup_epochs=0"])
    two, one = derive(cfg, 2, 1438), derive(cfg, 1, 1438)
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer=make_optimizer(cfg, two), loss="mse")
    x, y = np.zeros((4, 3)), np.zeros((4, 2))
    model.fit(x, y, verbose=0)  # the step is traced with two workers' rates
    assert float(model.optimizer.learning_rate) == pytest.approx(two.scaled_lr)
    lr_multiplier(model.optimizer).assign(0.5)  # as ReduceLROnPlateau, or a resumed run, left it
    rescale_learning_rate(model, cfg, one)
    model.fit(x, y, verbose=0)
    assert one.scaled_lr == pytest.approx(two.scaled_lr / 2)
    assert float(model.optimizer.learning_rate) == pytest.approx(one.scaled_lr * 0.5)
    assert model.optimizer.iterations.numpy() == 2, "the step counter goes on"
