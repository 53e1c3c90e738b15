"""What hvd_train's callbacks cost a training step, and how often a step waits on the host.

    .venv/bin/python lab/hook-cost/hook_cost.py --epochs 4 [--keras 2] [--set KEY=VALUE ...]

One worker trains the quickstart (synthetic data, the default callbacks) in this process. Every
call of the model's train function is timed; the time between one call's return and the next
call (inside an epoch) is what the callbacks' batch hooks and Keras' loop cost a step. A host
read is a tensor's value brought to Python (`EagerTensor._numpy`, which `.numpy()` and
`float()` use, and Keras 3's conversion of the logs, `convert_to_numpy`), counted in the main thread between those calls: on
a GPU each one waits for the step to finish. The first epoch (tracing) is left out.

Then the trained model trains two more epochs in Keras' own loop, with no callback: the gap
there is Keras' own cost a step, and `hooks_us` the difference, hvd_train's hooks' cost. It
prints one JSON line. Compare two commits by running this same file against each (PYTHONPATH),
interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
SETS = ("data.source=synthetic", "data.train_examples=4096", "data.val_examples=256",
        "train.verbose=false", "model.dropout=0")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--keras", choices=("3", "2"), default="3")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE, as the trainer")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import tensorflow as tf  # noqa: PLC0415 - after the environment
    from tensorflow.python.framework import tensor as tensor_lib  # noqa: PLC0415

    from hvd_train.config import load_config  # noqa: PLC0415
    from hvd_train.train.run import trainer  # noqa: PLC0415

    main_thread = threading.main_thread()
    reads = [0]
    base = getattr(tensor_lib, "_EagerTensorBase", None)
    if base is None:  # older TensorFlow: the class lives in ops
        from tensorflow.python.framework import ops  # noqa: PLC0415

        base = ops._EagerTensorBase
    original_numpy = base._numpy

    def counted(self):  # type: ignore[no-untyped-def]
        if threading.current_thread() is main_thread:
            reads[0] += 1
        return original_numpy(self)

    base._numpy = counted
    if args.keras == "3":
        # Keras 3 converts the logs with np.array, which reads a tensor's buffer directly.
        from keras.src import backend  # noqa: PLC0415

        convert = backend.convert_to_numpy

        def converted(x):  # type: ignore[no-untyped-def]
            if threading.current_thread() is main_thread and backend.is_tensor(x):
                reads[0] += 1
            return convert(x)

        backend.convert_to_numpy = converted
    calls: list[tuple[float, float, int]] = []  # (enter, exit, reads before entering)

    def wrap(make):  # type: ignore[no-untyped-def]
        def make_train_function(self, *a, **k):  # type: ignore[no-untyped-def]
            inner = make(self, *a, **k) or self.train_function
            if getattr(inner, "timed", False):
                return inner

            def timed(*fa, **fk):  # type: ignore[no-untyped-def]
                before = reads[0]
                enter = time.perf_counter()
                out = inner(*fa, **fk)
                calls.append((enter, time.perf_counter(), before))
                reads[0] = before  # reads inside the step are the step's own
                return out

            timed.timed = True
            self.train_function = timed  # Keras 3 calls this; Keras 2 what is returned
            return timed

        return make_train_function

    keras_name = "keras" if args.keras == "3" else "tf_keras"
    keras = __import__(keras_name)
    keras.Model.make_train_function = wrap(keras.Model.make_train_function)
    with tempfile.TemporaryDirectory() as tmp:
        sets = [*SETS, f"train.epochs={args.epochs}", f"run.dir={tmp}/run",
                f"runtime.keras={keras_name}", *args.set]  # fmt: skip
        cfg = load_config(ROOT / "configs" / "quickstart.yaml", sets)
        model, summary = trainer.train(cfg)
    per_epoch = len(calls) // args.epochs
    trained = measure(calls, per_epoch)
    # Keras' own loop, no callback: the same model and step, two epochs of constant batches.
    calls.clear()
    batch = cfg.train.batch_size
    x = tf.zeros((batch, *model.inputs[0].shape[1:]), model.inputs[0].dtype)
    data = tf.data.Dataset.from_tensors((x, tf.zeros((batch,), tf.int64))).repeat()
    model.fit(data, epochs=2, steps_per_epoch=per_epoch, callbacks=[], verbose=0)
    bare = measure(calls, per_epoch)
    print(json.dumps({
        "keras": args.keras, "steps_per_epoch": per_epoch, "steps_measured": trained["steps"],
        "gap_us": trained["gap_us"], "bare_gap_us": bare["gap_us"],
        "hooks_us": round(trained["gap_us"] - bare["gap_us"], 1),
        "host_reads_per_step": trained["reads"], "bare_host_reads_per_step": bare["reads"],
        "step_us": trained["step_us"], "status": summary.get("status"),
    }))  # fmt: skip
    return 0


def measure(calls: list[tuple[float, float, int]], per_epoch: int) -> dict:
    """Medians over the steps after the first epoch, within an epoch: the gap before the next
    step (microseconds), the step, and the mean of the host reads in the gaps."""
    gaps, step_s, host = [], [], []
    for i in range(per_epoch, len(calls) - 1):
        if (i + 1) % per_epoch == 0:
            continue  # the next call is in the next epoch: the gap holds the epoch's end
        enter, leave, before = calls[i]
        next_enter, _, reads_before_next = calls[i + 1]
        gaps.append(next_enter - leave)
        step_s.append(leave - enter)
        host.append(reads_before_next - before)
    return {
        "steps": len(gaps), "gap_us": round(1e6 * statistics.median(gaps), 1),
        "step_us": round(1e6 * statistics.median(step_s), 1),
        "reads": round(statistics.mean(host), 3),
    }  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
