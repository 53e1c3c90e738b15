"""The training run, start to record: Horovod and the worker, the data, run.dir and its
record, the model, the resume, `fit` (under Horovod Elastic when enabled), and the ending.

Each ending has its module: outcome.py (completed, or stopped by an agreed signal), failure.py
(an error on this rank or another), resume.py (where training begins), state.py (what every
ending needs), banner.py (the opening lines).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from hvd_train.base import logs, startup
from hvd_train.base.errors import DeviceError
from hvd_train.config import Config, dump_yaml
from hvd_train.data.job import Job, Position, plan_job
from hvd_train.data.sources import load_source
from hvd_train.record import rundir
from hvd_train.record.layout import RunDir
from hvd_train.record.run_record import Opened, RunRecord
from hvd_train.record.stops import StopSignals, installed
from hvd_train.record.summary import (
    ENDINGS,
    Mlflow,
    Summary,
    Wandb,
    earlier_job,
    nothing_to_train,
    read_summary,
    run_so_far,
)
from hvd_train.runtime import distributed, tuning, worker
from hvd_train.runtime.keras.contract import Model
from hvd_train.train.callbacks.callback_list import RunCallbacks, RunLinks, build_callbacks
from hvd_train.train.callbacks.tensorboard import require_tensorboard
from hvd_train.train.checkpoint import plain_file_problem
from hvd_train.train.models import weights_note
from hvd_train.train.run.banner import log_plan
from hvd_train.train.run.elastic import fit_elastic
from hvd_train.train.run.failure import fail, reading_cause, record_cause, record_forced_exit
from hvd_train.train.run.fitting import fit_from
from hvd_train.train.run.outcome import (
    batches_and_rates,
    complete,
    gradient_size,
    say_done,
    stop,
    summarize,
    summary_base,
)
from hvd_train.train.run.resume import resume
from hvd_train.train.run.state import Run, Start, running
from hvd_train.train.run.tracking import check_tracker, start_tracking
from hvd_train.train.run.wandb_tracking import check_wandb, start_wandb
from hvd_train.train.step import build_compiled_model


def train(
    cfg: Config, config_path: str | None = None, signals: StopSignals | None = None
) -> tuple[Model | None, Summary]:
    """Trains as one worker of the job horovodrun started (or alone); returns model and summary
    (summary.json's fields, `Summary`).

    A rerun of a run that has nothing left to train (see record/summary.py nothing_to_train)
    says so in one line and returns (None, the run's summary) with run.dir untouched.

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
    with running(cfg, signals or installed(cfg)) as run:
        # The one hand-over from start-up's recorder: the run's own ending from here on.
        run.signals.recorded_by(
            functools.partial(record_forced_exit, run), on_signal=run.note_signal
        )
        # Read before Horovod starts: with nothing to train, its timeline is not opened either.
        finished_here = _finished_here(cfg)
        device = _start_worker(cfg, run, timeline=finished_here is None)
        startup.mark("horovod_init")
        if (finished := _nothing_to_train(finished_here)) is not None:
            return None, finished
        # logging.mlflow, logging.wandb: a server that does not answer, before any write.
        check_tracker(cfg.logging)
        check_wandb(cfg.logging)
        source = load_source(cfg)
        startup.mark("data")
        job = plan_job(cfg, source, distributed.size())
        try:
            opened = _open_run_dir(job, config_path, run, device)
        except BaseException as e:
            _end_under_the_claim(cfg, run, e)
            raise
        startup.mark("run_dir")
        try:
            log_plan(job, device)
            tuning.log_knobs(cfg, job.plan)
            model = build_compiled_model(job, device)
            startup.mark("model")
            if note := weights_note(cfg.model):
                distributed.log(note)  # rank 0; a resume below then restores the checkpoint
            # Found before training, on every rank: the probe builds layers, whose automatic
            # names count up, and Horovod matches the ranks' gradients by their names (a probe
            # on rank 0 alone left the ranks' names apart and hung the job). Said once.
            if problem := plain_file_problem(model, built_in=not cfg.model.factory):
                distributed.log(f"note: {problem}")
            start = resume(job, model)
            run.note_start(start, **gradient_size(cfg.horovod, model))
            run.tracker = start_tracking(cfg, run.record, opened.mlflow)
            _start_wandb(cfg, run, opened.wandb)
            history = _fit(job, model, start, run)
        except BaseException as e:
            cause = reading_cause(e)
            fail(run, cause)
            if cause is not e:
                raise cause from e
            raise
        summary = summarize(cfg, history, source, run.callbacks, start)
        if summary["status"] == "interrupted":
            stop(run, summary)  # raises Interrupted once rank 0 has recorded the stop
        try:
            complete(cfg.run.dir, model, summary, run)
        except BaseException as e:
            fail(run, e)  # the export or the record failed: said and recorded like any failure
            raise
        say_done(cfg.run.dir, summary, run)
        if run.record:
            return model, run.record.summary
        # The model's Keras, which a factory's model may have switched (runtime.keras: auto).
        return model, {**opened.base, "versions": distributed.versions(), **summary}


def _start_worker(cfg: Config, run: Run, timeline: bool = True) -> str:
    """Starts Horovod, TensorFlow and the Keras on this worker (runtime/worker.py); returns
    its device ("gpu" or "cpu")."""
    require_tensorboard(cfg.logging)  # bad input: one line, before anything starts
    try:
        device = worker.start(cfg, RunDir(cfg.run.dir).timeline if timeline else None)
    except DeviceError as e:
        # Not the config's fault alone: the host's TensorFlow. Recorded as the run's failure,
        # so that a run that never trained says `failed`, not nothing.
        if distributed.is_chief():
            run.end("failed", before_record=True, error=str(e), error_type=type(e).__name__)
        raise
    run.signals.chief = distributed.is_chief()
    return device


def _open_run_dir(job: Job, config_path: str | None, run: Run, device: str) -> Opened:
    """Claims run.dir (rank 0), moves this rank's output into its log there, and starts rank
    0's record: summary.json says `running` from here on."""
    cfg = job.cfg
    _prepare_run_dir(cfg, config_path, run)
    # run.dir is this job's now: this rank's output goes on in its log there.
    rank = distributed.rank()
    logs.attach(
        RunDir(cfg.run.dir).rank_log(rank), rank, logs.attempt_description(cfg.train.resume)
    )
    base = summary_base(cfg.train, job.plan, device)
    if not distributed.is_chief():
        run.opened = Opened(base)
        return run.opened
    run.opened = _carried_forward(cfg, base, read_summary(RunDir(cfg.run.dir).summary))
    # The record first: a stop that comes while it starts is recorded (record_forced_exit).
    # Its `versions` are the stack's at each write: the model's Keras once it is built.
    run.record = RunRecord(cfg.run.dir, run.opened, distributed.versions)
    run.record.start()
    return run.opened


def _carried_forward(cfg: Config, base: Summary, previous: Summary) -> Opened:
    """What this job carries forward from `previous`, run.dir's record before it: the jobs
    that trained the run (kept when this one resumes: note_start), and the MLflow and W&B
    runs it continues (one of each per run.dir, unless told to start afresh)."""
    continues = cfg.train.resume != "never"
    mlflow = Mlflow(previous.get("mlflow") or {}) if cfg.logging.mlflow and continues else {}
    wandb = Wandb(previous.get("wandb") or {}) if cfg.logging.wandb and continues else {}
    if previous.get("status") not in ENDINGS:
        return Opened(base, mlflow=mlflow, wandb=wandb)
    earlier = [*previous.get("earlier_jobs", []), earlier_job(previous)]
    return Opened(base, earlier, run_so_far(previous), mlflow, wandb)


def _end_under_the_claim(cfg: Config, run: Run, e: BaseException) -> None:
    """Rank 0 claimed run.dir, but `e` came before its record started: in the collective that
    tells every rank the claim's outcome, another worker died (Gloo raises at once, before
    horovodrun's SIGTERM). Rank 0 writes the ending under the claim it holds, naming the
    worker that failed first when horovodrun noted it; the stop watcher, told the run has
    written its ending, then leaves the process to end as it does."""
    if run.claim is None or run.record is not None:
        return  # no claim (a refusal: nothing of this job's may be written), or a record
    cause = functools.partial(record_cause, e, recorded=True)
    run.end("failed", before_record=True, cause=cause, error_type=type(e).__name__)


def _prepare_run_dir(cfg: Config, config_path: str | None, run: Run) -> None:
    """Rank 0 claims run.dir and writes the resolved config there, before anything else is
    written; a refusal is raised on every rank, so none waits for rank 0."""

    def claim_and_write() -> None:
        # The run holds the claim at once: an ending in the collective below releases it.
        run.claim = rundir.claim(
            cfg.run.dir,
            overwrite=cfg.run.overwrite,
            config_path=config_path,
            log=distributed.log,
        )
        run.claim.write_config(dump_yaml(cfg))

    distributed.chief_computes(claim_and_write, "hvd_train.run_dir")


def _start_wandb(cfg: Config, run: Run, earlier: Wandb) -> None:
    """Rank 0's W&B run (logging.wandb), which the stop watcher also ends when it ends the
    process: its exit record is written before the process goes."""
    run.wandb = start_wandb(cfg, run.record, earlier)
    if run.wandb is not None and run.record is not None:
        tracking, record = run.wandb, run.record
        run.signals.before_exit.append(lambda: tracking.end(record.summary))


class Finished(NamedTuple):
    """A rerun of a run with nothing left to train: why, in one line, and the run's record."""

    why: str
    summary: Summary


def _finished_here(cfg: Config) -> Finished | None:
    """With train.resume auto, run.dir's record as this host reads it, and why it has nothing
    left to train; None when it has."""
    if cfg.train.resume != "auto" or cfg.run.overwrite:
        return None
    summary = read_summary(RunDir(cfg.run.dir).summary)
    why = nothing_to_train(summary, cfg.train.epochs, cfg.run.dir)
    return Finished(why, summary) if why else None


def _nothing_to_train(finished_here: Finished | None) -> Summary | None:
    """Rank 0's `_finished_here`, on every rank: when the run has nothing left to train, rank 0
    says why in one line and every rank gets the record as it is; else None. Nothing is
    written: not the config, not a log line, not the record."""
    found = distributed.chief_computes(lambda: finished_here, "hvd_train.nothing_to_train")
    if found is None:
        return None
    logs.release(replay=False)  # a launcher's worker: its held start-up output is just noise
    distributed.log(found.why)
    return found.summary


def _fit(job: Job, model: Model, start: Start, run: Run) -> dict[str, list[float]]:
    """Trains from `start` to `train.epochs` (under Horovod Elastic when enabled); returns the
    history. `run.callbacks` are the last callbacks built."""
    cfg = job.cfg

    def wire(job: Job, at: Position, leading: tuple = ()) -> RunCallbacks:
        trackers = [t.sender for t in (run.tracker, run.wandb) if t is not None]
        links = RunLinks(run.signals, run.record, trackers)
        run.callbacks = build_callbacks(job, model, at, links, leading)
        return run.callbacks

    if not cfg.elastic.enabled:
        return fit_from(model, job, start, wire(job, start))
    history, report = fit_elastic(model, job, start, wire)
    # Horovod Elastic: when rank 0 was lost, a survivor became rank 0; it ends the record (the
    # lost one's keeper has meanwhile written `failed`).
    if run.record is None and distributed.is_chief() and run.opened is not None:
        run.record = RunRecord.taken_over(cfg.run.dir, run.opened, distributed.versions)
        # To end the run's MLflow and W&B runs.
        run.tracker = start_tracking(cfg, run.record, run.record.opened.mlflow)
        _start_wandb(cfg, run, run.record.opened.wandb)
    if run.record:
        last = run.callbacks.plan
        run.record.update(world_size=last.world_size, elastic=report, **batches_and_rates(last))
    return history
