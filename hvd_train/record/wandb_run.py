"""One Weights & Biases run per run.dir: where it goes, rank 0's W&B run while it trains, and
its end with the record's.

With `logging.wandb: true`, rank 0 logs its run to W&B (what it logs:
train/run/wandb_tracking.py; docs/tracking.md). The W&B run's id is kept in summary.json's
`wandb` (summary.py `Wandb`): every later job in run.dir (a resume, a raised train.epochs, a
restart by `hvd-train launch`, a Slurm requeue) continues that W&B run unless `train.resume:
never` starts afresh. Rank 0 ends it as the record ends (`exit_code`): W&B's `finished` for
`completed`, `failed` (with the exit code) for a failure or a stop.

W&B never stops or slows training: its client hands each record to its own service process,
which sends it (online) or writes it (offline) while the step goes on; the start and the end
are bounded (`INIT_TIMEOUT_S`, `FINISH_TIMEOUT_S`), and the first failure ends the logging for
the job, said once on the console and in summary.json (`WandbRun.lose`). What the service could
not send stays in the run's folder under WANDB_DIR, for `wandb sync`.

Standard library at import: wandb (a second of imports) loads only where logging.wandb is on.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hvd_train.base.errors import UserError
from hvd_train.config import LoggingConfig
from hvd_train.record.layout import SUMMARY
from hvd_train.record.mlflow_run import Losable, cause, shown
from hvd_train.record.summary import Wandb

DEFAULT_BASE_URL = "https://api.wandb.ai"  # W&B's own, unless WANDB_BASE_URL names another
REACH_TIMEOUT_S = 10.0  # the check at the start, one request
INIT_TIMEOUT_S = 30.0  # wandb.init; W&B's default is 90 s
FINISH_TIMEOUT_S = 30.0  # wandb.finish's upload at the end; W&B's default waits without end


@dataclass(frozen=True)
class Where:
    """Where a run's W&B run goes; None for W&B's own default (its default project, the API
    key's entity). `mode` is online or offline."""

    project: str | None
    entity: str | None
    mode: str


def where(logging: LoggingConfig, environ: Mapping[str, str] = os.environ) -> Where:
    """The config's keys (`logging.wandb_project`, `logging.wandb_entity`,
    `logging.wandb_mode`) win; "" leaves it to W&B's variables (WANDB_PROJECT, WANDB_ENTITY,
    WANDB_MODE), then to W&B's defaults (online)."""
    project = logging.wandb_project or environ.get("WANDB_PROJECT") or None
    entity = logging.wandb_entity or environ.get("WANDB_ENTITY") or None
    mode = logging.wandb_mode or environ.get("WANDB_MODE") or "online"
    return Where(project, entity, "offline" if mode in ("offline", "dryrun") else "online")


@dataclass(frozen=True)
class Target:
    """The W&B run a job opens: at `place`, the one `continues` names (summary.json's `wandb`
    before this job), else a new one called `name`."""

    place: Where
    name: str
    continues: Wandb


def require_wandb() -> None:
    """Raises UserError (exit code 2) in one line when wandb is not installed."""
    if importlib.util.find_spec("wandb") is None:
        raise UserError(
            "logging.wandb is true, but wandb is not installed here: pip install "
            "'hvd_train[wandb]' (or HVD_TRAIN_WANDB=1 scripts/install.sh), or set "
            "logging.wandb: false"
        )


def check_reachable(place: Where, environ: Mapping[str, str] = os.environ) -> None:
    """Raises UserError (exit code 2) in one line unless wandb is installed and, online, the W&B
    server answers (any HTTP answer counts). Offline needs no network.

    Before any worker trains: a run whose tracker cannot be reached at its start would train
    without the record the user asked for.
    """
    require_wandb()
    if place.mode == "offline":
        return
    url = environ.get("WANDB_BASE_URL") or DEFAULT_BASE_URL
    try:
        with urllib.request.urlopen(url, timeout=REACH_TIMEOUT_S):
            pass
    except urllib.error.HTTPError:
        return  # it answered
    except Exception as e:
        why = e.reason if isinstance(e, urllib.error.URLError) else e  # not "<urlopen error"
        raise UserError(
            f"logging.wandb: cannot reach W&B at {shown(url)} ({cause(why)}): point "
            "WANDB_BASE_URL at a server that answers, set logging.wandb_mode: offline (and "
            "`wandb sync` later), or set logging.wandb: false"
        ) from None


def exit_code(summary: Mapping[str, Any]) -> int:
    """The exit code the W&B run ends with, from the record's ending: 0 for completed, 128 +
    the signal for a stop (143 for SIGTERM), else 1 (failed)."""
    status = summary.get("status")
    if status == "completed":
        return 0
    if status == "interrupted":
        name = summary.get("stopped_by") or summary.get("stop_signal") or "SIGTERM"
        return 128 + (signal.Signals[name].value if name in signal.Signals.__members__ else 15)
    return 1


class WandbRun(Losable):
    """Rank 0's W&B run while it trains.

    Every call goes through `call`: a failure loses the run for this job, said once (`say`) and
    kept in `fields` (passed to `on_change`: rank 0 puts it in summary.json); nothing is sent
    after. The W&B run ends once (`end`), with the record's ending.

    Args:
        run: wandb's Run, or None when none could be started.
        place: where it goes.
        say: prints one line on rank 0's console.
        on_change: called with `fields()` when the run is lost.
        earlier: summary.json's `wandb` before this job: its run, kept when none starts.
    """

    def __init__(
        self,
        run: Any,
        place: Where,
        say: Callable[[str], None],
        on_change: Callable[[Wandb], None] = lambda _: None,
        earlier: Wandb | None = None,
    ):
        self.run, self.place, self.earlier = run, place, dict(earlier or {})
        self._say, self._on_change = say, on_change
        self.lost: str | None = None
        self.ended = False

    def fields(self) -> Wandb:
        """summary.json's `wandb`: the run, where it is kept, and what went wrong in this job."""
        found: Wandb = {k: v for k, v in self.earlier.items() if k != "lost"}
        found["mode"] = self.place.mode
        if self.run is not None:
            found.update(run_id=self.run.id, project=self.run.project or "",
                         entity=self.run.entity or "",
                         dir=os.path.dirname(self.run.dir))  # the run's, not its files/  # fmt: skip
        if self.lost:
            found["lost"] = self.lost
        return found

    def log_epoch(self, epoch: int, values: Mapping[str, float]) -> None:
        """One epoch's values (`epoch`: 1-based, the x-axis of every chart); W&B's service
        sends them, the step never waits."""
        if self.run is not None:
            self.call(f"at epoch {epoch}", self.run.log, {**values, "epoch": epoch})

    def lose(self, why: str) -> None:
        """W&B failed: said once, noted in `fields`; nothing is sent after."""
        if self.lost is not None:
            return
        self.lost = why
        self._say(
            f"warning: W&B ({self.place.mode}) failed ({why}); training goes on without it: "
            f"{SUMMARY}'s wandb.lost says where, and what W&B wrote stays under WANDB_DIR "
            "for `wandb sync`"
        )
        self._on_change(self.fields())

    def end(self, code: int) -> bool:
        """Ends the W&B run with `code` (0: finished; else failed), once, within
        FINISH_TIMEOUT_S. Returns whether W&B took it."""
        if self.ended or self.run is None:
            return False
        self.ended = True
        if self.lost is not None:  # its service may be gone: end what it has, unwaited
            finish_quietly(self.run, code)
            return False
        self.call("at the run's end", self.run.finish, exit_code=code)
        return self.lost is None


def finish_quietly(run: Any, code: int) -> None:
    try:
        run.finish(exit_code=code)
    except Exception:
        pass


def start(
    target: Target,
    config: Mapping[str, Any],
    say: Callable[[str], None],
    on_change: Callable[[Wandb], None] = lambda _: None,
) -> WandbRun:
    """Rank 0 opens the run's W&B run (`target`): the one it continues (resumed), or a new one,
    with `config`. A failure does not stop the run: the WandbRun is then lost (it says so)."""
    place, continues = target.place, target.continues
    import logging

    import wandb

    logging.getLogger("wandb").setLevel(logging.ERROR)
    settings = wandb.Settings(
        mode=place.mode,
        silent=True,  # rank 0's console is hvd_train's: W&B's banner and links stay off it
        console="off",  # the rank's output has its own log in run.dir (base/logs.py)
        init_timeout=INIT_TIMEOUT_S,
        finish_timeout=FINISH_TIMEOUT_S,
        finish_timeout_raises=True,
        x_disable_stats=True,  # no system-metrics sampler beside the training
        save_code=False,
    )
    run_id = continues.get("run_id") or None
    tracked = WandbRun(None, place, say, on_change, continues)
    run = tracked.call(
        "at the run's start", wandb.init,
        project=place.project, entity=place.entity, name=target.name, id=run_id,
        resume="allow" if run_id else None, config=dict(config), allow_val_change=True,
        settings=settings, reinit="create_new",
    )  # fmt: skip
    tracked.run = run
    if run is not None:
        # Every chart's x-axis: the epoch (1-based), not W&B's own count of log calls, so that
        # a job that trains an epoch again after a failure draws it where it belongs.
        tracked.call("at the run's start", run.define_metric, "epoch")
        tracked.call("at the run's start", run.define_metric, "*", step_metric="epoch")
    return tracked
