"""Runs a job's launcher (horovodrun, mpirun); passes SIGTERM/SIGINT/SIGUSR1 to its workers.

    python -m hvd_train.launcher.supervise -- horovodrun -np 2 ... python -m hvd_train --config FILE

Under Gloo, horovodrun passes a SIGTERM or SIGINT on to its workers, which stop after an
agreed step with a checkpoint (it kills them 5 s later). Under MPI nothing does:
`horovodrun --mpi` becomes `/bin/sh -c "mpirun ..."`, which a SIGTERM kills while mpirun and
the workers run on, and mpirun, given a SIGTERM, kills its workers 1 s after passing it on
(Open MPI's odls_base_sigkill_timeout). So under MPI the supervisor sends the signal straight
to the workers on this host and waits: they agree on the stop with the workers elsewhere (one
all-reduce), write the stop checkpoint, and end; mpirun then ends the job. Where no worker
runs on this host (a launcher pod), the signal goes to mpirun.

SIGUSR1 (a scheduler's warning: Slurm's `--signal=B:USR1@120`) is a stop too, but horovodrun
does not pass it on (it would end horovodrun): it goes straight to the workers on this host,
under Gloo as under MPI, and the others follow them at the next agreed step. Where no worker
runs on this host, horovodrun gets SIGTERM instead, the stop it passes on.

The job runs in a session of its own, so a terminal's Ctrl-C reaches it only through here.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import psutil

from hvd_train.launcher.horovodrun import job_env
from hvd_train.record.stops import STOP_NOTE, STOP_SIGNALS, SUPERVISED, WARNING_SIGNALS

RANK_VARIABLES = (b"OMPI_COMM_WORLD_RANK=", b"HOROVOD_RANK=", b"PMI_RANK=")
# Under MPI the workers are signalled directly and nothing kills them after a few seconds:
# rank 0 may take this long to finish its stop checkpoint (see stops.StopSignals).
MPI_STOP_GRACE_S = 120


def is_mpi(cmd: list[str]) -> bool:
    """Whether `cmd` starts its workers through MPI (horovodrun --mpi, or mpirun itself)."""
    return os.path.basename(cmd[0]) in ("mpirun", "mpiexec") or "--mpi" in cmd


class Supervisor:
    """Runs one job at a time; `stop_signal` is the first SIGTERM/SIGINT/SIGUSR1 it passed on."""

    def __init__(self) -> None:
        self.stop_signal = 0
        self._proc: subprocess.Popen | None = None
        self._mpi = False
        self._note: str | None = None  # where MPI workers read the stops passed on (STOP_NOTE)
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)

    def run(
        self,
        cmd: list[str],
        echo: bool = True,
        env: dict[str, str] | None = None,
        tidy: Callable[[], Callable[[str], str | None]] | None = None,
    ) -> tuple[int, str]:
        """Runs `cmd`, its output echoed as it comes; returns its exit code and output's tail.

        Args:
            env: the environment; defaults to this process's.
            tidy: makes, for each of the two streams, a function that gives the echo of a line
                (None: not echoed). The tail keeps every line as it came. Defaults to None
                (lines echoed as they are).
        """
        self._mpi = is_mpi(cmd)
        env = dict(os.environ if env is None else env)
        notes = tempfile.mkdtemp(prefix="hvd_train-stops-") if self._mpi else None
        self._note = os.path.join(notes, "stops") if notes else None
        if self._mpi:
            env.setdefault("HVD_TRAIN_STOP_GRACE_S", str(MPI_STOP_GRACE_S))
            # A SIGTERM from here, in start-up too, is a stop; one that is not noted here first is
            # mpirun ending the job after a failure (stops.mpirun_ending).
            env[SUPERVISED] = "1"
            env[STOP_NOTE] = self._note
        try:
            return self._run(cmd, env, echo, tidy)
        finally:
            if notes:
                shutil.rmtree(notes, ignore_errors=True)

    def _run(
        self,
        cmd: list[str],
        env: dict[str, str],
        echo: bool,
        tidy: Callable[[], Callable[[str], str | None]] | None,
    ) -> tuple[int, str]:
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        self._proc = proc
        if self.stop_signal:  # a stop that came while it started
            self._pass_on(self.stop_signal)
        tail: deque[str] = deque(maxlen=400)  # the failure report is at the end
        pumps = [
            threading.Thread(
                target=_pump, args=(src, dst, tail, echo, tidy() if tidy else None), daemon=True
            )
            for src, dst in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr))
        ]
        for t in pumps:
            t.start()
        code = proc.wait()
        for t in pumps:
            t.join()
        self._proc = None
        return code, "".join(tail)

    def _handle(self, signum: int, frame: object) -> None:
        first = not self.stop_signal
        self.stop_signal = self.stop_signal or signum
        if self._proc is not None:
            self._pass_on(signum if first else signal.SIGKILL)

    def _pass_on(self, signum: int) -> None:
        """To the workers on this host under MPI (else to mpirun); to horovodrun under Gloo,
        but SIGUSR1 to the workers here under either (else SIGTERM to horovodrun). A second
        signal kills the whole job at once."""
        proc = self._proc
        if signum == signal.SIGKILL:
            _kill_tree(proc.pid)
            return
        self._note_stop(signum)  # before the signal: a worker reads the note when it comes
        direct = self._mpi or signum in WARNING_SIGNALS
        targets = local_workers(proc.pid) if direct else []
        if not targets and not self._mpi and signum in WARNING_SIGNALS:
            signum = signal.SIGTERM  # horovodrun dies of SIGUSR1; it passes SIGTERM on
        for p in targets or [psutil.Process(proc.pid)]:
            try:
                p.send_signal(signum)
            except psutil.NoSuchProcess:
                pass

    def _note_stop(self, signum: int) -> None:
        """Notes the stop for the MPI workers, which tell it so from mpirun ending the job."""
        if self._note:
            with open(self._note, "a") as f:
                f.write(f"{signal.Signals(signum).name}\n")


def local_workers(pid: int) -> list[psutil.Process]:
    """The job's worker processes on this host: descendants of `pid` that carry a rank."""
    return [child for child, _ in _ranked_descendants(pid)]


def local_ranks(pid: int) -> dict[int, int]:
    """{rank: pid} of the job's workers on this host (descendants of `pid`); of a worker and a
    child that inherited its rank, the worker."""
    found: dict[int, int] = {}
    for child, rank in _ranked_descendants(pid):
        found.setdefault(rank, child.pid)  # parents come before their children
    return found


def _ranked_descendants(pid: int) -> list[tuple[psutil.Process, int]]:
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = []
    for child in children:
        try:
            with open(f"/proc/{child.pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        rank = next((item.split(b"=", 1)[1] for item in environ
                     if item.startswith(RANK_VARIABLES)), None)  # fmt: skip
        if rank is not None and rank.isdigit():
            found.append((child, int(rank)))
    return found


def _kill_tree(pid: int) -> None:
    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def _pump(
    src: Any, dst: Any, tail: deque[str], echo: bool, tidy: Callable[[str], str | None] | None
) -> None:
    for line in src:
        shown = tidy(line) if tidy and echo else line
        if echo and shown is not None:
            dst.write(shown)
            dst.flush()
        tail.append(line)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m hvd_train.launcher.supervise -- COMMAND...", file=sys.stderr)
        return 2
    supervisor = Supervisor()
    code, _ = supervisor.run(argv, env=job_env())  # the environment every launcher gives a job
    return code


if __name__ == "__main__":
    sys.exit(main())
