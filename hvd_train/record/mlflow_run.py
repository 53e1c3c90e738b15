"""One MLflow run per run.dir: where the runs go, rank 0's sender, and the MLflow run's end
following the record.

With `logging.mlflow: true`, rank 0 logs its run to MLflow (what it logs: train/run/tracking.py;
docs/tracking.md). The MLflow run's id is kept in summary.json's `mlflow` (summary.py `Mlflow`):
every later job in run.dir (a resume, a raised train.epochs, a restart by `hvd-train launch`, a
Slurm requeue) continues that MLflow run unless `train.resume: never` starts afresh, and so
does a reset of Horovod Elastic, in the same process. The MLflow run's status follows the record's (`STATUS`): rank 0
sets it at its end; when rank 0 could not (killed, ended by its stop watcher, the server away
then), its keeper does once rank 0 has gone, and `hvd-train launch` does after it changed an
ending (`follow_record`).

The tracking server never stops or slows training: rank 0's epoch points go out from a thread
of their own, every request is bounded (`CLIENT_DEFAULTS`), and the first failure ends the
sending for the job, said once on the console and in summary.json with the points not sent
(`Sender`).

Standard library at import: MLflow (a second of imports) loads only where logging.mlflow is on.
"""

from __future__ import annotations

import importlib.util
import os
import queue
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hvd_train.base.errors import UserError
from hvd_train.config import LoggingConfig
from hvd_train.record.layout import SUMMARY, RunDir
from hvd_train.record.summary import MetricPoint, Mlflow, read_summary

# The record's ending, as MLflow says it.
STATUS = {"completed": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
# `hvd-train sweep`'s run of the whole grid, for the runs of its points (launcher/sweep.py).
PARENT_RUN = "HVD_TRAIN_MLFLOW_PARENT_RUN_ID"
# MLflow's client retries a request for minutes by default (7 retries, backoff factor 2, a
# 120 s timeout): a few seconds here, a lost server then noticed at once. And MLflow's usage
# reports to its makers' servers stay off. Each holds unless the variable is already set.
CLIENT_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",  # retries after 0 s, then 2 s
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",  # seconds without a byte, per request
    "MLFLOW_DISABLE_TELEMETRY": "true",
}
DEFAULT_EXPERIMENT = "Default"  # MLflow's own, id 0
# MLflow's limits on one log_batch request.
_BATCH_PARAMS_TAGS = 100
_BATCH_METRICS = 1000
_PARAM_LENGTH = 6000


@dataclass(frozen=True)
class Where:
    """Where a run's MLflow run goes: the tracking URI and the experiment; None for MLflow's own
    default (its local store; its Default experiment)."""

    uri: str | None
    experiment: str | None


def where(logging: LoggingConfig, environ: Mapping[str, str] = os.environ) -> Where:
    """The config's keys (`logging.mlflow_tracking_uri`, `logging.mlflow_experiment_name`) win;
    "" leaves it to MLflow's variables (MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME), then to
    MLflow's defaults."""
    uri = logging.mlflow_tracking_uri or environ.get("MLFLOW_TRACKING_URI") or None
    name = logging.mlflow_experiment_name or environ.get("MLFLOW_EXPERIMENT_NAME") or None
    return Where(uri, name)


@dataclass(frozen=True)
class Target:
    """The MLflow run a job opens: at `place`, the one `continues` names (summary.json's
    `mlflow` before this job), else a new one called `name`."""

    place: Where
    name: str
    continues: Mlflow


def require_mlflow() -> None:
    """Raises UserError (exit code 2) in one line when MLflow is not installed."""
    if importlib.util.find_spec("mlflow") is None:
        raise UserError(
            "logging.mlflow is true, but MLflow is not installed here: pip install "
            "'hvd_train[mlflow]' (or HVD_TRAIN_MLFLOW=1 scripts/install.sh), or set "
            "logging.mlflow: false"
        )


def client(uri: str | None) -> tuple[Any, str]:
    """MLflow's client for `uri` (None: MLflow's default), with its requests bounded and its
    INFO lines (a new local store's set-up) off the console; and the URI it resolved to."""
    for name, value in CLIENT_DEFAULTS.items():
        os.environ.setdefault(name, value)
    import logging

    import mlflow

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    # Each retry of a request would be a warning line of urllib3's (MLflow's HTTP client): a
    # server that went away is said once, by the Sender.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    resolved = uri or mlflow.get_tracking_uri()  # the default made absolute: sqlite:////cwd/...
    return mlflow.MlflowClient(tracking_uri=resolved), resolved


def shown(uri: str) -> str:
    """`uri` without a password it may hold (`http://user:secret@host` -> `http://host`)."""
    parts = urllib.parse.urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def cause(e: BaseException | str) -> str:
    """What went wrong, in a few words: the OS's reason where there is one (`[Errno 111]
    Connection refused`), else the error's first 200 characters on one line."""
    text = " ".join(str(e).split())
    errno = re.search(r"\[Errno -?\d+\] [^'\")]+", text)
    found = errno.group(0) if errno else text
    return found if len(found) <= 200 else found[:197] + "..."


def check_reachable(place: Where) -> None:
    """Raises UserError (exit code 2) in one line unless the tracking server (or store) answers.

    Before any worker trains: a run whose tracker cannot be reached at its start would train
    without the record the user asked for.
    """
    require_mlflow()
    uri = place.uri or "MLflow's default store"
    try:
        tracker, uri = client(place.uri)
        tracker.get_experiment_by_name(place.experiment or DEFAULT_EXPERIMENT)
    except Exception as e:
        raise UserError(
            f"logging.mlflow: cannot reach the MLflow tracking server at {shown(uri)} "
            f"({cause(e)}): start it, point MLFLOW_TRACKING_URI (or "
            "logging.mlflow_tracking_uri) at one that answers, or set logging.mlflow: false"
        ) from None


def experiment_id(tracker: Any, name: str | None) -> str:
    """The id of the experiment called `name` (MLflow's Default when None), created if missing."""
    found = tracker.get_experiment_by_name(name or DEFAULT_EXPERIMENT)
    if found is not None:
        return found.experiment_id
    try:
        return tracker.create_experiment(name)
    except Exception:  # another job created it meanwhile
        found = tracker.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def point(key: str, value: float, step: int) -> MetricPoint:
    """A metric point at `step`, stamped now."""
    return {"key": key, "value": float(value), "step": step, "timestamp": int(time.time() * 1000)}


def param_value(value: Any) -> str:
    """A parameter as MLflow keeps it (a string of at most 6000 characters), as YAML writes the
    value: true, null, [32, 32]."""
    import json

    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= _PARAM_LENGTH else text[: _PARAM_LENGTH - 3] + "..."


class Losable:
    """A tracker's run that its first failure loses for the rest of the job (MLflow's `Sender`,
    W&B's `WandbRun`): `lost` says why, `lose` records and says it, once."""

    lost: str | None

    def lose(self, why: str) -> None:
        raise NotImplementedError

    def call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` now, unless the run is lost; a failure loses it (`what`: where,
        for the note). Returns its result, or None."""
        if self.lost is not None:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            self.lose(f"{what}: {cause(e)}")
            return None


class Sender(Losable):
    """Rank 0's MLflow run while it trains.

    Epoch points go out from a thread of their own (`log_epoch`), so a slow or vanished server
    costs the training nothing; other calls run where they are made, bounded (`call`). The
    first failure ends the sending for this job: it is said once (`say`), and the points given
    after it, with those it could not send, are kept (`fields`, passed to `on_change` at each
    change: rank 0 puts them in summary.json).

    Args:
        tracker: MLflow's client.
        uri: its tracking URI.
        say: prints one line on rank 0's console.
        on_change: called with `fields()` when the run is lost or a point is kept unsent.
    """

    def __init__(
        self,
        tracker: Any,
        uri: str,
        say: Callable[[str], None],
        on_change: Callable[[Mlflow], None] = lambda _: None,
    ):
        self.tracker = tracker
        self.uri = uri  # as given: the keeper's; summary.json gets it `shown`
        self._fields: Mlflow = {"tracking_uri": shown(uri)}
        self._say, self._on_change = say, on_change
        self.lost: str | None = None
        self.unsent: list[MetricPoint] = []
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._send, name="hvd_train-mlflow", daemon=True)
        self._thread.start()

    @property
    def run_id(self) -> str | None:
        return self._fields.get("run_id")

    def fields(self) -> Mlflow:
        """summary.json's `mlflow`: the run, and what this job could not send."""
        with self._lock:
            lost = {"lost": self.lost} if self.lost else {}
            unsent = {"unsent_metrics": list(self.unsent)} if self.unsent else {}
        return {**self._fields, **lost, **unsent}  # type: ignore[typeddict-item]

    def identify(self, **fields: str) -> None:
        """Sets summary.json's `run_id`, `experiment_id`, `parent_run_id` ("": none)."""
        self._fields.update({k: v for k, v in fields.items() if v})

    def log_epoch(self, step: int, values: Mapping[str, float]) -> None:
        """Hands one epoch's values (step = the epoch, 1-based) to the sending thread; never
        waits for the server."""
        self.log_points([point(k, v, step) for k, v in values.items()], at=f"epoch {step}")

    def log_points(self, points: list[MetricPoint], at: str) -> None:
        """Hands `points` to the sending thread (`at`: where, for the note of a failure), or
        keeps them when the run is lost."""
        with self._lock:
            if self.lost is None:
                self._queue.put((points, at))
                return
            self.unsent += points
        self._on_change(self.fields())

    def flush(self, timeout_s: float) -> None:
        """Waits up to `timeout_s` for the points given so far to be sent; those still waiting
        then are kept as not sent, and the run is lost for this job."""
        done = threading.Event()
        self._queue.put((done, ""))
        if done.wait(timeout_s):
            return
        self.lose(f"at the run's end: no answer within {timeout_s:.0f} s")
        while True:
            try:
                points, _ = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(points, list):
                self._keep(points)

    def lose(self, why: str) -> None:
        """The server stopped answering: said once, noted in `fields`; nothing is sent after."""
        with self._lock:
            if self.lost is not None:
                return
            self.lost = why
        place = shown(self._fields.get("tracking_uri", "MLflow"))
        self._say(
            f"warning: MLflow at {place} stopped answering ({why}); training goes on without "
            f"it: {SUMMARY}'s mlflow.unsent_metrics keeps the points not sent, and the next "
            "job that continues this run sends them"
        )
        self._on_change(self.fields())

    def close(self) -> None:
        """Ends the sending thread (after `flush`)."""
        self._queue.put((None, ""))

    def _send(self) -> None:
        while True:
            points, at = self._queue.get()
            if points is None:
                return
            if isinstance(points, threading.Event):
                points.set()
                continue
            if self.lost is None and self.run_id is not None:
                try:
                    log_metrics(self.tracker, self.run_id, points)
                    continue
                except Exception as e:
                    self.lose(f"at {at}: {cause(e)}")
            self._keep(points)

    def _keep(self, points: list[MetricPoint]) -> None:
        with self._lock:
            self.unsent += points
        self._on_change(self.fields())


def log_metrics(tracker: Any, run_id: str, points: Iterable[MetricPoint]) -> None:
    from mlflow.entities import Metric

    metrics = [Metric(p["key"], p["value"], p["timestamp"], p["step"]) for p in points]
    for i in range(0, len(metrics), _BATCH_METRICS):
        tracker.log_batch(run_id, metrics=metrics[i : i + _BATCH_METRICS])


def log_params_and_tags(
    tracker: Any, run_id: str, params: Mapping[str, str], tags: Mapping[str, str]
) -> None:
    """`params` the run does not hold yet, and `tags`. MLflow never changes a parameter: a
    value that differs from the one a job before logged goes in as the tag `latest.<key>`."""
    from mlflow.entities import Param, RunTag

    held = tracker.get_run(run_id).data.params
    new = [Param(k, v) for k, v in params.items() if k not in held]
    changed = {f"latest.{k}": v for k, v in params.items() if k in held and held[k] != v}
    all_tags = [RunTag(k, v) for k, v in {**tags, **changed}.items()]
    for i in range(0, len(new), _BATCH_PARAMS_TAGS):
        tracker.log_batch(run_id, params=new[i : i + _BATCH_PARAMS_TAGS])
    for i in range(0, len(all_tags), _BATCH_PARAMS_TAGS):
        tracker.log_batch(run_id, tags=all_tags[i : i + _BATCH_PARAMS_TAGS])


def start(
    target: Target,
    params: Mapping[str, str],
    tags: Mapping[str, str],
    say: Callable[[str], None],
    on_change: Callable[[Mlflow], None] = lambda _: None,
) -> Sender:
    """Rank 0 opens the run's MLflow run (`target`): the one it continues (set running again),
    or a new one (under `hvd-train sweep`'s parent run when PARENT_RUN is set); logs `params`
    and `tags`, and sends the points an earlier job could not. A failure does not stop the
    run: the Sender is then lost (it says so), and keeps what it is given."""
    place, continues = target.place, target.continues
    tracker, uri = client(place.uri)
    sender = Sender(tracker, uri, say, on_change)
    at = "at the run's start"
    exp = sender.call(at, experiment_id, tracker, place.experiment)
    if exp is None:
        return sender
    sender.identify(experiment_id=exp)
    run_id = continues.get("run_id")
    if run_id and sender.call(at, _continue, tracker, run_id, say, uri):
        sender.identify(run_id=run_id, parent_run_id=continues.get("parent_run_id", ""))
    else:
        parent = os.environ.get(PARENT_RUN, "")
        first = {**({"mlflow.parentRunId": parent} if parent else {}), **_user()}
        run = sender.call(at, tracker.create_run, exp, run_name=target.name, tags=first)
        if run is None:
            return sender
        sender.identify(run_id=run.info.run_id, parent_run_id=parent)
    sender.call(at, log_params_and_tags, tracker, sender.run_id, params, tags)
    if continues.get("unsent_metrics"):
        sender.log_points(list(continues["unsent_metrics"]), at="the points an earlier job kept")
    return sender


def _continue(tracker: Any, run_id: str, say: Callable[[str], None], uri: str) -> bool:
    """Sets the run `run_id` running again; False (said once) when this store has no such run."""
    from mlflow.exceptions import MlflowException

    try:
        tracker.update_run(run_id, status="RUNNING")
    except MlflowException as e:
        if e.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        say(f"the MLflow run {run_id} of this run.dir is not at {shown(uri)}: starting a new one")
        return False
    return True


def _user() -> dict[str, str]:
    """MLflow's `mlflow.user` tag, as its own fluent API sets it."""
    import getpass

    try:
        return {"mlflow.user": getpass.getuser()}
    except (OSError, KeyError):  # no name for this uid (a container)
        return {}


def follow_record(run_dir: str, uri: str | None) -> str:
    """Sets the MLflow run of run.dir's record to the status the record ends with (`STATUS`);
    returns that status, or "" when there is nothing to set (no MLflow run, or still running).

    The keeper and `hvd-train launch` may both end a record, one after the other: the record is
    read again after each change, until the status set is the one it says.

    Raises:
        Exception: MLflow's, when the server does not answer.
    """
    tracker = None
    path = RunDir(run_dir).summary
    summary = read_summary(path)
    for _ in range(3):
        run_id = (summary.get("mlflow") or {}).get("run_id")
        want = STATUS.get(summary.get("status", ""))
        if not run_id or not want:
            return ""
        if tracker is None:
            tracker, _ = client(uri or summary["mlflow"].get("tracking_uri"))
        if tracker.get_run(run_id).info.status != want:
            tracker.set_terminated(run_id, want)
        again = read_summary(path)
        if again.get("status") == summary.get("status"):
            return want
        summary = again
    return want
