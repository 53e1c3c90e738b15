"""Exact distributed evaluation: sums and counts are all-reduced, never a mean of means.

Each worker evaluates every world-th validation example; padding carries weight 0; one
all-reduce of (loss sum, correct count, example count) gives metrics in which each example
counts exactly once, equal to within float tolerance at any worker count.

`evaluate_in_order` (for `hvd-train evaluate`) goes further: the same metrics to the last bit
at any worker count, from whole batches gathered and summed in one order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from hvd_train.data.pipeline import batch_shard, val_shard
from hvd_train.data.sources import Source
from hvd_train.runtime import distributed
from hvd_train.runtime.keras import binding


class Evaluator:
    """Evaluates `model` on the validation set across all workers (call on every rank)."""

    def __init__(self, model: Any, source: Source, batch: int, from_logits: bool):
        self.model = model
        self.num_examples = len(source.x_val)
        if not self.num_examples:  # every rank holds the same source: none of them validates
            return
        self.dataset = val_shard(source, batch, distributed.rank(), distributed.size())
        self._step = batch_sums(model, from_logits)

    def evaluate(self) -> dict[str, float]:
        """`{"val_loss": ..., "val_accuracy": ...}`, identical on every rank; {} without data,
        where nothing is traced, run or all-reduced."""
        if not self.num_examples:
            return {}
        totals = tf.zeros([3], tf.float64)
        for x, y, w in self.dataset:
            totals += self._step(x, y, w)
        totals = distributed.allreduce_sum(totals.numpy(), name="exact_eval")
        return _metrics(self.model, totals)


def batch_sums(model: Any, from_logits: bool):
    """A tf.function of `(x, y, weight)`: the batch's weighted [loss sum, hits, weight sum]."""
    xent = binding.active().per_example_loss(from_logits)

    def sums(x: tf.Tensor, y: tf.Tensor, w: tf.Tensor) -> tf.Tensor:
        out = model(x, training=False)
        # Summed in float64 whatever the model's output dtype (float32, or a user's float64).
        loss = tf.cast(xent(y, out), tf.float64)
        hit = tf.cast(tf.equal(tf.argmax(out, -1, output_type=y.dtype), y), tf.float64)
        w = tf.cast(w, tf.float64)
        return tf.stack([tf.reduce_sum(loss * w), tf.reduce_sum(hit * w), tf.reduce_sum(w)])

    return tf.function(sums, autograph=False)  # graph code: nothing for autograph to convert


def _metrics(model: Any, totals) -> dict[str, float]:
    loss_sum, hits, count = (float(v) for v in totals)
    if count == 0:
        return {}
    # As in Keras' val_loss, regularisation penalties are added to the mean data loss.
    penalty = float(tf.add_n(model.losses)) if model.losses else 0.0
    return {"val_loss": loss_sum / count + penalty, "val_accuracy": hits / count}


def evaluate_in_order(
    model: Any, source: Source, batch: int, from_logits: bool
) -> dict[str, float]:
    """Like `Evaluator.evaluate`, on `source`'s validation examples, but the same to the last
    bit at any worker count (call on every rank).

    The examples are cut into batches of `batch` in index order and dealt out whole
    (`data.batch_shard`), so each example is computed in the same place of the same batch
    whatever the worker count (a row's float32 result can depend on its place in the batch).
    The batches' float64 sums are then gathered and added in batch order on every rank. The
    worker's compute threads must not change with the worker count either (see inference/evaluate.py).
    """
    data, mine = batch_shard(source, batch, distributed.rank(), distributed.size())
    step = batch_sums(model, from_logits)
    sums = [step(x, y, w).numpy().tolist() for x, y, w in data]
    gathered = distributed.allgather_object((mine.tolist(), sums), name="ordered_eval")
    totals = np.zeros(3, np.float64)
    for _, s in sorted(pair for ids, ss in gathered for pair in zip(ids, ss, strict=True)):
        totals += s
    return _metrics(model, totals)
