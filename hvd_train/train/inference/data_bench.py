"""`data-bench`: the input pipeline alone, and the trainer's own step on in-memory tensors, in
examples/s per worker; the ratio says whether training would wait for its data."""

from __future__ import annotations

import time
from dataclasses import replace

import tensorflow as tf

from hvd_train.config import Config
from hvd_train.data.job import Job, plan_job
from hvd_train.data.pipeline import to_device, train_dataset
from hvd_train.data.sources import load_source
from hvd_train.record.layout import RunDir
from hvd_train.runtime import distributed, worker
from hvd_train.train.callbacks.base import Callback
from hvd_train.train.step import build_compiled_model


def data_bench(cfg: Config, batches: int) -> dict[str, float]:
    """Examples/s per worker of the input pipeline alone, and of the model on in-memory tensors
    of the same shape, as each worker of this job (run it under horovodrun for N workers).

    Prints one line on rank 0 and returns the slowest worker's rates.
    """
    device = worker.start(cfg, RunDir(cfg.run.dir).timeline)  # as the trainer's workers start
    job = plan_job(cfg, load_source(cfg), distributed.size())
    plan, warm = job.plan, 5
    epochs = -(-(warm + batches) // plan.steps_per_epoch)
    long_job = replace(job, cfg=_with_epochs(cfg, epochs))  # the same plan: only epochs change
    data = train_dataset(long_job, distributed.rank())
    input_rate = _pipeline_rate(to_device(data, cfg.data.prefetch_to_device), warm, batches)
    model_rate = _model_rate(job, device, warm, batches)
    rates = distributed.allgather_object((input_rate, model_rate), name="data_bench")
    worst_in, worst_model = min(r[0] for r in rates), min(r[1] for r in rates)
    ratio = worst_in / worst_model
    verdict = "input-bound: training will wait for data" if ratio < 1 else "not input-bound"
    distributed.log(
        f"data-bench ({cfg.data.source}, {plan.world_size} worker(s), batch "
        f"{plan.per_worker_batch}/worker, {batches} batches): input pipeline {worst_in:.0f} "
        f"examples/s per worker | model consumes {worst_model:.0f} examples/s per worker | "
        f"ratio {ratio:.2f}: {verdict}"
    )
    return {"input_examples_per_sec": worst_in, "model_examples_per_sec": worst_model}


def _with_epochs(cfg: Config, epochs: int) -> Config:
    return replace(cfg, train=replace(cfg.train, epochs=max(epochs, cfg.train.epochs)))


def _pipeline_rate(ds: tf.data.Dataset, warm: int, batches: int) -> float:
    it = iter(ds)
    for _ in range(warm):
        x, _ = next(it)
    start, n = time.perf_counter(), 0
    for _ in range(batches):
        x, _ = next(it)
        n += int(x.shape[0])
    _ = x.numpy()  # the last batch is really there
    return n / (time.perf_counter() - start)


def _model_rate(job: Job, device: str, warm: int, batches: int) -> float:
    """The trainer's own training step (training_step.build_compiled_model: precision, XLA,
    Horovod's averaged gradients) on one in-memory batch repeated: what the model consumes when
    input costs nothing."""
    model = build_compiled_model(job, device)
    plan = job.plan
    x = tf.random.uniform([plan.per_worker_batch, *job.source.input_shape])
    y = tf.zeros([plan.per_worker_batch], tf.int32)
    clock = _StepClock(warm)
    ds = tf.data.Dataset.from_tensors((x, y)).repeat()
    # shuffle=False: one batch repeated has no order to shuffle (Keras 3 warns it ignores it).
    model.fit(ds, steps_per_epoch=warm + batches, epochs=1, callbacks=[clock], verbose=0,
              shuffle=False)  # fmt: skip
    return batches * plan.per_worker_batch / (clock.end - clock.start)


class _StepClock(Callback):
    def __init__(self, warm: int):
        super().__init__()
        self.warm, self.start, self.end = warm, 0.0, 0.0

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if batch == self.warm - 1:
            self.start = time.perf_counter()
        self.end = time.perf_counter()
