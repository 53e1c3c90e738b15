"""One worker of a compare_peers.py measurement; prints `RESULT {json}` when done.

Modes, all training the same convnet on in-memory synthetic 32x32x3 images, 10 classes, with
the Keras `--keras` names (`keras`: Keras 3, `import keras`; `tf_keras`: Keras 2, `tf.keras`
with TF_USE_LEGACY_KERAS=1, which on TensorFlow 2.15 is Keras 2 anyway):
  keras             plain Keras model.fit in one process (no Horovod started);
  hvd_train         this project's trainer (hvd_train.train.run.trainer.train, `runtime.keras` set
                    to `--keras`), launched by horovodrun;
  horovod_example   a minimal script shaped like Horovod's own Keras examples
                    (horovod.tensorflow.keras: DistributedOptimizer, the broadcast and
                    metric-average callbacks);
  mwms              tf.distribute.MultiWorkerMirroredStrategy (TF_CONFIG set by the driver).

Per process it reports examples/s (all workers), the median step time, peak resident memory,
and per-thread CPU accounting (threadstat.py) over the measured steps. A worker that fails
writes `error-<rank>.json` (the error in one line, and where it was raised) before it exits
non-zero, so that the driver can report the peer as failed instead of stopping.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import tempfile
import time
import traceback

import threadstat  # beside this file: a script's folder is on sys.path

KERASES = ("keras", "tf_keras")  # runtime.keras's names: Keras 3, Keras 2
WORKLOADS = {"light": (256,), "heavy": (2816, 256)}  # convnet dense layers: ~1.1 M / ~12.4 M


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument(
        "--mode", required=True, choices=["keras", "hvd_train", "horovod_example", "mwms"]
    )
    p.add_argument("--keras", default="keras", choices=KERASES,
                   help="keras: Keras 3 (import keras); tf_keras: Keras 2")  # fmt: skip
    p.add_argument("--workload", default="light", choices=sorted(WORKLOADS))
    p.add_argument("--batch", type=int, default=64, help="per worker")
    p.add_argument("--warmup", type=int, default=10, help="steps left out (hvd_train: 1 epoch)")
    p.add_argument("--steps", type=int, default=40, help="measured steps")
    p.add_argument("--warmup-epoch", action="store_true",
                   help="keras modes: an epoch of --steps first, then the second timed from its "
                   "start, as hvd_train's summary times an epoch (not --warmup steps)")  # fmt: skip
    p.add_argument("--threads", type=int, default=0, help="intra-op threads; 0: the mode's default")
    p.add_argument("--pin", action="store_true", help="bind to core --core (or the local rank)")
    p.add_argument("--core", type=int, default=None)
    p.add_argument("--config-defaults", action="store_true",
                   help="hvd_train: binding and threads left to the config's defaults")  # fmt: skip
    p.add_argument("--result-dir", default=None, help="also write result-<rank>.json there")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   help="hvd_train: extra config overrides")  # fmt: skip
    return p.parse_args()


def local_rank() -> int:
    for key in ("HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MWMS_INDEX", "PEER_INDEX"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


def pin(args: argparse.Namespace) -> None:
    """Binds this process, before TensorFlow starts threads, to one core."""
    cores = sorted(os.sched_getaffinity(0))
    core = args.core if args.core is not None else cores[local_rank() % len(cores)]
    os.sched_setaffinity(0, {core})


class Window:
    """Times the measured steps (after `start()`) and takes thread snapshots around them."""

    def __init__(self, steps: int):
        self.steps = steps
        self.times: list[float] = []
        self.first = self.last = None

    def start(self) -> None:
        self.first = threadstat.snapshot()
        self.times = [time.perf_counter()]

    def batch_end(self) -> None:
        if self.first is None or self.last is not None:
            return
        self.times.append(time.perf_counter())
        if len(self.times) == self.steps + 1:
            self.last = threadstat.snapshot()

    def result(self, groups: dict) -> dict:
        steps = [b - a for a, b in zip(self.times, self.times[1:], strict=False)]
        return {
            "step_ms_median": 1000 * statistics.median(steps),
            "measured_s": sum(steps),
            "threads": threadstat.diff(self.first, self.last, groups, self.steps),
        }


def timing_callback(window: Window, warmup_steps: int = 0, warmup_epochs: int = 0):
    """Starts the window after `warmup_steps` batches or at epoch `warmup_epochs`."""
    from hvd_train.train.callbacks.base import Callback  # a callback to either Keras

    class Timing(Callback):
        batches = 0

        def on_epoch_begin(self, epoch, logs=None):
            if warmup_epochs and epoch == warmup_epochs:
                window.steps = self.params.get("steps") or window.steps  # after rounding
                wait_for_peers()
                window.start()

        def on_train_batch_end(self, batch, logs=None):
            self.batches += 1
            if warmup_steps and self.batches == warmup_steps:
                wait_for_peers()
                window.start()
            else:
                window.batch_end()

    return Timing()


def wait_for_peers() -> None:
    """Independent processes (compare_peers' keras@2-independent) start measuring together:
    each marks PEER_BARRIER/ready-<PEER_INDEX> and waits for PEER_COUNT marks."""
    folder = os.environ.get("PEER_BARRIER")
    if not folder:
        return
    open(os.path.join(folder, f"ready-{os.environ['PEER_INDEX']}"), "w").close()
    count = int(os.environ["PEER_COUNT"])
    while sum(name.startswith("ready-") for name in os.listdir(folder)) < count:
        time.sleep(0.001)


def choose_keras(name: str) -> None:
    """Before TensorFlow is imported: `tf.keras` is Keras 2 for tf_keras (as hvd_train's
    `binding.prepare` does for `runtime.keras: tf_keras`)."""
    if name == "tf_keras":
        os.environ["TF_USE_LEGACY_KERAS"] = "1"


def keras_module(name: str):
    """Keras 3 as users import it today, or Keras 2 as `tf.keras` gives it."""
    if name == "keras":
        import keras

        return keras
    import tensorflow as tf

    return tf.keras


def build_model(name: str, workload: str):
    """hvd_train's convnet (the model the trainer builds from the same config) in the Keras
    `name`. Activating the binding imports Horovod's library but starts nothing."""
    from hvd_train.config import ModelConfig
    from hvd_train.runtime.keras import binding
    from hvd_train.train.models import convnet

    binding.activate(name)
    return convnet((32, 32, 3), 10, ModelConfig(dense_units=WORKLOADS[workload]))


def horovod_keras(name: str):
    """Horovod's Keras API as Horovod's examples import it. On tf_keras it must be imported
    with `keras` bound to tf_keras (hvd_train's Keras 2 binding does that), or it takes
    Keras 3's backend; on Keras 3 it is what a user of Horovod's examples gets today."""
    if name == "tf_keras":
        from hvd_train.runtime.keras.v2 import hvd

        return hvd
    import horovod.tensorflow.keras as hvd

    return hvd


def synthetic(np, batch: int):
    rng = np.random.default_rng(0)
    return rng.random((batch * 8, 32, 32, 3), dtype=np.float32), rng.integers(0, 10, batch * 8)


def run_keras_like(args: argparse.Namespace) -> dict:
    """keras, horovod_example and mwms: model.fit over a repeated in-memory batch set."""
    import numpy as np

    before_tf = threadstat.threads()
    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    groups, world, rank = {}, 1, int(os.environ.get("PEER_INDEX", "0"))
    strategy = None
    if args.mode == "mwms":
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=tf.distribute.experimental.CommunicationImplementation.RING
            )
        )
        world = strategy.num_replicas_in_sync
        rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    keras = keras_module(args.keras)
    if args.mode == "horovod_example":
        hvd = horovod_keras(args.keras)
        before = threadstat.threads()
        hvd.init()  # Horovod: initialize (starts the background thread)
        groups["horovod"] = threadstat.threads() - before
        world, rank = hvd.size(), hvd.rank()
    x, y = synthetic(np, args.batch)
    window = Window(args.steps)
    if args.warmup_epoch:  # an epoch of --steps, then the second timed from its start
        epochs, steps, timing = 2, args.steps, timing_callback(window, warmup_epochs=1)
    else:
        epochs, steps = 1, args.warmup + args.steps
        timing = timing_callback(window, warmup_steps=args.warmup)
    callbacks = [timing]

    def dataset(ctx=None):
        ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.batch)
        return ds.prefetch(tf.data.AUTOTUNE)

    # Every mode compiles what the trainer compiles: SGD with momentum, the loss, accuracy.
    if strategy is not None:
        with strategy.scope():  # variables mirrored on every worker
            model = build_model(args.keras, args.workload)
            model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                          "sparse_categorical_crossentropy", metrics=["accuracy"])  # fmt: skip
        data = strategy.distribute_datasets_from_function(dataset)  # 64 per worker
    else:
        model = build_model(args.keras, args.workload)
        opt = keras.optimizers.SGD(0.01 * world, momentum=0.9)
        if args.mode == "horovod_example":
            opt = hvd.DistributedOptimizer(opt)  # Horovod: average gradients
            callbacks[:0] = [
                # Horovod: rank 0's initial weights to every rank
                hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                # Horovod: the epoch's metrics averaged over the workers
                hvd.callbacks.MetricAverageCallback(),
            ]
        model.compile(opt, "sparse_categorical_crossentropy", metrics=["accuracy"])
        data = dataset()
    model.fit(data, steps_per_epoch=steps, epochs=epochs, verbose=0, callbacks=callbacks)
    groups["tensorflow"] = threadstat.threads() - before_tf - groups.get("horovod", set())
    out = window.result(groups)
    from hvd_train.runtime.keras import binding

    out.update(world=world, rank=rank, keras_version=binding.describe(args.keras),
               examples_per_sec=world * args.batch * args.steps / out["measured_s"],
               intra_op_threads=tf.config.threading.get_intra_op_parallelism_threads())  # fmt: skip
    return out


def run_hvd_train(args: argparse.Namespace) -> dict:
    """This project's trainer, as `python -m hvd_train` would run it, on the same workload."""
    from hvd_train.runtime.keras import binding

    binding.prepare(args.keras)  # before TensorFlow, as `hvd-train train` does
    before_tf = threadstat.threads()
    import horovod.tensorflow as hvd
    import tensorflow as tf

    import hvd_train.train.run.trainer as trainer
    from hvd_train.config import load_config
    from hvd_train.runtime import distributed

    world = int(os.environ.get("HOROVOD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
    run_dir = tempfile.mkdtemp(prefix="peer-hvd-train-")
    cfg = load_config(None, [
        f"run.dir={run_dir}", "train.epochs=2", f"train.steps_per_epoch={args.steps}",
        f"train.batch_size={args.batch}", "train.verbose=false", "logging.tensorboard=false",
        "data.source=synthetic", f"data.train_examples={args.steps * args.batch * world}",
        f"data.val_examples={args.batch * world}", "optimizer.name=sgd",
        f"model.dense_units={list(WORKLOADS[args.workload])}", f"runtime.keras={args.keras}",
        *([] if args.config_defaults else [f"runtime.intra_op_threads={args.threads}",
           f"runtime.bind_cores={'true' if args.pin else 'false'}"]), *args.overrides,
    ])  # fmt: skip
    groups: dict[str, set[int]] = {}
    hvd_init = distributed.init

    def init_and_note_threads(*a, **k):  # instrumentation: which threads Horovod starts
        before = threadstat.threads()
        hvd_init(*a, **k)
        groups["horovod"] = threadstat.threads() - before

    distributed.init = init_and_note_threads
    window = Window(args.steps)  # the first epoch is hvd_train's warm-up
    build = trainer.build_callbacks
    timing = timing_callback(window, warmup_epochs=1)

    def build_with_timing(*a, **k):
        built = build(*a, **k)
        return dataclasses.replace(built, all=(*built.all, timing))

    trainer.build_callbacks = build_with_timing
    model, summary = trainer.train(cfg)
    groups["tensorflow"] = threadstat.threads() - before_tf - groups["horovod"]
    out = window.result(groups)
    out.update(world=summary["world_size"], rank=hvd.rank(), keras_version=summary["versions"]["keras"],
               examples_per_sec=summary["train_examples_per_sec"], summary_step_ms=summary["step_time_ms"],
               allreduce_time_share=summary["allreduce_time_share"],
               negotiation_time_share=summary["negotiation_time_share"],
               intra_op_threads=tf.config.threading.get_intra_op_parallelism_threads())  # fmt: skip
    return out


def main() -> None:
    args = parse()
    if args.pin and args.mode != "hvd_train":
        pin(args)
    elif args.pin:  # hvd_train binds itself (runtime.bind_cores) within the first N cores
        workers = int(
            os.environ.get("HOROVOD_LOCAL_SIZE", os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1"))
        )
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:workers])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    choose_keras(args.keras)
    try:
        out = run_hvd_train(args) if args.mode == "hvd_train" else run_keras_like(args)
    except BaseException as e:
        note_error(e, args.result_dir)
        raise
    out.update(mode=args.mode, keras=args.keras, workload=args.workload, batch=args.batch,
               pinned=args.pin,
               peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)  # fmt: skip
    if args.result_dir:  # launchers may interleave the ranks' output lines
        with open(os.path.join(args.result_dir, f"result-{out['rank']}.json"), "w") as f:
            json.dump(out, f)
    print("RESULT " + json.dumps(out), flush=True)


def note_error(e: BaseException, result_dir: str | None) -> None:
    """The error in one line (type, first line of the message, and the frame that raised it)
    in `result_dir`/error-<rank>.json, for the driver's table."""
    frame = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    where = f" ({frame.filename.split('site-packages/')[-1]}:{frame.lineno})" if frame else ""
    text = " ".join(str(e).split())  # a message may hold a tensor's repr over many lines
    if len(text) > 240:
        text = f"{text[:60]} ... {text[-150:]}"
    line = f"{type(e).__name__}: {text}{where}"
    if result_dir:
        with open(os.path.join(result_dir, f"error-{local_rank()}.json"), "w") as f:
            json.dump({"error": line}, f)


if __name__ == "__main__":
    main()
