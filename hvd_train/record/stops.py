"""Stops in a worker: SIGTERM, SIGINT and SIGUSR1 recorded, not obeyed at once, from the
process's first moments: before TensorFlow loads (the command line installs them right after
reading the config), through start-up, to the end of the run. RunControl
(train/callbacks/stop.py) turns what each worker saw into one decision that all of them act on
at the same step.

Standard library only: installed before TensorFlow and Horovod load.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING

from hvd_train.base import logs
from hvd_train.base.errors import ANOTHER_FIRST, exit_description
from hvd_train.record.run_record import end_before_start
from hvd_train.record.summary import Summary

if TYPE_CHECKING:
    from hvd_train.config import Config, RunConfig

# A scheduler's warning that the job will be ended (Slurm's `--signal=B:USR1@120`, which
# launch/slurm.sbatch passes to `hvd-train launch`): a stop like SIGTERM, but nothing kills the
# workers seconds later, so rank 0 may take longer over its stop checkpoint.
WARNING_SIGNALS = (signal.SIGUSR1,)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, *WARNING_SIGNALS)
DEFAULT_GRACE_S = 3.5  # horovodrun's SIGKILL follows its SIGTERM after 5 s
WARNING_GRACE_S = 60.0  # well inside the template's 120 s between the warning and the end
_UNDER_MPI = "OMPI_COMM_WORLD_RANK" in os.environ
MPIRUN_KILL_WINDOW_S = 3.0
# Set by hvd-train launch's supervisor (supervise.py) for MPI workers, to which it passes stops
# itself: without it, a signal in an MPI worker's start-up is mpirun ending the job.
SUPERVISED = "HVD_TRAIN_SUPERVISED"
# The file where that supervisor notes each stop before it passes the stop on (one signal name a
# line). A SIGTERM that it did not note is mpirun ending the job: mpirun sends SIGCONT first, but
# a SIGCONT that comes before the worker hears signals is lost, and the SIGTERM after it must
# still not read as a stop (issue: a rank killed at start-up recorded `interrupted`).
STOP_NOTE = "HVD_TRAIN_STOP_NOTE"
FIRST_FAILURE_WAIT_S = 3.0  # horovodrun notes a failure within milliseconds of the exit
MPIRUN_KILLED = (
    "mpirun ended the job (SIGCONT, then SIGTERM, then SIGKILL): another worker, or its host, "
    "failed first (mpirun's output names it), or mpirun itself was stopped (to stop an MPI job "
    "with a stop checkpoint, stop hvd-train launch or launch/*.sh instead)"
)


@dataclasses.dataclass(frozen=True)
class ForcedExit:
    """The stop watcher's ending of this process, as it asks for it to be recorded: the signal,
    why, whether a step ran in this process, and whether the launcher is ending the job after a
    failure elsewhere (`failed_rank` failed first, when the launcher said which) rather than
    stopping it."""

    signum: int
    reason: str
    ran: bool = False
    failed: bool = False
    failed_rank: int | None = None


class StopSignals:
    """Records SIGTERM/SIGINT/SIGUSR1 instead of dying, so training can stop at a step boundary.

    The main thread acts on a signal only between steps (RunControl agrees on it), but a step
    can run for seconds (the first, while TensorFlow traces and compiles), longer than a
    launcher waits: horovodrun sends SIGKILL 5 s after its SIGTERM. So a watcher thread learns
    of each signal at once, through Python's wakeup fd (written by the C-level handler even
    while the main thread is inside TensorFlow), and ends the process itself, after `record_exit`
    has recorded the stop, when waiting would save nothing (no step has run in this process:
    the newest checkpoint already holds everything) or, on rank 0, when the stop has not
    finished within `grace_s`. A second signal of either kind ends the process at once,
    recorded the same way: a user who presses Ctrl-C twice gets the usual immediate stop.
    """

    def __init__(self, grace_s: float | None = None) -> None:
        self.signum = 0
        self.steps_run = 0  # steps completed in this process (RunControl counts them)
        self.grace_s = stop_grace_s() if grace_s is None else grace_s
        self._record_exit: Callable[[ForcedExit], None] = lambda forced: None
        self._on_signal: Callable[[int], None] = lambda signum: None
        self.chief = True  # rank 0: only it waits out the grace (the others follow it)
        self.done = threading.Event()  # set when the run has written its own ending
        self.before_exit: list[Callable[[], None]] = []  # e.g. give run.dir back
        self._previous: dict[int, object] = {}
        self._wakeup: tuple[int, int] | None = None
        self._old_wakeup = -1

    def recorded_by(
        self,
        record_exit: Callable[[ForcedExit], None],
        on_signal: Callable[[int], None] | None = None,
    ) -> None:
        """Who records a stop from now on, as the run hands it on once: start-up's record
        (`installed`), then the trainer's run (`Run.end`, its record once it exists).

        `record_exit(forced)` records the ending (`ForcedExit`) before the watcher ends the
        process. `on_signal(signum)`, when given, notes each stop signal as it comes.
        """
        self._record_exit = record_exit
        if on_signal is not None:
            self._on_signal = on_signal

    def install(self) -> None:
        """The watcher first, the handlers last: a launcher sends its signal the moment this
        process is seen to catch it (SigCgt), and the watcher must be there to act on it."""
        if threading.current_thread() is not threading.main_thread():
            return  # signals reach only the main thread: a caller's thread trains unguarded
        r, w = os.pipe()
        os.set_blocking(w, False)
        self._wakeup = (r, w)
        self._old_wakeup = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(r,), name="hvd_train-stop", daemon=True).start()
        for sig in (*STOP_SIGNALS, signal.SIGCONT):
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._old_wakeup)
            os.close(self._wakeup[1])  # the watcher reads EOF and ends
            self._wakeup = None

    def _handle(self, signum: int, frame: object) -> None:
        if signum != signal.SIGCONT and not mpirun_ending(signum):
            self.signum = self.signum or signum  # the main thread's view; the watcher acts

    def _watch(self, fd: int) -> None:
        seen, continued = 0, -1e9
        while True:
            try:
                data = os.read(fd, 1)
            except OSError:
                return
            if not data:
                os.close(fd)
                return
            if data[0] == signal.SIGCONT:
                continued = time.monotonic()
                continue
            if data[0] not in STOP_SIGNALS:
                continue
            mpirun_kill = _UNDER_MPI and time.monotonic() - continued < MPIRUN_KILL_WINDOW_S
            if mpirun_kill or mpirun_ending(data[0]):
                # mpirun ending the job: SIGCONT, SIGTERM 1 s later, SIGKILL 1 s after that.
                # Another worker failed (or mpirun itself was told to stop): no time to save.
                self._exit(data[0], MPIRUN_KILLED, failed=True)
            seen += 1
            if seen == 1:
                threading.Thread(target=self._first, args=(data[0],), daemon=True).start()
            else:
                self._exit(data[0], "a second signal: stopped at once, no stop checkpoint")

    def _first(self, signum: int) -> None:
        self.signum = self.signum or signum
        self._on_signal(signum)
        first = horovodrun_first_failure() if signum == signal.SIGTERM else None
        if first is not None:  # not a stop: horovodrun is ending the job after a failure
            self._exit(signum, _failed_first(first), failed=True, failed_rank=first["rank"])
        if self.steps_run == 0:
            self._exit(signum, "before any step ran: nothing to save")
        if not self.chief:
            return  # rank 0 decides; when it ends, this worker's next collective fails
        warning = signum in WARNING_SIGNALS
        grace_s = max(self.grace_s, WARNING_GRACE_S) if warning else self.grace_s
        why = "after a scheduler's warning" if warning else "the launcher's grace before SIGKILL"
        if not self.done.wait(grace_s):
            self._exit(
                signum,
                f"its stop did not finish within {grace_s:g} s ({why}): no stop checkpoint",
            )

    def _exit(
        self, signum: int, reason: str, failed: bool = False, failed_rank: int | None = None
    ) -> None:
        if self.done.is_set():
            return  # the run wrote its own ending meanwhile: let it exit as it does
        try:
            self._record_exit(ForcedExit(signum, reason, self.steps_run > 0, failed, failed_rank))
            for release in self.before_exit:
                release()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(128 + signum)


def mpirun_ending(signum: int) -> bool:
    """Whether `signum`, received by an MPI worker of hvd-train launch's supervisor, is mpirun
    ending the job rather than a stop: a SIGTERM the supervisor did not note (`STOP_NOTE`).

    mpirun alone sends an MPI worker SIGTERM only to end the job, after a worker failed or when
    it was itself told to stop (where the launcher was too: it then records the stop itself).
    """
    note = os.environ.get(STOP_NOTE) if _UNDER_MPI and os.environ.get(SUPERVISED) else None
    return bool(note) and signum == signal.SIGTERM and "SIGTERM" not in noted_stops(note)


def noted_stops(path: str) -> list[str]:
    """The signal names the supervisor noted in `path` before passing each stop on."""
    try:
        with open(path) as f:
            return f.read().split()
    except OSError:
        return []


def horovodrun_first_failure() -> dict | None:
    """The worker that failed first, as horovodrun (Gloo) noted it in its rendezvous server
    before it sent the others SIGTERM ({"rank", "exit_code"}; patches/horovod-0.28.1/0006);
    None when there is no such note: a stop, another launcher, or an unpatched Horovod."""
    if not _noted_by_horovodrun():
        return None
    addr = os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"]
    port = os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy
    # horovodrun answers within milliseconds, but a loaded host can make the first try time
    # out: only its answer (the note, or 404 for none) decides, so a failed ask is asked again.
    deadline = time.monotonic() + FIRST_FAILURE_WAIT_S
    while True:
        try:
            with opener.open(f"http://{addr}:{port}/hvd_train/first_failure", timeout=1) as r:
                found = json.loads(r.read())
            break
        except urllib.error.HTTPError:  # 404: no failure noted
            return None
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)
    ok = isinstance(found, dict) and all(
        isinstance(found.get(k), int) for k in ("rank", "exit_code")
    )
    return found if ok else None


def first_failure_awaited(wait_s: float = FIRST_FAILURE_WAIT_S) -> dict | None:
    """horovodrun_first_failure, waited for: a collective's error reaches rank 0 the moment
    another worker dies, a moment before horovodrun has noted that worker's exit. mpirun notes
    nothing, but ends the job as soon as a worker dies (SIGCONT, SIGTERM a second later): the
    wait lets it, and the stop watcher then records that mpirun ended the job and ends this
    process, as when rank 0 waited inside an MPI collective; None if it has not."""
    if _UNDER_MPI:
        time.sleep(wait_s)
        return None
    deadline = time.monotonic() + wait_s
    while _noted_by_horovodrun():
        if (first := horovodrun_first_failure()) is not None or time.monotonic() > deadline:
            return first
        time.sleep(0.05)
    return None


def _noted_by_horovodrun() -> bool:
    """Whether horovodrun (Gloo, not elastic) started this worker: it notes a failure."""
    env = os.environ
    return bool(
        env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
        and env.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
        and env.get("HOROVOD_ELASTIC") != "1"
    )


def failed_first(first: dict) -> str:
    """`another worker ended first: rank R (exit code C, killed by S)`."""
    return f"{ANOTHER_FIRST}: rank {first['rank']} ({exit_description(first['exit_code'])})"


def _failed_first(first: dict) -> str:
    return f"{failed_first(first)}; horovodrun then ended the job"


def stop_grace_s() -> float:
    """How long rank 0 may take to stop after a signal before it ends without a checkpoint.

    horovodrun kills a worker 5 s after SIGTERM; this leaves room to record the stop. A
    launcher that waits longer (hvd-train launch under MPI, which signals the workers itself)
    says so in HVD_TRAIN_STOP_GRACE_S.
    """
    try:
        return max(0.0, float(os.environ.get("HVD_TRAIN_STOP_GRACE_S", DEFAULT_GRACE_S)))
    except ValueError:
        return DEFAULT_GRACE_S


def installed(cfg: Config) -> StopSignals:
    """The process's stop handling, installed now and ready for a stop before the record: until
    rank 0 starts summary.json (RunRecord), a stop or a failure elsewhere is recorded by
    `end_in_start_up`. The trainer hands the recording on once it runs."""
    signals = StopSignals()
    # Who records, before any signal is heard: a stop at the first moment is written too.
    signals.recorded_by(functools.partial(end_in_start_up, cfg.run, cfg.train.epochs))
    signals.install()
    return signals


def end_in_start_up(run: RunConfig, epochs: int, forced: ForcedExit) -> None:
    """Rank 0 stopped, or ended after another worker failed, before its record existed (in
    TensorFlow's import, Horovod's start, the data's preparation): it writes the ending itself,
    as the run would have (run_record.end_before_start). The trainer's `Run.end` takes over
    once it runs (train/run/failure.py record_forced_exit), and calls this before the record.
    Under `hvd-train launch` the launcher adds what it knows; under raw horovodrun nobody else
    could."""
    if logs.launcher_rank() not in (None, 0):
        return
    name = signal.Signals(forced.signum).name
    if _UNDER_MPI and not os.environ.get(SUPERVISED):
        # mpirun alone sends no stop but its end of the job (SIGCONT, SIGTERM, SIGKILL), and a
        # SIGCONT may have come before this process heard signals: never a stop here.
        forced = dataclasses.replace(forced, failed=True, reason=MPIRUN_KILLED)
    if forced.failed:
        ending: Summary = {"status": "failed", "error": forced.reason}
        if forced.failed_rank is not None:
            ending["failed_rank"] = forced.failed_rank
    else:
        ending = {"status": "interrupted", "stopped_by": name, "stop_detail": forced.reason}
    said = end_before_start(run.dir, run.overwrite, logs.launcher_size(), epochs, ending)
    if forced.failed:
        logs.failed(f"{forced.reason}; {said}")
    else:
        logs.say(f"hvd_train: stopped by {name} during start-up ({forced.reason}); {said}")
