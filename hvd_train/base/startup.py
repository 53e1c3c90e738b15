"""Where a worker's start-up goes: wall-clock marks from the creation of its process to the end of
its first training step, recorded in summary.json as `startup_s` (rank 0's).

Every job pays this before it trains, and a sweep pays it at every point, a restart at every
failure; `benchmarks/startup.py` reads it to split a launch's time into its phases. Under
`hvd-train launch`, `startup_s.process` is the time from the launch (the command's own start, or
a restart's) to this worker's process: horovodrun's start and its rendezvous server.
"""

from __future__ import annotations

import os
import time

LAUNCHED_AT = "HVD_TRAIN_LAUNCHED_AT"  # set by `hvd-train launch`: when the launch began
_marks: dict[str, float] = {}  # phase -> wall-clock time (time.time) at its end


def process_created() -> float:
    """Wall-clock time this process was created: now, less its age from /proc (10 ms ticks).

    From the uptime and the process's start tick rather than /proc/stat's boot time, which is
    whole seconds. Where /proc is missing, the time this module was imported.
    """
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _IMPORTED
    return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


_IMPORTED = time.time()


def mark(phase: str) -> None:
    """Notes that `phase` ended now (the first time only: a later call changes nothing)."""
    _marks.setdefault(phase, time.time())


def phases() -> dict[str, float]:
    """Seconds from the process's creation to the end of each phase marked so far, in order;
    under `hvd-train launch`, first `process`: from the launch to the process's creation."""
    created = process_created()
    launched: dict[str, float] = {}
    try:
        launched["process"] = round(created - float(os.environ[LAUNCHED_AT]), 3)
    except (KeyError, ValueError):
        pass
    return {**launched, **{phase: round(at - created, 3) for phase, at in _marks.items()}}
