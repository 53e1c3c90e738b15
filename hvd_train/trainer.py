"""The training run: Horovod init, data, model, DistributedOptimizer, fit, summary."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf

from hvd_train import distributed, images, logs, perf, rundir, startup, tuning
from hvd_train.callbacks import Checkpointer, RunCallbacks, build_callbacks, require_tensorboard
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
from hvd_train.control import RunControl
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
    users_frame,
)
from hvd_train.fitting import fit_from
from hvd_train.input_diagnostics import data_summary
from hvd_train.keras_stack import keras
from hvd_train.models import weights_note
from hvd_train.record import (
    ENDINGS,
    SUMMARY,
    RecordError,
    RunRecord,
    earlier_job,
    nothing_to_train,
    read_json,
)
from hvd_train.schedules import lr_multiplier
from hvd_train.stops import StopSignals, failed_first, first_failure_awaited, installed
from hvd_train.training_step import build_compiled_model
from hvd_train.user_callbacks import AgreedStop


def train(
    cfg: Config, config_path: str | None = None, signals: StopSignals | None = None
) -> tuple[keras.Model | None, dict[str, Any]]:
    """Trains as one worker of the job horovodrun started (or alone); returns model and summary.

    A rerun of a run that has nothing left to train (see record.nothing_to_train) says so in
    one line and returns (None, the run's summary) with run.dir untouched.

    Args:
        cfg: the loaded config.
        config_path: the `--config` file, which run.dir/config.yaml never overwrites. Defaults
            to None (the config is the defaults alone).
        signals: the stop handling from `stops.installed(cfg)`, when the caller installed it
            before TensorFlow loaded (the command line does). Defaults to None: installed here.

    Raises:
        UserError: bad config or data, or a run.dir this job cannot have (exit code 2).
        TrainingError: a NaN or infinite loss, a failed write (exit code 1).
        Interrupted: SIGTERM or SIGINT; a checkpoint was written (exit code 128 + signal).
    """
    with _running(signals or installed(cfg)) as run:
        # Read before Horovod starts: with nothing to train, its timeline is not opened either.
        finished_here = _finished_here(cfg)
        device = _start_worker(cfg, run, timeline=finished_here is None)
        startup.mark("horovod_init")
        if (finished := _nothing_to_train(finished_here)) is not None:
            return None, finished
        source = load_source(cfg)
        startup.mark("data")
        plan = derive(cfg, distributed.size(), source.num_train)
        _open_run_dir(cfg, config_path, run, plan, device)
        startup.mark("run_dir")
        try:
            _log_plan(cfg, plan, source, device)
            tuning.log_knobs(cfg, plan)
            model = build_compiled_model(cfg, plan, source.input_shape, source.num_classes, device)
            startup.mark("model")
            if note := weights_note(cfg):
                distributed.log(note)  # rank 0; a resume below then restores the checkpoint
            start = _resume(cfg, model, plan)
            run.note_start(start, **_gradient_size(cfg, model))
            history = _fit(cfg, model, source, plan, start, run)
        except BaseException as e:
            cause = _reading_cause(e)
            _fail(run, cause)
            if cause is not e:
                raise cause from e
            raise
        summary = _summarize(cfg, history, source, run.callbacks, start)
        if summary["status"] == "interrupted":
            _stop(run, summary)  # raises Interrupted once rank 0 has recorded the stop
        _complete(cfg, model, summary, run)
        return model, run.record.summary if run.record else {**run.base, **summary}


@dataclass
class _Run:
    """What every ending of the run needs: the stop handling, rank 0's claim on run.dir and its
    record, and the current callbacks (their Checkpointer knows the last checkpoint)."""

    signals: StopSignals
    started: float = field(default_factory=time.perf_counter)
    claims: list[rundir.Claim] = field(default_factory=list)  # rank 0's, from _open_run_dir
    record: RunRecord | None = None  # rank 0's
    base: dict[str, Any] = field(default_factory=dict)  # summary.json's opening fields
    callbacks: RunCallbacks | None = None  # the latest build (one per elastic membership)
    earlier: list[dict[str, Any]] = field(default_factory=list)  # jobs that trained run.dir

    def release(self) -> None:
        for claim in self.claims:
            claim.release()

    @property
    def checkpointer(self) -> Checkpointer | None:
        return self.callbacks.checkpointer if self.callbacks else None

    def note_start(self, start: Start, **model: Any) -> None:
        """Where training begins, for a stop's record and for summary.json, with `model`'s
        figures (`_gradient_size`)."""
        self.signals.abandon = functools.partial(_abandon, self.record, start)
        if self.record:
            self.record.update(
                **model,
                epochs_completed=start.epoch,
                resumed_from=start.checkpoint,
                last_checkpoint=start.checkpoint,
                trained_from={"epoch": start.epoch + 1, "step": start.step},
                earlier_jobs=self.earlier if start.checkpoint else [],
            )


@contextlib.contextmanager
def _running(signals: StopSignals) -> Iterator[_Run]:
    """The run, its stops handled from the first moment: a stop during start-up ends at once,
    recorded by `signals.abandon` (stops.installed's until the record exists, then the
    record's; the watcher thread may end the process). run.dir is released at every ending:
    completed, failed, interrupted."""
    run = _Run(signals)
    run.signals.before_exit.append(run.release)
    try:
        yield run
    finally:
        run.signals.done.set()
        run.signals.uninstall()
        run.release()


def _start_worker(cfg: Config, run: _Run, timeline: bool = True) -> str:
    """Starts Horovod and TensorFlow on this worker; returns its device ("gpu" or "cpu").
    `timeline` False: no Horovod timeline (horovod.timeline, or a launcher's flag), which
    Horovod would empty at init."""
    require_tensorboard(cfg)  # bad input: one line, before anything starts
    tuning.before_init(cfg)  # core binding: before Horovod and TensorFlow start threads
    knobs = cfg.horovod
    if not timeline:
        os.environ.pop("HOROVOD_TIMELINE", None)
        knobs = dataclasses.replace(knobs, timeline=False)
    distributed.init(knobs, cfg.run.dir)
    run.signals.chief = distributed.is_chief()
    device = distributed.configure_devices(
        cfg.runtime.intra_op_threads, cfg.runtime.inter_op_threads
    )
    # Same seed on every rank: identical initial weights, so the broadcast before training is a
    # no-op for built-in models and a guarantee for user factories that draw from other
    # generators.
    keras.utils.set_random_seed(cfg.runtime.seed)
    return device


def _open_run_dir(
    cfg: Config, config_path: str | None, run: _Run, plan: Derived, device: str
) -> None:
    """Claims run.dir (rank 0), moves this rank's output into its log there, and starts rank
    0's record: summary.json says `running` from here on."""
    _prepare_run_dir(cfg, config_path, run.claims)
    # run.dir is this job's now: this rank's output goes on in its log there.
    logs.attach(cfg.run.dir, distributed.rank(), logs.attempt_description(cfg.train.resume))
    run.base = _summary_base(cfg, plan, device)
    if not distributed.is_chief():
        return
    # What the jobs before this one did, kept when this one resumes (note_start).
    previous = read_json(os.path.join(cfg.run.dir, SUMMARY))
    if previous.get("status") in ENDINGS:
        run.earlier = [*previous.get("earlier_jobs", []), earlier_job(previous)]
    record = run.record = RunRecord(cfg.run.dir, run.base)
    # Hooks first: a stop that comes while the record starts is recorded.
    run.signals.on_signal = lambda signum: record.note(signal=signum)
    run.signals.abandon = functools.partial(_abandon, record, None)
    record.start()


def _finished_here(cfg: Config) -> dict[str, Any] | None:
    """With train.resume auto, run.dir's record as this host reads it, and why it has nothing
    left to train ({"why", "summary"}); None when it has."""
    if cfg.train.resume != "auto" or cfg.run.overwrite:
        return None
    summary = read_json(os.path.join(cfg.run.dir, SUMMARY))
    why = nothing_to_train(summary, cfg.train.epochs, cfg.run.dir)
    return {"why": why, "summary": summary} if why else None


def _nothing_to_train(finished_here: dict[str, Any] | None) -> dict[str, Any] | None:
    """Rank 0's `_finished_here`, on every rank: when the run has nothing left to train, rank 0
    says why in one line and every rank gets the record as it is; else None. Nothing is
    written: not the config, not a log line, not the record."""
    found = distributed.chief_computes(lambda: finished_here, "hvd_train.nothing_to_train")
    if found is None:
        return None
    logs.release(replay=False)  # a launcher's worker: its held start-up output is just noise
    distributed.log(found["why"])
    return found["summary"]


def _fit(
    cfg: Config,
    model: keras.Model,
    source: Source,
    plan: Derived,
    start: Start,
    run: _Run,
) -> dict[str, list[float]]:
    """Trains from `start` to `train.epochs` (under Horovod Elastic when enabled); returns the
    history. `run.callbacks` are the last callbacks built."""

    def wire(plan: Derived, epoch: int, step: int, leading: tuple = ()) -> RunCallbacks:
        run.callbacks = build_callbacks(
            cfg, plan, model, source, run.signals, epoch, step, run.record, leading
        )
        return run.callbacks

    if not cfg.elastic.enabled:
        callbacks = wire(plan, start.epoch, start.step)
        return fit_from(model, source, cfg, plan, start.epoch, start.step, callbacks)
    history, report = fit_elastic(model, source, cfg, start.epoch, start.step, wire)
    # Horovod Elastic: when rank 0 was lost, a survivor became rank 0; it ends the record (the
    # lost one's keeper has meanwhile written `failed`).
    if run.record is None and distributed.is_chief():
        run.record = RunRecord(cfg.run.dir, run.base)
    if run.record:
        last = run.callbacks.plan
        run.record.update(world_size=last.world_size, elastic=report, **_batches(last))
    return history


def _summarize(
    cfg: Config,
    history: dict[str, list[float]],
    source: Source,
    callbacks: RunCallbacks,
    start: Start,
) -> dict[str, Any]:
    """summary.json's results: how the run ended, its metrics, data and throughput."""
    summary = _results(history, cfg, callbacks.control, callbacks.user_stop)
    # A resume with nothing left to train (its end still to do): the run's own figures.
    summary["epochs_completed"] = max(summary["epochs_completed"], start.epoch)
    if not summary["final_metrics"]:
        summary["final_metrics"] = dict(start.metrics)
    summary.update(data_summary(history, source.skipped_files))
    summary.update(perf.throughput_summary(callbacks.timer, cfg))
    summary["startup_s"] = startup.phases()  # rank 0's: from its process's start to its first step
    perf.log_throughput(summary)
    return summary


def _stop(run: _Run, summary: dict[str, Any]) -> None:
    """An agreed stop: rank 0 records it, every rank waits for that, then raises Interrupted."""
    _end_record(run, **summary)
    run.signals.done.set()  # the stop is recorded: the watcher lets this process end itself
    # Every rank leaves only when rank 0 has written the stop checkpoint and the summary:
    # the launcher ends the whole job when the first rank exits.
    _barrier_if_alive("hvd_train.stopped")
    control = run.callbacks.control
    where = run.checkpointer.last if run.checkpointer else "rank 0's run.dir"
    raise Interrupted(
        control.stop_signal,
        f"stopped by {signal.Signals(control.stop_signal).name} at epoch "
        f"{control.stopped_at[0] + 1}, step {control.stopped_at[1]}; checkpoint {where}; run "
        "the same command again to resume",
    )


def _complete(cfg: Config, model: keras.Model, summary: dict[str, Any], run: _Run) -> None:
    """A completed run: rank 0 exports model.keras and records the end; one closing line."""
    try:
        _finish(cfg, model, summary, run.checkpointer)
        _end_record(run, **summary)
    except BaseException as e:
        _fail(run, e)
        raise
    run.signals.done.set()
    distributed.log(
        f"done in {time.perf_counter() - run.started:.1f} s: {_closing_figures(summary)}; "
        f"results in {cfg.run.dir}"
    )


def _closing_figures(summary: dict[str, Any]) -> str:
    """The closing line's figures: the last epoch's validation accuracy, or its training
    accuracy where there was no validation (or no accuracy metric: the loss), and throughput.
    A run with no validation must not say `val_accuracy 0.0000`."""
    m = summary["final_metrics"]
    name = next((k for k in ("val_accuracy", "accuracy", "val_loss", "loss") if k in m), None)
    shown = [f"{name} {m[name]:.4f}"] if name else []
    rate = summary["train_examples_per_sec"]
    shown.append(f"{rate:.0f} examples/s" if rate >= 10 else f"{rate:.2g} examples/s")
    return ", ".join(shown)


def _abandon(
    record: RunRecord,
    start: Start | None,
    signum: int,
    reason: str,
    ran: bool,
    failed: bool,
    failed_rank: int | None = None,
) -> None:
    """Called by the stop watcher just before it ends this process: records the ending.

    `ran`: whether any step ran; without one, training continues where `start` says.
    `failed`: the launcher is ending the job after a failure elsewhere, not stopping it;
    `failed_rank`: the rank that failed first, when the launcher said.
    """
    name = signal.Signals(signum).name
    if failed:
        known = {} if failed_rank is None else {"failed_rank": failed_rank}
        _end_quietly(record, status="failed", error=reason, **known)
        logs.failed(reason if known else f"{ANOTHER_FIRST}, or the job was stopped: {reason}")
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


def _fail(run: _Run, e: BaseException) -> None:
    """Every rank says why it stopped, in one line (the launcher names the rank whose error
    came first and was not a consequence of another rank's failure); rank 0 records it. A
    traceback goes to the rank's log only, and not for the errors that are one line by design."""
    one_line = isinstance(e, (UserError, TrainingError))
    where = None if one_line else users_frame(e)  # in a model factory, a callback
    at = f" (at {where})" if where else ""
    logs.failed(_console_cause(e) + at, None if one_line else e)
    try:
        cause = _cause(e, recorded=run.record is not None)
        cause["error"] += at
        _end_record(run, status="failed", **cause, error_type=type(e).__name__)
    except RecordError as e2:
        logs.say(f"hvd_train: error: {e2}")


def _reading_cause(e: BaseException) -> BaseException:
    """For a TensorFlow error of the input pipeline, the error the data reader raised (a
    DataError names the file and what changed); else `e`."""
    failure = images.read_failure() if isinstance(e, tf.errors.OpError) else None
    if failure is None:
        return e
    if isinstance(failure, UserError):
        return failure
    return DataError(f"reading the data failed: {_one_line(failure)}")


def _cause(e: BaseException, recorded: bool) -> dict[str, Any]:
    """The summary's `error`: this rank's own error, or that another rank failed first, with
    `failed_rank` when horovodrun noted which (under Gloo; stops.first_failure_awaited).
    `recorded`: this rank writes the record (rank 0, once it started): only it asks."""
    text = _one_line(e)
    if not any(c in text for c in KNOCK_ON):
        return {"error": text}
    if recorded and (first := first_failure_awaited()) is not None:
        return {"error": f"{failed_first(first)}; rank 0 then saw: {text}",
                "failed_rank": first["rank"]}  # fmt: skip
    return {"error": f"{ANOTHER_FIRST}; rank 0 then saw: {text}"}


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
    metrics: dict[str, float] = field(default_factory=dict)  # the checkpoint's epoch-end metrics


def _resume(cfg: Config, model: keras.Model, plan: Derived) -> Start:
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
    if step and state["global_batch"] != plan.global_batch:
        # The epoch's order does not depend on the worker count: continue after the examples
        # already seen, rounded down to a whole global batch (a few may be seen twice).
        step = state["examples_in_epoch"] // plan.global_batch
    if step >= plan.steps_per_epoch:
        epoch, step = epoch + 1, 0
    aside = ", ".join(found["set_aside"])
    aside = f"; set aside as unloadable: {aside}" if aside else ""
    distributed.log(
        f"resuming from {found['path']}: epoch {epoch + 1}, step {step} "
        f"(saved with {state['world_size']} worker(s), global batch {state['global_batch']})"
        f"{aside}"
    )
    return Start(epoch=epoch, step=step, checkpoint=found["path"], metrics=state.get("metrics", {}))


def _read_checkpoint(cfg: Config, model: keras.Model) -> dict[str, Any]:
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


def _load_named(cfg: Config, model: keras.Model, path: str) -> dict[str, Any]:
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


def _log_plan(cfg: Config, plan: Derived, source: Source, device: str) -> None:
    used = plan.examples_per_epoch
    n = source.num_train
    rest = f"{n - used} unused per epoch" if used <= n else f"{used - n} repeated per epoch"
    rest += f", data.remainder: {cfg.data.remainder}"
    if source.description:
        distributed.log(source.description)
    warm = f", warm-up {cfg.optimizer.warmup_epochs:g} epochs" if plan.warmup_steps else ""
    distributed.log(
        f"{_workers_label(plan.world_size)}, {device} | batch {plan.per_worker_batch}/worker, "
        f"{plan.global_batch} global | learning rate {plan.base_lr:g} -> {plan.scaled_lr:g} "
        f"({_lr_label(cfg, plan)}{warm}) | {plan.steps_per_epoch} steps/epoch over {n} "
        f"training examples ({rest}) | {len(source.x_val)} validation examples"
    )


def _workers_label(world_size: int) -> str:
    """'2 worker(s), gloo'; '1 worker (no launcher)' for a process started on its own."""
    c = distributed.controller()
    return "1 worker (no launcher)" if c == "none" else f"{world_size} worker(s), {c}"


def _lr_label(cfg: Config, plan: Derived) -> str:
    """How `derive` scaled the learning rate: 'linear x2 for 2 workers', or why it did not."""
    if plan.lr_factor == 1.0:
        if cfg.optimizer.lr_scaling == "none":
            return "not scaled: optimizer.lr_scaling none"
        if cfg.train.batch_size_mode == "global" and plan.accumulation_steps == 1:
            return "not scaled: the global batch is fixed"
        return "not scaled: one worker"
    why = [f"{plan.world_size} workers"] if cfg.train.batch_size_mode == "per_worker" else []
    if plan.accumulation_steps > 1:
        why.append(f"{plan.accumulation_steps} accumulated batches")
    return f"{cfg.optimizer.lr_scaling} x{plan.lr_factor:.3g} for {' x '.join(why)}"


def _gradient_size(cfg: Config, model: keras.Model) -> dict[str, Any]:
    """What each step all-reduces, for `hvd-train plan`: the trainable parameters and their
    bytes as sent (float32, or float16 with horovod.compression: fp16)."""
    params = sum(math.prod(int(d) for d in w.shape) for w in model.trainable_weights)
    fp16 = cfg.horovod.compression == "fp16"
    return {
        "trainable_parameters": params,
        "gradient_dtype": "float16" if fp16 else "float32",
        "gradient_bytes": params * (2 if fp16 else 4),
    }


def _summary_base(cfg: Config, plan: Derived, device: str) -> dict[str, Any]:
    return {
        "status": "running",
        "started_at": time.time(),
        "world_size": plan.world_size,
        "controller": distributed.controller(),
        "device": device,
        **_batches(plan),
        "batch_size_mode": cfg.train.batch_size_mode,
        "epochs": cfg.train.epochs,
        "epochs_completed": 0,
        "resumed_from": None,
        "last_checkpoint": None,
        "model_path": None,
        "versions": distributed.versions(),
    }


def _batches(plan: Derived) -> dict[str, Any]:
    return {
        "per_worker_batch_size": plan.per_worker_batch,
        "global_batch_size": plan.global_batch,
        "steps_per_epoch": plan.steps_per_epoch,
        "base_learning_rate": plan.base_lr,
        "scaled_learning_rate": plan.scaled_lr,
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
    # float(): the times are the workers' mean, a numpy float32 that numpy 2 keeps through the
    # division (numpy 1 made it a float64); summary.json takes Python floats only.
    rate = float(sum(examples[skip:]) / sum(times[skip:])) if times else 0.0
    final = {k: float(v[-1]) for k, v in history.items() if v and k != "epoch_examples"}
    return {"train_examples_per_sec": rate, "final_metrics": final}


def _end_record(run: _Run, **fields: Any) -> None:
    """Rank 0: the run's final summary.json (once; a stop already recorded wins)."""
    if not run.record:
        return
    fields["wall_time_s"] = time.perf_counter() - run.started
    if run.checkpointer is not None:
        fields["last_checkpoint"] = run.checkpointer.last
        fields["best_model_path"] = run.checkpointer.best_model
    try:
        run.record.end(**fields)
    finally:
        run.record.close()


def _finish(
    cfg: Config, model: keras.Model, summary: dict[str, Any], checkpointer: Checkpointer | None
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
