"""Model factories that fail on purpose, for the fault tests (`model.factory: faulty_models:...`).

Each wraps the quickstart's convnet (digits, 8x8x1) with a layer that misbehaves after a
number of training steps on one rank only, so the tests also check that one rank's trouble
becomes every rank's decision.
"""

import dataclasses
import os

import tensorflow as tf

from hvd_train.train.models import convnet

FAIL_AFTER_STEPS = int(os.environ.get("FAULTY_AFTER_STEPS", "30"))
FAULTY_RANK = int(os.environ.get("FAULTY_RANK", "1"))


class _Trap(tf.keras.layers.Layer):
    """Identity until `after` training calls on the faulty rank; then NaN or an exception.

    The graph is the same on every rank (only a value differs): Horovod matches collectives
    across ranks by op name, and a rank with extra control flow would name them differently.
    """

    def __init__(self, mode: str, after: int, **kwargs):
        super().__init__(**kwargs)
        self.mode, self.after = mode, after
        self.calls = tf.Variable(0, trainable=False, dtype=tf.int64)
        # horovodrun --gloo sets HOROVOD_RANK, --mpi (the default on a CPU host) Open MPI's own.
        rank = os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
        self.armed = int(rank) == FAULTY_RANK

    def get_config(self) -> dict:
        return {**super().get_config(), "mode": self.mode, "after": self.after}

    def call(self, x, training=None):
        if not training:
            return x
        n = self.calls.assign_add(1)
        fire = tf.logical_and(n > self.after, self.armed)
        if self.mode == "nan":
            return x * tf.where(fire, float("nan"), 1.0)
        if self.mode == "inf_grad":  # once: the forward pass is untouched, the loss finite
            return _inf_gradient(x, tf.logical_and(n == self.after + 1, self.armed))
        ok = tf.debugging.Assert(
            tf.logical_not(fire), [f"planted failure on rank {FAULTY_RANK}", n]
        )
        with tf.control_dependencies([ok]):
            return tf.identity(x)


@tf.custom_gradient
def _inf_gradient(x, fire):
    """`x`, whose gradient is infinite where `fire` (what a float16 overflow in the backward
    pass gives a mixed_float16 step: a finite loss, infinite gradients on one rank)."""

    def grad(dy):
        return dy * tf.cast(tf.where(fire, float("inf"), 1.0), dy.dtype), None

    return tf.identity(x), grad


def _trapped(cfg, mode: str) -> tf.keras.Model:
    """convnet with the trap on its output (a NaN there reaches the loss at once)."""
    plain = dataclasses.replace(cfg.model, dropout=0.0, from_logits=False)
    inner = convnet((8, 8, 1), 10, plain)
    inputs = tf.keras.Input((8, 8, 1))
    return tf.keras.Model(inputs, _Trap(mode, FAIL_AFTER_STEPS)(inner(inputs)))


def nan_on_one_rank(cfg) -> tf.keras.Model:
    return _trapped(cfg, "nan")


def error_on_one_rank(cfg) -> tf.keras.Model:
    return _trapped(cfg, "error")


def inf_gradient_on_one_rank(cfg) -> tf.keras.Model:
    return _trapped(cfg, "inf_grad")


class _GuidesTrainStep(tf.keras.Model):
    """The train_step of tensorflow.org's "Customizing what happens in fit()" (Keras 2): its
    own GradientTape, then `self.optimizer.apply_gradients` (under mixed_float16, Keras'
    LossScaleOptimizer's)."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compiled_loss(y, y_pred, regularization_losses=self.losses)
        trainable_vars = self.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)
        self.optimizer.apply_gradients(zip(gradients, trainable_vars))  # noqa: B905 - the guide
        self.compiled_metrics.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


def custom_step_inf_gradient_on_one_rank(cfg) -> tf.keras.Model:
    """inf_gradient_on_one_rank's model, trained by the guide's own train_step."""
    model = _trapped(cfg, "inf_grad")
    return _GuidesTrainStep(model.inputs, model.outputs)
