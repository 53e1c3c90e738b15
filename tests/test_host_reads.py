"""No host round-trip a step: hvd_train's callbacks take each step's logs as tensors and read
them only where they act (an agreement of the ranks), on both Kerases.

A host read (a tensor's value brought to Python) waits, on a GPU, for the step to finish, so a
read after every step idles the GPU while Python runs the callbacks and starts the next step.
Counted here on CPU, where the count is the same (tests/workers/host_reads.py counts them).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf
from harness import BINDING_RUNS, PYTHON, WORKERS, check, has_keras3, run

from hvd_train.train.callbacks.base import Callback

STEPS_PER_EPOCH, EPOCHS, EVERY = 16, 3, 4
SETS = ["data.source=synthetic", f"data.train_examples={32 * STEPS_PER_EPOCH}",
        "data.val_examples=64", "train.verbose=false", f"train.epochs={EPOCHS}",
        f"checkpoint.check_every_steps={EVERY}"]  # fmt: skip


@pytest.mark.processes
@pytest.mark.stack
@pytest.mark.parametrize("keras", BINDING_RUNS)
def test_the_host_reads_a_tensor_only_where_the_ranks_agree(keras: str, tmp_path) -> None:
    """The quickstart's model, the default callbacks (TensorBoard and the input wait included),
    one worker agreeing every 4 steps: the only reads between two steps of an epoch are after
    the steps the ranks agree at (the loss checked finite). Keras 2's own loop reads its
    `steps_per_execution` variable before each step, which nothing here can change: one read
    a step more, counted as such."""
    out = check(run([PYTHON, str(WORKERS / "host_reads.py"), keras, *SETS], tmp_path))
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["executions"] == STEPS_PER_EPOCH * EPOCHS, found
    keras_own = 0 if keras == "keras" else 1
    inside = {}  # step (from the run's start, 1-based) -> the reads before the next step
    for step, reads in enumerate(found["reads"], start=1):
        # Left out: the gap at an epoch's end (the epoch's end is in it), and the one after
        # the run's first step (Keras 2: what that step created is broadcast, once).
        if step % STEPS_PER_EPOCH and step > 1:
            inside[step] = reads - keras_own
    agreed = [step for step in inside if step % EVERY == 0]
    assert agreed and all(inside[step] > 0 for step in agreed), inside
    assert {step: n for step, n in inside.items() if step % EVERY and n} == {}, inside


class Takes(Callback):
    """hvd_train's kind: the logs as they are."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[type] = []

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.seen.append(type(logs["loss"]))


@pytest.mark.skipif(not has_keras3(), reason="Keras 3's callback list")
def test_keras3_list_gives_tensors_to_ours_and_numbers_to_the_others() -> None:
    """Ours and the others, in list order, all at once; a callback with no batch hook of its
    own is never converted for."""
    import keras

    from hvd_train.runtime.keras import v3 as keras3

    seen: list[tuple[str, type]] = []

    class Ours(Callback):
        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            seen.append(("ours", type(logs["loss"])))

    class Theirs(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            seen.append(("theirs", type(logs["loss"])))

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensors((np.zeros((4, 2)), np.zeros((4, 1)))).repeat()
    listed = keras3.fit_callbacks([Theirs(), Ours(), keras.callbacks.Callback()], model, 0, 2, 3)
    model.fit(data, epochs=2, steps_per_epoch=3, callbacks=listed, verbose=0, shuffle=False)
    assert [who for who, _ in seen] == ["theirs", "ours"] * 6, seen
    assert all(issubclass(t, tf.Tensor) if who == "ours" else t is float for who, t in seen), seen


@pytest.mark.skipif(not has_keras3(), reason="Keras 3's callback list")
def test_keras3_list_converts_nothing_when_only_ours_have_batch_hooks(monkeypatch) -> None:
    import keras
    from keras.src.utils import python_utils

    from hvd_train.runtime.keras import v3 as keras3

    converted = []
    pythonify = python_utils.pythonify_logs
    monkeypatch.setattr(
        python_utils, "pythonify_logs", lambda logs: converted.append(logs) or pythonify(logs)
    )
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensors((np.zeros((4, 2)), np.zeros((4, 1)))).repeat()
    ours = Takes()
    listed = keras3.fit_callbacks([ours], model, 0, epochs=1, steps=5)
    model.fit(data, epochs=1, steps_per_epoch=5, callbacks=listed, verbose=0, shuffle=False)
    assert len(ours.seen) == 5
    # Keras converts the logs of the epoch's end and of the training's end; of no step.
    assert len([logs for logs in converted if logs]) == 2, converted


@pytest.mark.stack  # in process, and Keras 2 is TensorFlow 2.15's own Keras
def test_keras2_list_calls_at_a_step_only_the_hooks_that_act() -> None:
    """Keras 2 calls every callback's batch hooks at every step once any callback has one; the
    binding's list calls only the hooks that do something, in list order, at every step (the
    first ones, which Keras times for its slow-callback warning, included): ours with the logs
    as tensors, and a Keras callback written the old way (`on_batch_end`). A hook marked as a
    default, as Keras and hvd_train mark the ones that do nothing, is not called, nor one of a
    callback that says it cannot act mid-epoch in this run."""
    from hvd_train.runtime.keras import v2

    keras = v2.keras
    seen: list[tuple[str, int, bool]] = []

    class Ours(Callback):
        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            seen.append(("ours", batch, isinstance(logs["loss"], tf.Tensor)))

    class OldStyle(keras.callbacks.Callback):
        def on_batch_end(self, batch: int, logs: dict | None = None) -> None:
            seen.append(("old style", batch, isinstance(logs["loss"], tf.Tensor)))

    def marked(self, batch: int, logs: dict | None = None) -> None:
        seen.append(("marked default", batch, False))

    marked._is_default = True  # type: ignore[attr-defined]
    idle = type("Idle", (Callback,), {"on_train_batch_end": marked})

    class NotInThisRun(Callback):
        """A hook that acts only at mid-epoch points this run does not set (a checkpoint's
        `every_steps`, say), which says so."""

        def acts_mid_epoch(self) -> bool:
            return False

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            seen.append(("not in this run", batch, False))

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensors((np.zeros((4, 2)), np.zeros((4, 1)))).repeat()
    steps = 8  # past the 5 batches Keras 2 times
    ours = [Ours(), idle(), NotInThisRun()]
    listed = v2.fit_callbacks(ours, model, 0, epochs=1, steps=steps)
    model.fit(data, epochs=1, steps_per_epoch=steps, callbacks=listed, verbose=0)
    assert seen == [("ours", b, True) for b in range(steps)], seen

    seen.clear()
    listed = v2.fit_callbacks([OldStyle(), *ours], model, 0, epochs=1, steps=steps)
    model.fit(data, epochs=1, steps_per_epoch=steps, callbacks=listed, verbose=0)
    # A callback that takes numbers has them, and so has ours, as in Keras 2's own list.
    assert seen == [(who, b, False) for b in range(steps) for who in ("old style", "ours")], seen
