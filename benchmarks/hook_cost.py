"""What hvd_train's callbacks cost a training step, and how often a step waits on the host.

    .venv/bin/python benchmarks/hook_cost.py --epochs 4 [--keras 2] [--set KEY=VALUE ...]

One worker trains the quickstart (synthetic data, the default callbacks) in this process. Every
call of the model's train function is timed; the time between one call's return and the next
call (inside an epoch) is what the callbacks' batch hooks and Keras' loop cost a step. A host
read is a tensor's value brought to Python (`EagerTensor._numpy`, which `.numpy()` and
`float()` use, and Keras 3's conversion of the logs, `convert_to_numpy`), counted in the main thread between those calls: on
a GPU each one waits for the step to finish. The first epoch (tracing) is left out.

It prints one JSON line: the median gap (microseconds), the median step, and the host reads a
step. Compare two commits by running this same file against each (PYTHONPATH), interleaved.
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

ROOT = pathlib.Path(__file__).resolve().parents[1]
SETS = ("data.source=synthetic", "data.train_examples=4096", "data.val_examples=256",
        "train.verbose=false", "model.dropout=0")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--keras", choices=("3", "2"), default="3")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE, as the trainer")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    from tensorflow.python.framework import tensor as tensor_lib  # noqa: PLC0415 - after env

    from hvd_train.config.loading import load_config  # noqa: PLC0415
    from hvd_train.train import trainer  # noqa: PLC0415

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
        _, summary = trainer.train(cfg)
    steps = summary["steps_per_epoch"] if "steps_per_epoch" in summary else None
    per_epoch = steps or len(calls) // args.epochs
    gaps, step_s, host = [], [], []
    for i in range(per_epoch, len(calls) - 1):  # after the first epoch
        if (i + 1) % per_epoch == 0:
            continue  # the next call is in the next epoch: the gap holds the epoch's end
        enter, leave, _ = calls[i]
        next_enter, _, reads_before_next = calls[i + 1]
        gaps.append(next_enter - leave)
        step_s.append(leave - enter)
        host.append(reads_before_next - calls[i][2])
    print(json.dumps({
        "keras": args.keras, "steps_measured": len(gaps), "steps_per_epoch": per_epoch,
        "hook_gap_us_median": round(1e6 * statistics.median(gaps), 1),
        "step_us_median": round(1e6 * statistics.median(step_s), 1),
        "host_reads_per_step": round(statistics.mean(host), 3),
        "status": summary.get("status"),
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
