"""The training run: Horovod init, data, model, DistributedOptimizer, fit, summary."""

from __future__ import annotations

import functools
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from hvd_train import distributed, logs, perf, rundir, tuning
from hvd_train.callbacks import Checkpointer, build_callbacks, every_steps_due
from hvd_train.checkpoint import (
    PREFIX,
    STATE_FILE,
    CheckpointStore,
    Unloadable,
    export_plain_model,
    load,
    remove_strays,
    write_error,
)
from hvd_train.config import Config, Derived, derive, dump_yaml
from hvd_train.control import RunControl, StopSignals
from hvd_train.data import Source, load_source
from hvd_train.elastic import fit_elastic
from hvd_train.errors import (
    ANOTHER_FIRST,
    KNOCK_ON,
    CheckpointError,
    DataError,
    Interrupted,
    TrainingError,
    UserError,
)
from hvd_train.evaluation import Evaluator
from hvd_train.fitting import fit_from
from hvd_train.input_diagnostics import InputWait, advice_for, data_summary
from hvd_train.models import build_model, weights_note
from hvd_train.record import RecordError, RunRecord
from hvd_train.schedules import learning_rate_schedule, lr_multiplier
from hvd_train.user_callbacks import AgreedStop, build_user_callbacks


def train(cfg: Config, config_path: str | None = None) -> tuple[tf.keras.Model, dict[str, Any]]:
    """Trains as one worker of the job horovodrun started (or alone); returns model and summary.

    Args:
        cfg: the loaded config.
        config_path: the `--config` file, which run.dir/config.yaml never overwrites. Defaults
            to None (the config is the defaults alone).

    Raises:
        UserError: bad config or data, or a run.dir this job cannot have (exit code 2).
        TrainingError: a NaN or infinite loss, a failed write (exit code 1).
        Interrupted: SIGTERM or SIGINT; a checkpoint was written (exit code 128 + signal).
    """
    # From the first moment: a stop during start-up ends at once, and is recorded once there
    # is a record (see StopSignals: a stop may also end the process from its watcher thread).
    signals = StopSignals()
    signals.install()
    claims: list[rundir.Claim] = []  # rank 0's hold on run.dir, taken in _prepare_run_dir
    signals.before_exit.append(lambda: [claim.release() for claim in claims])
    try:
        return _train(cfg, config_path, claims, signals)
    finally:
        signals.done.set()
        signals.uninstall()
        for claim in claims:  # at every ending: completed, failed, interrupted
            claim.release()


def _train(
    cfg: Config, config_path: str | None, claims: list[rundir.Claim], signals: StopSignals
) -> tuple[tf.keras.Model, dict[str, Any]]:
    started = time.perf_counter()
    tuning.before_init(cfg)  # core binding: before Horovod and TensorFlow start threads
    distributed.init(cfg.horovod, cfg.run.dir)
    signals.chief = distributed.is_chief()
    signals.abandon = functools.partial(_abandon, None, None)
    device = distributed.configure_devices(
        cfg.runtime.intra_op_threads, cfg.runtime.inter_op_threads
    )
    tuning.apply_precision(cfg)  # before the model is built
    # Same seed on every rank: identical initial weights, so the broadcast below is a no-op for
    # built-in models and a guarantee for user factories that draw from other generators.
    tf.keras.utils.set_random_seed(cfg.runtime.seed)
    source = load_source(cfg)
    d = derive(cfg, distributed.size(), source.num_train)
    _prepare_run_dir(cfg, config_path, claims)
    # run.dir is this job's now: this rank's output goes on in its log there.
    logs.attach(cfg.run.dir, distributed.rank(), logs.attempt_description(cfg.train.resume))
    base = _summary_base(cfg, d, device)
    record = RunRecord(cfg.run.dir, base) if distributed.is_chief() else None
    if record:  # hooks first: a stop that comes while the record starts is recorded
        signals.on_signal = lambda signum: record.note(signal=signum)
        signals.abandon = functools.partial(_abandon, record, None)
        record.start()  # summary.json says `running` from here on
    made: dict[str, Any] = {}
    try:
        _log_plan(cfg, d, source, device)
        tuning.log_knobs(cfg, d)
        model = build_model(cfg, source.input_shape, source.num_classes)
        if note := weights_note(cfg):
            distributed.log(note)  # rank 0; a resume below then restores the checkpoint
        model.compile(
            # Horovod: average gradients across workers with ring-allreduce (compression,
            # accumulation and loss scaling as configured: see tuning.distributed_optimizer).
            optimizer=tuning.distributed_optimizer(make_optimizer(cfg, d), cfg),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=cfg.model.from_logits),
            metrics=["accuracy"],
            jit_compile=tuning.jit_compile(cfg, device),
        )
        start = _resume(cfg, model, d)
        signals.abandon = functools.partial(_abandon, record, start)
        if record:
            record.update(epochs_completed=start.epoch, resumed_from=start.checkpoint,
                          last_checkpoint=start.checkpoint)  # fmt: skip

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
            made["user"] = build_user_callbacks(cfg.callbacks, made["control"])
            callbacks, made["checkpointer"] = build_callbacks(
                cfg, d, evaluator, made["control"], epoch, broadcast=not cfg.elastic.enabled,
                user=made["user"].callbacks,
            )  # fmt: skip
            # Input wait first: its epoch end is a collective, its value must reach the files.
            made["input_wait"] = InputWait(cfg.data.input_wait_warning, advice_for(cfg.data.source))
            made["timer"] = next(c for c in callbacks if isinstance(c, perf.StepTimer))
            # Last: the record follows what the callbacks before it wrote (rank 0).
            progress = [RecordProgress(record, made["control"], made["checkpointer"])]
            return [made["input_wait"], *callbacks, *(progress if record else [])]

        def attach(data: tf.data.Dataset) -> tf.data.Dataset:
            """The training data, time-stamped for the input-wait measurement."""
            return made["input_wait"].attach(data)

        if cfg.elastic.enabled:
            history, report = fit_elastic(
                model, source, cfg, start.epoch, start.step, make_callbacks, attach
            )
            d = made["d"]
            # Horovod Elastic: when rank 0 was lost, a survivor became rank 0; it ends the
            # record (the lost one's keeper has meanwhile written `failed`).
            record = record or (RunRecord(cfg.run.dir, base) if distributed.is_chief() else None)
            if record:
                record.update(world_size=d.world_size, elastic=report, **_batches(d))
        else:
            callbacks = make_callbacks(d, start.epoch, start.step)
            history = fit_from(model, source, cfg, d, start.epoch, start.step, callbacks, attach)
    except BaseException as e:
        _fail(record, started, made.get("checkpointer"), e)
        raise
    control, checkpointer = made["control"], made["checkpointer"]
    summary = _results(history, cfg, control, made["user"].stop)
    summary.update(data_summary(history, source.skipped_files))
    summary.update(perf.throughput_summary(made["timer"], cfg))
    perf.log_throughput(summary)
    if summary["status"] == "interrupted":
        _end_record(record, started, checkpointer, **summary)
        signals.done.set()  # the stop is recorded: the watcher lets this process end itself
        # Every rank leaves only when rank 0 has written the stop checkpoint and the summary:
        # the launcher ends the whole job when the first rank exits.
        _barrier_if_alive("hvd_train.stopped")
        where = checkpointer.last if checkpointer else "rank 0's run.dir"
        raise Interrupted(
            control.stop_signal,
            f"stopped by {signal.Signals(control.stop_signal).name} at epoch "
            f"{control.stopped_at[0] + 1}, step {control.stopped_at[1]}; checkpoint {where}; run "
            "the same command again to resume",
        )
    try:
        _finish(cfg, model, summary, started, checkpointer)
        _end_record(record, started, checkpointer, **summary)
    except BaseException as e:
        _fail(record, started, checkpointer, e)
        raise
    signals.done.set()
    m = summary["final_metrics"]
    distributed.log(
        f"done in {time.perf_counter() - started:.1f} s: val_accuracy "
        f"{m.get('val_accuracy', 0):.4f}, {summary['train_examples_per_sec']:.0f} examples/s; "
        f"results in {cfg.run.dir}"
    )
    return model, record.summary if record else {**base, **summary}


class RecordProgress(tf.keras.callbacks.Callback):
    """Keeps summary.json's epochs_completed and last_checkpoint current (rank 0), so a record
    ended by the stop watcher or the keeper says how far the run got."""

    def __init__(self, record: RunRecord, control: RunControl, checkpointer: Checkpointer | None):
        super().__init__()
        self.record, self.control, self.checkpointer = record, control, checkpointer
        self._last = checkpointer.last if checkpointer else None

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self.checkpointer and self.checkpointer.last != self._last:  # a mid-epoch one
            self._last = self.checkpointer.last
            self.record.update(last_checkpoint=self._last)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.control.stopped_mid_epoch():
            return
        self._last = self.checkpointer.last if self.checkpointer else None
        self.record.update(epochs_completed=epoch + 1, last_checkpoint=self._last)


def _abandon(
    record: RunRecord | None,
    start: Start | None,
    signum: int,
    reason: str,
    ran: bool,
    failed: bool,
) -> None:
    """Called by the stop watcher just before it ends this process: records the ending.

    `ran`: whether any step ran; without one, training continues where `start` says.
    `failed`: the launcher is ending the job after a failure elsewhere, not stopping it.
    """
    name = signal.Signals(signum).name
    if record is None:
        if _rank_or_zero() == 0:
            logs.say(f"hvd_train: stopped by {name} during start-up; nothing was written")
        return
    if failed:
        _end_quietly(record, status="failed", error=reason)
        logs.failed(f"{ANOTHER_FIRST}, or the job was stopped: {reason}")
        return
    fields: dict[str, Any] = {"status": "interrupted", "stopped_by": name, "stop_detail": reason}
    if not ran and start is not None:
        fields["stopped_at"] = {"epoch": start.epoch + 1, "step": start.step}
    _end_quietly(record, **fields)
    last = record.summary.get("last_checkpoint")
    resume = f"resumes from {last}" if last else "starts afresh"
    logs.say(f"hvd_train: stopped by {name} {reason}; the same command {resume}")


def _end_quietly(record: RunRecord, **fields: Any) -> None:
    """Ends the record from the stop watcher: a failed write is said, not raised."""
    try:
        record.end(**fields, wall_time_s=time.time() - record.summary["started_at"])
    except RecordError as e:
        logs.say(f"hvd_train: error: {e}")
    record.close()


def _rank_or_zero() -> int:
    """This worker's rank, also before (or without) Horovod's start."""
    try:
        return distributed.rank()
    except ValueError:  # Horovod not initialized yet
        return int(os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", 0)))


def _fail(
    record: RunRecord | None, started: float, checkpointer: Checkpointer | None, e: BaseException
) -> None:
    """Every rank says why it stopped, in one line (the launcher names the rank whose error
    came first and was not a consequence of another rank's failure); rank 0 records it. A
    traceback goes to the rank's log only, and not for the errors that are one line by design."""
    one_line = isinstance(e, (UserError, TrainingError))
    logs.failed(_console_cause(e), None if one_line else e)
    try:
        _end_record(
            record, started, checkpointer, status="failed", error=_cause(e),
            error_type=type(e).__name__,
        )  # fmt: skip
    except RecordError as e2:
        logs.say(f"hvd_train: error: {e2}")


def _cause(e: BaseException) -> str:
    """The summary's `error`: this rank's own error, or that another rank failed first."""
    text = _one_line(e)
    if any(c in text for c in KNOCK_ON):
        return f"{ANOTHER_FIRST}; rank 0 then saw: {text}"
    return text


def _console_cause(e: BaseException) -> str:
    """This rank's failure line: its error, or, for Horovod shut down under it, that another
    rank failed first and the short form of what this one then saw (the rest is in its log)."""
    text = _one_line(e)
    seen = next((c for c in KNOCK_ON if c in text), None)
    if seen is None:
        return text
    return f"{ANOTHER_FIRST}; this rank then saw {type(e).__name__}: {seen}"


def _barrier_if_alive(name: str) -> None:
    """A barrier that gives up quietly when another worker has already gone."""
    try:
        distributed.barrier(name)
    except Exception:  # noqa: BLE001 - the record is written; a gone peer changes nothing
        pass


@dataclass(frozen=True)
class Start:
    """Where training begins: `epoch` (0-based) with `step` of its steps already done."""

    epoch: int = 0
    step: int = 0
    checkpoint: str | None = None


def _resume(cfg: Config, model: tf.keras.Model, d: Derived) -> Start:
    """Rank 0 tidies run.dir, then picks and reads the checkpoint; weights, optimizer state and
    position are then broadcast, so other hosts need not see rank 0's disk. Every rank raises
    alike on error: DataError (exit 2) for a checkpoint that cannot be resumed from."""
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
    # ReduceLROnPlateau's factor so far (state.json, broadcast above), on every rank.
    multiplier = lr_multiplier(model.optimizer)
    if multiplier is not None:
        multiplier.assign(state.get("lr_multiplier", 1.0))
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


def _prepare_run_dir(cfg: Config, config_path: str | None, claims: list[rundir.Claim]) -> None:
    """Rank 0 claims run.dir (into `claims`) and writes the resolved config there, before
    anything else is written; a refusal is raised on every rank, so none waits for rank 0."""

    def claim_and_write() -> None:
        claim = rundir.claim(
            cfg.run.dir,
            overwrite=cfg.run.overwrite,
            config_path=config_path,
            log=distributed.log,
        )
        claims.append(claim)
        claim.write_config(dump_yaml(cfg))

    distributed.chief_computes(claim_and_write, "hvd_train.run_dir")


def _log_plan(cfg: Config, d: Derived, source: Source, device: str) -> None:
    used = d.examples_per_epoch
    n = source.num_train
    rest = f"{n - used} unused per epoch" if used <= n else f"{used - n} repeated per epoch"
    rest += f", data.remainder: {cfg.data.remainder}"
    if source.description:
        distributed.log(source.description)
    warm = f", warm-up {cfg.optimizer.warmup_epochs:g} epochs" if d.warmup_steps else ""
    distributed.log(
        f"{_workers_label(d.world_size)}, {device} | batch {d.per_worker_batch}/worker, "
        f"{d.global_batch} global | learning rate {d.base_lr:g} -> {d.scaled_lr:g} "
        f"({_lr_label(cfg, d)}{warm}) | {d.steps_per_epoch} steps/epoch over {n} "
        f"training examples ({rest}) | {len(source.x_val)} validation examples"
    )


def _workers_label(world_size: int) -> str:
    """'2 worker(s), gloo'; '1 worker (no launcher)' for a process started on its own."""
    c = distributed.controller()
    return "1 worker (no launcher)" if c == "none" else f"{world_size} worker(s), {c}"


def _lr_label(cfg: Config, d: Derived) -> str:
    """How `derive` scaled the learning rate: 'linear x2 for 2 workers', or why it did not."""
    if d.lr_factor == 1.0:
        if cfg.optimizer.lr_scaling == "none":
            return "not scaled: optimizer.lr_scaling none"
        if cfg.train.batch_size_mode == "global" and d.accumulation_steps == 1:
            return "not scaled: the global batch is fixed"
        return "not scaled: one worker"
    why = [f"{d.world_size} workers"] if cfg.train.batch_size_mode == "per_worker" else []
    if d.accumulation_steps > 1:
        why.append(f"{d.accumulation_steps} accumulated batches")
    return f"{cfg.optimizer.lr_scaling} x{d.lr_factor:.3g} for {' x '.join(why)}"


def _summary_base(cfg: Config, d: Derived, device: str) -> dict[str, Any]:
    return {
        "status": "running",
        "started_at": time.time(),
        "world_size": d.world_size,
        "controller": distributed.controller(),
        "device": device,
        **_batches(d),
        "batch_size_mode": cfg.train.batch_size_mode,
        "epochs": cfg.train.epochs,
        "epochs_completed": 0,
        "resumed_from": None,
        "last_checkpoint": None,
        "model_path": None,
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


def _results(
    history: dict[str, list[float]], cfg: Config, control: RunControl, user: AgreedStop | None
) -> dict[str, Any]:
    epoch, step = control.stopped_at or (cfg.train.epochs, 0)
    early = user.stopped_early if user and not control.stopping else None
    if early and early["epoch"] < cfg.train.epochs:
        # The users' callbacks ended it, as they were asked to: completed, and said so.
        epoch = early["epoch"]
        return {"status": "completed", "epochs_completed": epoch, "stopped_at": None,
                "stopped_early": early, **_rate_and_final(history)}  # fmt: skip
    finished = epoch >= cfg.train.epochs and step == 0  # a stop after the last step finished
    return {
        "status": "completed" if finished else "interrupted",
        "epochs_completed": epoch,
        # 1-based, as in the log: in epoch `epoch`, `step` steps were done (0: not begun).
        "stopped_at": None if finished else {"epoch": epoch + 1, "step": step},
        **({} if finished else {"stopped_by": signal.Signals(control.stop_signal).name}),
        **_rate_and_final(history),
    }


def _rate_and_final(history: dict[str, list[float]]) -> dict[str, Any]:
    times, examples = history.get("epoch_time_s", []), history.get("epoch_examples", [])
    skip = 1 if len(times) > 1 else 0  # a process's first epoch is warm-up (tracing)
    rate = sum(examples[skip:]) / sum(times[skip:]) if times else 0.0
    final = {k: float(v[-1]) for k, v in history.items() if v and k != "epoch_examples"}
    return {"train_examples_per_sec": rate, "final_metrics": final}


def _end_record(
    record: RunRecord | None,
    started: float,
    checkpointer: Checkpointer | None,
    **fields: Any,
) -> None:
    """Rank 0: the run's final summary.json (once; a stop already recorded wins)."""
    if not record:
        return
    fields["wall_time_s"] = time.perf_counter() - started
    if checkpointer is not None:
        fields["last_checkpoint"] = checkpointer.last
        fields["best_model_path"] = checkpointer.best_model
    try:
        record.end(**fields)
    finally:
        record.close()


def _finish(
    cfg: Config,
    model: tf.keras.Model,
    summary: dict[str, Any],
    started: float,
    checkpointer: Checkpointer | None,
) -> None:
    """Rank 0 exports model.keras.

    Raises:
        CheckpointError: model.keras could not be written (rank 0).
    """
    if distributed.is_chief():
        path = os.path.join(cfg.run.dir, "model.keras")
        try:
            summary["model_path"] = export_plain_model(model, path)
        except (OSError, tf.errors.OpError) as e:
            raise write_error(path, e, checkpointer.last if checkpointer else None) from e
