"""One worker trains in this process and reports after which steps the host read a tensor.

    python tests/workers/host_reads.py KERAS --set KEY=VALUE ...

KERAS is `keras` or `tf_keras` (runtime.keras). A host read is a tensor's value brought to
Python: `EagerTensor._numpy` (`.numpy()`, `float()`) or Keras 3's conversion of the logs
(`convert_to_numpy`, which reads the buffer directly), in the main thread. Each call of the
model's train function is one execution; the reads between one execution's return and the
next execution's call are the step's. Prints one JSON line: {"executions": N, "reads": [the
reads after each execution but the last]} (lab/hook-cost/hook_cost.py counts the same way, and
times the gaps).
"""

from __future__ import annotations

import json
import pathlib
import sys
import tempfile
import threading

from hvd_train.runtime.keras import binding

binding.import_tensorflow()  # as hvd_train's workers import it: base/deferred.py

# isort: split
import tensorflow as tf
from tensorflow.python.framework import ops
from tensorflow.python.framework import tensor as tensor_lib

from hvd_train.config.loading import load_config
from hvd_train.train.run import trainer

ROOT = pathlib.Path(__file__).resolve().parents[2]


def main() -> None:
    keras_name, sets = sys.argv[1], [a for a in sys.argv[2:] if a != "--set"]
    main_thread = threading.main_thread()
    count = [0]

    def counting(method):  # type: ignore[no-untyped-def]
        def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
            if threading.current_thread() is main_thread:
                count[0] += 1
            return method(*args, **kwargs)

        return counted

    eager = getattr(tensor_lib, "_EagerTensorBase", None) or ops._EagerTensorBase  # TF 2.15: ops
    eager._numpy = counting(eager._numpy)
    if keras_name == "keras":
        from keras.src import backend

        convert = backend.convert_to_numpy
        backend.convert_to_numpy = lambda x: (
            counting(convert)(x) if backend.is_tensor(x) else convert(x)
        )
    if keras_name == "keras":
        import keras
    else:  # Keras 2: the tf_keras package from TensorFlow 2.16, tf.keras on 2.15
        try:
            import tf_keras as keras
        except ImportError:
            keras = tf.keras
    make = keras.Model.make_train_function
    after: list[int] = []  # the reads so far, as each execution returned

    def make_train_function(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        inner = make(self, *args, **kwargs) or self.train_function
        if getattr(inner, "counted", False):
            return inner

        def execution(*a, **k):  # type: ignore[no-untyped-def]
            before = count[0]
            out = inner(*a, **k)
            count[0] = before  # the reads inside an execution are the step's own
            if after:
                after[-1] = count[0] - after[-1]  # the reads between the two executions
            after.append(count[0])
            return out

        execution.counted = True
        self.train_function = execution
        return execution

    keras.Model.make_train_function = make_train_function
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(
            ROOT / "configs" / "quickstart.yaml",
            [*sets, f"run.dir={tmp}/run", f"runtime.keras={keras_name}"],
        )
        trainer.train(cfg)
    print(json.dumps({"executions": len(after), "reads": after[:-1], "tf": tf.__version__}))


if __name__ == "__main__":
    main()
