"""Runs on every rank: a user's Keras 3 script (examples/keras3_fit.py) as horovodrun runs it,
then writes what its `model.fit` did on this rank to `rank-N.npz` (weights before and after)
and `rank-N.json` (epoch logs before and after MetricAverage, the learning rate, the layers) in
the working directory. The script itself is not changed: `keras.Model.fit` is wrapped around it.

Then, in the same job: a model compiled with `jit_compile=True` trains with
BroadcastInitialState (which must turn XLA off: this Horovod has no XLA all-reduce).

Usage: run_keras3_fit.py SCRIPT
"""

import json
import runpy
import sys
import warnings

import keras
import numpy as np

from hvd_train.runtime.keras import binding

seen: dict = {"local_logs": []}
plain_fit = keras.Model.fit


class LocalLogs(keras.callbacks.Callback):
    """First in the list: each epoch's logs as this rank computed them, before MetricAverage."""

    def on_epoch_end(self, epoch, logs=None):
        seen["local_logs"].append(dict(logs))


def fit(self, *args, callbacks=None, **kwargs):
    seen["initial"] = self.get_weights()
    seen["layers"] = [type(layer).__name__ for layer in self.layers]
    history = plain_fit(self, *args, callbacks=[LocalLogs(), *(callbacks or [])], **kwargs)
    seen["model"] = self
    seen["history"] = history.history
    return history


keras.Model.fit = fit
runpy.run_path(sys.argv[1], run_name="__main__")
keras.Model.fit = plain_fit

from hvd_train import keras3 as hvdk  # imported by the script already

model, rank = seen["model"], hvdk.rank()
schedule = model.optimizer._learning_rate  # Keras 3: the schedule the optimizer steps
report = {
    "layers": seen["layers"],
    "history": seen["history"],
    "local_logs": seen["local_logs"],
    "rate_at_step_0": float(schedule(0)),
    "rate_at_end": float(model.optimizer.learning_rate),
    "steps": int(model.optimizer.iterations.numpy()),
    "warmup_steps": schedule.warmup_steps,
    "optimizer": f"{type(model.optimizer).__module__}.{type(model.optimizer).__name__}",
    "binding_chosen": binding.chosen().__name__ if binding.chosen() else None,
}

xla = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
xla.compile(hvdk.DistributedOptimizer(keras.optimizers.SGD()), "mse", jit_compile=True)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    xla.fit(np.ones((8, 4)), np.ones((8, 1)), batch_size=4, verbose=0,
            callbacks=[hvdk.BroadcastInitialState()])  # fmt: skip
report["xla_after_fit"] = xla.jit_compile
report["xla_warnings"] = [str(w.message) for w in caught if "jit_compile" in str(w.message)]

np.savez(f"rank-{rank}.npz", *seen["initial"], *model.get_weights())
with open(f"rank-{rank}.json", "w") as f:
    json.dump(report, f)
print(f"rank {rank}: done")
