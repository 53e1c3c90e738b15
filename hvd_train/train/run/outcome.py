"""How a run that trained ends: its results for summary.json, the stop every rank agreed on,
and a completed run's export and closing line."""

from __future__ import annotations

import math
import signal
import time

import tensorflow as tf

from hvd_train.base import nccl_log, startup
from hvd_train.base.errors import Interrupted
from hvd_train.config import Config, Derived, HorovodConfig, TrainConfig
from hvd_train.data.diagnostics import data_summary
from hvd_train.data.sources import Source
from hvd_train.record.layout import RunDir
from hvd_train.record.summary import Summary
from hvd_train.runtime import distributed
from hvd_train.runtime.keras.contract import Model
from hvd_train.train.callbacks import perf
from hvd_train.train.callbacks.callback_list import RunCallbacks
from hvd_train.train.callbacks.checkpointer import Checkpointer
from hvd_train.train.callbacks.stop import AgreedStop, RunControl
from hvd_train.train.checkpoint import export_plain_model, write_error
from hvd_train.train.run.state import Run, Start


def summary_base(train: TrainConfig, plan: Derived, device: str) -> Summary:
    return {
        "status": "running",
        "started_at": time.time(),
        "world_size": plan.world_size,
        "controller": distributed.controller(),
        "device": device,
        **batches_and_rates(plan),
        "batch_size_mode": train.batch_size_mode,
        "epochs": train.epochs,
        "epochs_completed": 0,
        "resumed_from": None,
        "last_checkpoint": None,
        "model_path": None,
    }


def batches_and_rates(plan: Derived) -> Summary:
    """summary.json's batch sizes and steps per epoch for `plan`, and its learning rates."""
    return {
        "per_worker_batch_size": plan.per_worker_batch,
        "global_batch_size": plan.global_batch,
        "steps_per_epoch": plan.steps_per_epoch,
        "base_learning_rate": plan.base_lr,
        "scaled_learning_rate": plan.scaled_lr,
    }


def summarize(
    cfg: Config,
    history: dict[str, list[float]],
    source: Source,
    callbacks: RunCallbacks,
    start: Start,
) -> Summary:
    """summary.json's results: how the run ended, its metrics, data and throughput."""
    summary = results(history, cfg.train, callbacks.control, callbacks.user_stop)
    # A resume with nothing left to train (its end still to do): the run's own figures.
    summary["epochs_completed"] = max(summary["epochs_completed"], start.epoch)
    if not summary["final_metrics"]:
        summary["final_metrics"] = dict(start.metrics)
    summary.update(data_summary(history, source.skipped_files, RunDir(cfg.run.dir).summary))
    summary.update(perf.throughput_summary(callbacks.timer, cfg))
    summary["startup_s"] = startup.phases()  # rank 0's: from its process's start to its first step
    summary["nccl_network"] = nccl_log.network(nccl_log.path())  # None: no NCCL (a CPU run)
    perf.log_throughput(summary)
    if warning := nccl_log.sockets_warning(summary["nccl_network"], distributed.hosts()):
        distributed.log(warning)
    return summary


def results(
    history: dict[str, list[float]],
    train: TrainConfig,
    control: RunControl,
    user: AgreedStop | None,
) -> Summary:
    epoch, step = control.stopped_at or (train.epochs, 0)
    early = user.stopped_early if user and not control.stopping else None
    if early and early["epoch"] < train.epochs:
        # The users' callbacks ended it, as they were asked to: completed, and said so.
        epoch = early["epoch"]
        return {"status": "completed", "epochs_completed": epoch, "stopped_at": None,
                "stopped_early": early, **rate_and_final(history)}  # fmt: skip
    finished = epoch >= train.epochs and step == 0  # a stop after the last step finished
    return {
        "status": "completed" if finished else "interrupted",
        "epochs_completed": epoch,
        # 1-based, as in the log: in epoch `epoch`, `step` steps were done (0: not begun).
        "stopped_at": None if finished else {"epoch": epoch + 1, "step": step},
        **({} if finished else {"stopped_by": signal.Signals(control.stop_signal).name}),
        **rate_and_final(history),
    }


def rate_and_final(history: dict[str, list[float]]) -> Summary:
    times, examples = history.get("epoch_time_s", []), history.get("epoch_examples", [])
    skip = 1 if len(times) > 1 else 0  # a process's first epoch is warm-up (tracing)
    # float(): the times are the workers' mean, a numpy float32 that numpy 2 keeps through the
    # division (numpy 1 made it a float64); summary.json takes Python floats only.
    rate = float(sum(examples[skip:]) / sum(times[skip:])) if times else 0.0
    final = {k: float(v[-1]) for k, v in history.items() if v and k != "epoch_examples"}
    return {"train_examples_per_sec": rate, "final_metrics": final}


def stop(run: Run, summary: Summary) -> None:
    """An agreed stop: rank 0 records it, every rank waits for that, then raises Interrupted."""
    run.end(**summary)  # the stop is recorded: the watcher lets this process end itself
    # Every rank leaves only when rank 0 has written the stop checkpoint and the summary:
    # the launcher ends the whole job when the first rank exits.
    distributed.barrier_if_alive("hvd_train.stopped")
    control = run.callbacks.control
    where = run.checkpointer.last if run.checkpointer else "rank 0's run.dir"
    raise Interrupted(
        control.stop_signal,
        f"stopped by {signal.Signals(control.stop_signal).name} at epoch "
        f"{control.stopped_at[0] + 1}, step {control.stopped_at[1]}; checkpoint {where}; run "
        "the same command again to resume",
    )


def complete(run_dir: str, model: Model, summary: Summary, run: Run) -> None:
    """A completed run: rank 0 exports model.keras and records the end, and the stop watcher
    lets this process end itself. Where either raises, the caller fails the run
    (`failure.fail`) before `say_done`."""
    exported = export_model(RunDir(run_dir).model, model, run.checkpointer)
    run.end(**summary, **exported)


def say_done(run_dir: str, summary: Summary, run: Run) -> None:
    """After `complete`: one closing line."""
    distributed.log(
        f"done in {time.perf_counter() - run.started:.1f} s: {closing_figures(summary)}; "
        f"results in {run_dir}"
    )


def export_model(path: str, model: Model, checkpointer: Checkpointer | None) -> Summary:
    """Rank 0 exports model.keras; returns summary.json's `model_path` ({} on other ranks).

    Raises:
        CheckpointError: model.keras could not be written (rank 0).
    """
    if not distributed.is_chief():
        return {}
    try:
        return {"model_path": export_plain_model(model, path)}
    except (OSError, tf.errors.OpError) as e:
        raise write_error(path, e, checkpointer.last if checkpointer else None) from e


def closing_figures(summary: Summary) -> str:
    """The closing line's figures: the last epoch's validation accuracy, or its training
    accuracy where there was no validation (or no accuracy metric: the loss), and throughput.
    A run with no validation must not say `val_accuracy 0.0000`."""
    m = summary["final_metrics"]
    name = next((k for k in ("val_accuracy", "accuracy", "val_loss", "loss") if k in m), None)
    shown = [f"{name} {m[name]:.4f}"] if name else []
    rate = summary["train_examples_per_sec"]
    shown.append(f"{rate:.0f} examples/s" if rate >= 10 else f"{rate:.2g} examples/s")
    return ", ".join(shown)


def gradient_size(horovod: HorovodConfig, model: Model) -> Summary:
    """What each step all-reduces, for `hvd-train plan`: the trainable parameters and their
    bytes as sent (float32, or float16 with horovod.compression: fp16)."""
    params = sum(math.prod(int(d) for d in w.shape) for w in model.trainable_weights)
    fp16 = horovod.compression == "fp16"
    return {
        "trainable_parameters": params,
        "gradient_dtype": "float16" if fp16 else "float32",
        "gradient_bytes": params * (2 if fp16 else 4),
    }
