"""Exact distributed evaluation: sums and counts are all-reduced, never a mean of means.

Each worker evaluates every world-th validation example; padding carries weight 0; one
all-reduce of (loss sum, correct count, example count) gives metrics in which each example
counts exactly once, equal to within float tolerance at any worker count.
"""

from __future__ import annotations

import tensorflow as tf

from hvd_train import distributed
from hvd_train.data import Source, val_shard


class Evaluator:
    """Evaluates `model` on the validation set across all workers (call on every rank)."""

    def __init__(self, model: tf.keras.Model, source: Source, batch: int, from_logits: bool):
        self.model = model
        self.num_examples = len(source.x_val)
        self.dataset, self.num_batches = val_shard(
            source, batch, distributed.rank(), distributed.size()
        )
        self._xent = tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=from_logits, reduction=tf.keras.losses.Reduction.NONE
        )
        self._step = tf.function(self._sums)

    def _sums(self, x: tf.Tensor, y: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        out = self.model(x, training=False)
        # Summed in float64 whatever the model's output dtype (float32, or a user's float64).
        loss = tf.cast(self._xent(y, out), tf.float64)
        hit = tf.cast(tf.equal(tf.argmax(out, -1, output_type=y.dtype), y), tf.float64)
        w = tf.cast(w, tf.float64)
        return tf.stack([tf.reduce_sum(loss * w), tf.reduce_sum(hit * w), tf.reduce_sum(w)])

    def evaluate(self) -> dict[str, float]:
        """`{"val_loss": ..., "val_accuracy": ...}`, identical on every rank; {} without data."""
        totals = tf.zeros([3], tf.float64)
        for x, y, w in self.dataset:
            totals += self._step(x, y, w)
        loss_sum, hits, count = distributed.allreduce_sum(totals.numpy(), name="exact_eval")
        if count == 0:
            return {}
        # As in Keras' val_loss, regularisation penalties are added to the mean data loss.
        penalty = float(tf.add_n(self.model.losses)) if self.model.losses else 0.0
        return {"val_loss": loss_sum / count + penalty, "val_accuracy": hits / count}
