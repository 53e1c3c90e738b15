"""The training run: Horovod init, data, model, DistributedOptimizer, fit, summary."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from hvd_train import distributed, perf, tuning
from hvd_train.callbacks import Checkpointer, build_callbacks, every_steps_due
from hvd_train.checkpoint import (
    PREFIX,
    STATE_FILE,
    CheckpointStore,
    Unloadable,
    export_plain_model,
    free_reserve,
    load,
    remove_strays,
    reserve_room,
    write_error,
)
from hvd_train.config import Config, Derived, derive, dump_yaml
from hvd_train.control import RunControl, StopSignals
from hvd_train.data import Source, load_source
from hvd_train.elastic import fit_elastic
from hvd_train.errors import CheckpointError, DataError, Interrupted, UserError
from hvd_train.evaluation import Evaluator
from hvd_train.fitting import fit_from
from hvd_train.input_diagnostics import InputWait, advice_for, data_summary
from hvd_train.models import build_model
from hvd_train.schedules import learning_rate_schedule


def train(cfg: Config) -> tuple[tf.keras.Model, dict[str, Any]]:
    """Trains as one worker of the job horovodrun started (or alone); returns model and summary.

    Raises:
        UserError: bad config or data (exit code 2).
        TrainingError: a NaN or infinite loss (exit code 1); no checkpoint is written.
        Interrupted: SIGTERM or SIGINT; a checkpoint was written (exit code 128 + signal).
    """
    started = time.perf_counter()
    tuning.before_init(cfg)  # core binding: before Horovod and TensorFlow start threads
    distributed.init(cfg.horovod, cfg.run.dir)
    device = distributed.configure_devices(
        cfg.runtime.intra_op_threads, cfg.runtime.inter_op_threads
    )
    tuning.apply_precision(cfg)  # before the model is built
    # Same seed on every rank: identical initial weights, so the broadcast below is a no-op for
    # built-in models and a guarantee for user factories that draw from other generators.
    tf.keras.utils.set_random_seed(cfg.runtime.seed)
    source = load_source(cfg)
    d = derive(cfg, distributed.size(), source.num_train)
    _prepare_run_dir(cfg)
    _log_plan(cfg, d, source, device)
    tuning.log_knobs(cfg, d)

    model = build_model(cfg, source.input_shape, source.num_classes)
    model.compile(
        # Horovod: average gradients across workers with ring-allreduce (compression,
        # accumulation and loss scaling as configured: see tuning.distributed_optimizer).
        optimizer=tuning.distributed_optimizer(make_optimizer(cfg, d), cfg),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=cfg.model.from_logits),
        metrics=["accuracy"],
        jit_compile=tuning.jit_compile(cfg, device),
    )
    start = _resume(cfg, model, d)
    signals = StopSignals()
    made: dict[str, Any] = {}

    def make_callbacks(d: Derived, epoch: int, first_step: int) -> list:
        """This membership's callbacks (rebuilt by Horovod Elastic when workers change)."""
        evaluator = Evaluator(model, source, d.per_worker_batch, cfg.model.from_logits)
        made["control"] = RunControl(
            signals,
            cfg.checkpoint.check_every_steps,
            d.steps_per_epoch,
            lambda step: every_steps_due(cfg, step),
            first_step_in_epoch=first_step,
        )
        made["d"] = d
        callbacks, made["checkpointer"] = build_callbacks(
            cfg, d, evaluator, made["control"], epoch, broadcast=not cfg.elastic.enabled
        )
        # Input wait first: its epoch end is a collective, and its value must reach the files.
        made["input_wait"] = InputWait(cfg.data.input_wait_warning, advice_for(cfg.data.source))
        made["timer"] = next(c for c in callbacks if isinstance(c, perf.StepTimer))
        return [made["input_wait"], *callbacks]

    def attach(data: tf.data.Dataset) -> tf.data.Dataset:
        """The training data, time-stamped for the input-wait measurement."""
        return made["input_wait"].attach(data)

    summary = _summary_base(cfg, d, device, start)
    _write_summary(cfg, summary)
    signals.install()
    try:
        if cfg.elastic.enabled:
            history, report = fit_elastic(
                model, source, cfg, start.epoch, start.step, make_callbacks, attach
            )
            d = made["d"]
            summary.update(world_size=d.world_size, elastic=report, **_batches(d))
        else:
            callbacks = make_callbacks(d, start.epoch, start.step)
            history = fit_from(model, source, cfg, d, start.epoch, start.step, callbacks, attach)
    except BaseException as e:
        # Every rank says why it stopped: the launcher names the rank whose error came first
        # and was not a consequence of another rank's failure.
        distributed.log(f"failed: {_one_line(e)}", all_ranks=True)
        summary.update(status="failed", error=_one_line(e))
        _end_summary(cfg, summary, started, made.get("checkpointer"))
        raise
    finally:
        signals.uninstall()
    control, checkpointer = made["control"], made["checkpointer"]
    summary.update(_results(history, cfg, control))
    summary.update(data_summary(history, source.skipped_files))
    summary.update(perf.throughput_summary(made["timer"], cfg))
    perf.log_throughput(summary)
    if summary["status"] == "interrupted":
        _end_summary(cfg, summary, started, checkpointer)
        # Every rank leaves only when rank 0 has written the stop checkpoint and the summary:
        # the launcher ends the whole job when the first rank exits.
        distributed.barrier("hvd_train.stopped")
        where = checkpointer.last if checkpointer else "rank 0's run.dir"
        raise Interrupted(
            control.stop_signal,
            f"stopped by {signal.Signals(control.stop_signal).name} at epoch "
            f"{control.stopped_at[0] + 1}, step {control.stopped_at[1]}; checkpoint {where}; run "
            "the same command again to resume",
        )
    _finish(cfg, model, summary, started, checkpointer)
    return model, summary


@dataclass(frozen=True)
class Start:
    """Where training begins: `epoch` (0-based) with `step` of its steps already done."""

    epoch: int = 0
    step: int = 0
    checkpoint: str | None = None


def _resume(cfg: Config, model: tf.keras.Model, d: Derived) -> Start:
    """Rank 0 tidies run.dir, then picks and reads the checkpoint; weights, optimizer state and
    position are then broadcast, so other hosts need not see rank 0's disk. Every rank raises
    alike on error: DataError (exit 2) for a checkpoint that cannot be resumed from,
    CheckpointError (exit 1) when run.dir has no room left."""
    # Slots must exist on every rank before the restore and the broadcast fill them.
    model.optimizer.build(model.trainable_variables)
    found: dict[str, Any] = {}
    error: Exception | None = None
    if distributed.is_chief():
        try:
            removed = remove_strays(cfg.run.dir)  # this job owns run.dir now
            if removed:
                distributed.log(
                    f"removed what a killed job left half-written: {', '.join(removed)}"
                )
            reserve_room(cfg.run.dir, CheckpointStore(cfg.run.dir, cfg.checkpoint).newest())
            found = _read_checkpoint(cfg, model)
        except (UserError, CheckpointError) as e:
            error = e
        except OSError as e:
            error = DataError(_one_line(e))
    found, error = distributed.broadcast_object((found, error), name="resume_point")
    if error is not None:
        raise error
    # Horovod: every rank starts from rank 0's weights and optimizer state (restored or not).
    distributed.broadcast_variables(model.variables + model.optimizer.variables)
    if not found:
        return Start()
    state = found["state"]
    epoch, step = state["epoch"], state["step"]
    if step and state["global_batch"] != d.global_batch:
        # The epoch's order does not depend on the worker count: continue after the examples
        # already seen, rounded down to a whole global batch (a few may be seen twice).
        step = state["examples_in_epoch"] // d.global_batch
    if step >= d.steps_per_epoch:
        epoch, step = epoch + 1, 0
    aside = ", ".join(found["set_aside"])
    aside = f"; set aside as unloadable: {aside}" if aside else ""
    distributed.log(
        f"resuming from {found['path']}: epoch {epoch + 1}, step {step} "
        f"(saved with {state['world_size']} worker(s), global batch {state['global_batch']})"
        f"{aside}"
    )
    return Start(epoch=epoch, step=step, checkpoint=found["path"])


def _read_checkpoint(cfg: Config, model: tf.keras.Model) -> dict[str, Any]:
    """Rank 0: {} to start afresh, or the restored checkpoint's path and state, and the newer
    checkpoints that could not be loaded, renamed out of the way (`set_aside`).

    With `train.resume: auto`, a checkpoint that cannot be loaded (truncated, corrupt, not
    matching the model) is named in one warning and the next older one is tried. When none
    loads, this fails rather than start afresh: a fresh run would write over metrics.csv and
    prune the very checkpoints the user may want to repair or resume with the right config.
    """
    resume = cfg.train.resume
    if resume == "never":
        return {}
    if resume != "auto":
        return {"path": resume, "state": _load_named(cfg, model, resume), "set_aside": []}
    store = CheckpointStore(cfg.run.dir, cfg.checkpoint)
    failed: list[tuple[str, Unloadable]] = []
    candidates = store.named()[::-1]  # newest first
    for i, path in enumerate(candidates):
        try:
            state = load(model, path)
        except Unloadable as e:
            failed.append((path, e))
            then = "trying the next older one" if i + 1 < len(candidates) else "no older one"
            distributed.log(f"warning: cannot resume from {path}: {e}; {then}")
            continue
        aside = [store.set_aside(p) for p, _ in failed]
        return {"path": path, "state": state, "set_aside": aside}
    if not failed:
        return {}
    newest, why = failed[0]
    raise DataError(
        f"train.resume: auto: none of the {len(failed)} checkpoint(s) in {store.dir} can be "
        f"loaded (the newest, {newest}: {why}); resume from a good copy with "
        "train.resume=PATH, or start afresh with another run.dir or train.resume=never"
    )


def _load_named(cfg: Config, model: tf.keras.Model, path: str) -> dict[str, Any]:
    """`train.resume: PATH`: its state, restored into `model`; a one-line DataError if not."""
    if not any(os.path.exists(os.path.join(path, f)) for f in (STATE_FILE, f"{PREFIX}.index")):
        raise DataError(
            f"train.resume: {path} is not a checkpoint folder (expected state.json and "
            f"ckpt.index in it, as in {os.path.join(cfg.run.dir, 'checkpoints', 'ckpt-*')})"
        )
    try:
        return load(model, path)
    except Unloadable as e:
        fix = (
            "use train.resume=never or another run.dir"
            if e.mismatch
            else "name another checkpoint, or use train.resume=auto for the newest that loads"
        )
        raise DataError(f"train.resume: cannot resume from {path}: {e}; {fix}") from None


def _one_line(e: BaseException) -> str:
    """The exception's message on one line; for a TensorFlow op error its last real line
    (its message also holds a Python traceback of where the op was defined)."""
    text = str(e)
    if isinstance(e, tf.errors.OpError):
        lines = [ln.strip() for ln in e.message.splitlines() if ln.strip()]
        lines = [ln for ln in lines if not ln.startswith("[[")] or lines
        text = lines[-1] if lines else text
    text = " ".join(text.split()) or type(e).__name__
    return text if isinstance(e, UserError) else f"{type(e).__name__}: {text}"


def make_optimizer(cfg: Config, d: Derived) -> tf.keras.optimizers.Optimizer:
    """The configured optimizer, its rate following `optimizer.schedule` after the warm-up."""
    o, lr = cfg.optimizer, learning_rate_schedule(cfg, d)
    if o.name == "sgd":
        return tf.keras.optimizers.SGD(lr, momentum=o.momentum)
    if o.name == "adam":
        return tf.keras.optimizers.Adam(lr)
    if o.name == "adamw":
        return tf.keras.optimizers.AdamW(lr, weight_decay=o.weight_decay)
    return tf.keras.optimizers.RMSprop(lr, momentum=o.momentum)


@distributed.rank_zero_only
def _prepare_run_dir(cfg: Config) -> None:
    os.makedirs(cfg.run.dir, exist_ok=True)
    with open(os.path.join(cfg.run.dir, "config.yaml"), "w") as f:
        f.write(dump_yaml(cfg))


def _log_plan(cfg: Config, d: Derived, source: Source, device: str) -> None:
    used = d.examples_per_epoch
    n = source.num_train
    rest = f"{n - used} unused per epoch" if used <= n else f"{used - n} repeated per epoch"
    rest += f", data.remainder: {cfg.data.remainder}"
    if source.description:
        distributed.log(source.description)
    warm = f", warm-up {cfg.optimizer.warmup_epochs:g} epochs" if d.warmup_steps else ""
    distributed.log(
        f"{d.world_size} worker(s), {distributed.controller()}, {device} | batch "
        f"{d.per_worker_batch}/worker, {d.global_batch} global | learning rate {d.base_lr:g} -> "
        f"{d.scaled_lr:g} ({cfg.optimizer.lr_scaling}{warm}) | {d.steps_per_epoch} steps/epoch "
        f"over {n} training examples ({rest}) | {len(source.x_val)} validation examples"
    )


def _summary_base(cfg: Config, d: Derived, device: str, start: Start) -> dict[str, Any]:
    return {
        "status": "running",
        "world_size": d.world_size,
        "controller": distributed.controller(),
        "device": device,
        **_batches(d),
        "batch_size_mode": cfg.train.batch_size_mode,
        "epochs": cfg.train.epochs,
        "epochs_completed": start.epoch,
        "resumed_from": start.checkpoint,
        "versions": distributed.versions(),
    }


def _batches(d: Derived) -> dict[str, Any]:
    return {
        "per_worker_batch_size": d.per_worker_batch,
        "global_batch_size": d.global_batch,
        "steps_per_epoch": d.steps_per_epoch,
        "base_learning_rate": d.base_lr,
        "scaled_learning_rate": d.scaled_lr,
    }


def _results(history: dict[str, list[float]], cfg: Config, control: RunControl) -> dict[str, Any]:
    times, examples = history.get("epoch_time_s", []), history.get("epoch_examples", [])
    skip = 1 if len(times) > 1 else 0  # a process's first epoch is warm-up (tracing)
    rate = sum(examples[skip:]) / sum(times[skip:]) if times else 0.0
    final = {k: float(v[-1]) for k, v in history.items() if v and k != "epoch_examples"}
    epoch, step = control.stopped_at or (cfg.train.epochs, 0)
    finished = epoch >= cfg.train.epochs and step == 0  # a stop after the last step finished
    return {
        "status": "completed" if finished else "interrupted",
        "epochs_completed": epoch,
        # 1-based, as in the log: in epoch `epoch`, `step` steps were done (0: not begun).
        "stopped_at": None if finished else {"epoch": epoch + 1, "step": step},
        "train_examples_per_sec": rate,
        "final_metrics": final,
    }


def _end_summary(
    cfg: Config, summary: dict[str, Any], started: float, checkpointer: Checkpointer | None
) -> None:
    summary["wall_time_s"] = time.perf_counter() - started
    if checkpointer is not None:
        summary["last_checkpoint"] = checkpointer.last
        summary["best_model_path"] = checkpointer.best_model
        summary["checkpoint_failures"] = checkpointer.failures
    _write_summary(cfg, summary)


def _finish(
    cfg: Config,
    model: tf.keras.Model,
    summary: dict[str, Any],
    started: float,
    checkpointer: Checkpointer | None,
) -> None:
    """Rank 0 exports model.keras; every rank ends its summary.

    Raises:
        CheckpointError: model.keras could not be written (rank 0); summary.json says `failed`.
    """
    if distributed.is_chief():
        path = os.path.join(cfg.run.dir, "model.keras")
        try:
            summary["model_path"] = export_plain_model(model, path)
        except (OSError, tf.errors.OpError) as e:
            error = write_error(path, e, checkpointer.last if checkpointer else None)
            distributed.log(f"failed: {_one_line(error)}", all_ranks=True)
            summary.update(status="failed", error=_one_line(error), model_path=None)
            free_reserve(cfg.run.dir)  # room for the final summary.json on a full disk
            _end_summary(cfg, summary, started, checkpointer)
            raise error from e
        free_reserve(cfg.run.dir)  # the run is over: give back what reserve_room kept
    _end_summary(cfg, summary, started, checkpointer)
    m = summary["final_metrics"]
    distributed.log(
        f"done in {summary['wall_time_s']:.1f} s: val_accuracy {m.get('val_accuracy', 0):.4f}, "
        f"{summary['train_examples_per_sec']:.0f} examples/s; results in {cfg.run.dir}"
    )


@distributed.rank_zero_only
def _write_summary(cfg: Config, summary: dict[str, Any]) -> None:
    os.makedirs(cfg.run.dir, exist_ok=True)
    path = os.path.join(cfg.run.dir, "summary.json")
    with open(path + ".tmp", "w") as f:
        json.dump(summary, f, indent=2)
    os.replace(path + ".tmp", path)
