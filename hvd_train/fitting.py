"""Training from a position (epoch, step): the part-done epoch on its own, then the rest.

Shared by the static trainer and each Horovod Elastic membership: the data order depends only
on (seed, epoch), so a part-done epoch is its epoch's data with the done steps skipped.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from hvd_train import distributed
from hvd_train.config import Config, Derived
from hvd_train.data import Source, train_dataset


def fit_from(
    model: tf.keras.Model,
    source: Source,
    cfg: Config,
    d: Derived,
    epoch: int,
    step: int,
    callbacks: list,
    attach: Callable[[tf.data.Dataset], tf.data.Dataset],
    history: dict[str, list[float]] | None = None,
) -> dict[str, list[float]]:
    """Runs `model.fit` from (epoch, step) to `train.epochs`; returns the joined history.

    Each `fit`'s history is added to `history` as soon as it ends, so an elastic reset in a
    later `fit` keeps the earlier ones. Stops early when a callback sets `model.stop_training`
    (an agreed stop, a NaN).
    """
    history = {} if history is None else history
    verbose = 1 if distributed.is_chief() and cfg.train.verbose else 0
    while epoch < cfg.train.epochs:
        data = train_dataset(source, cfg, d, distributed.rank(), first_epoch=epoch)
        last = epoch + 1 if step else cfg.train.epochs  # a part-done epoch on its own
        h = model.fit(
            attach(data.skip(step)), initial_epoch=epoch, epochs=last,
            steps_per_epoch=d.steps_per_epoch - step, callbacks=callbacks, verbose=verbose,
        )  # fmt: skip
        for key, values in h.history.items():
            history.setdefault(key, []).extend(values)
        if model.stop_training:
            break
        epoch, step = last, 0
    return history
