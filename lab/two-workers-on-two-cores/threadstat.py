"""Per-thread CPU accounting of this process from /proc (Linux): what each thread ran, how long
it waited for a core while runnable, and on which cores it may and did run.

/proc/self/task/TID/schedstat holds (ns on a CPU, ns waiting on a run queue, time slices); a
thread that is runnable but not running (another thread holds its core) accumulates wait. So
between two snapshots: on-CPU time shows who did the work, run-queue wait shows contention for
cores, and the rest of the wall time is sleep (waiting for data, a lock, or the other worker).
"""

from __future__ import annotations

import os
import time

TASKS = "/proc/self/task"


def threads() -> set[int]:
    return {int(t) for t in os.listdir(TASKS)}


def cores() -> dict[int, tuple[int, int, int]]:
    """{core: (busy, idle, irq) clock ticks} from /proc/stat; irq counts hard and soft
    interrupts (with IRQ time accounting they are charged to no thread: loopback TCP's receive
    work is softirq time)."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                name, *v = line.split()
                ticks = [int(x) for x in v]
                idle = ticks[3] + ticks[4]  # idle + iowait
                out[int(name[3:])] = (sum(ticks[:8]) - idle, idle, ticks[5] + ticks[6])
    return out


def snapshot() -> dict:
    """{"t": wall seconds, "threads": {tid: (cpu_ns, wait_ns, slices, last_core)},
    "cores": {core: (busy, idle) ticks}}."""
    out = {}
    for tid in threads():
        try:
            with open(f"{TASKS}/{tid}/schedstat") as f:
                cpu, wait, slices = (int(v) for v in f.read().split())
            with open(f"{TASKS}/{tid}/stat") as f:
                last_core = int(f.read().rsplit(")", 1)[1].split()[36])  # field 39: processor
        except (OSError, ValueError, IndexError):
            continue  # the thread has just exited
        out[tid] = (cpu, wait, slices, last_core)
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime + stime: live and exited threads
    return {"t": time.perf_counter(), "threads": out, "cores": cores(), "process_ticks": ticks}


def diff(a: dict, b: dict, groups: dict[str, set[int]], steps: int) -> dict:
    """Per group of threads, per training step: ms on a CPU, ms waiting for a core, slices;
    plus each group's share of the wall time and the cores its threads last ran on."""
    wall = b["t"] - a["t"]
    pid = os.getpid()
    named = {tid for g in groups.values() for tid in g}
    report = {"wall_ms_per_step": 1000 * wall / steps}
    for name, members in {**groups, "main": {pid},
                          "other": set(b["threads"]) - named - {pid}}.items():  # fmt: skip
        cpu = wait = slices = 0
        cores: set[int] = set()
        for tid in members:
            if tid in b["threads"]:
                c0, w0, s0, _ = a["threads"].get(tid, (0, 0, 0, 0))
                c1, w1, s1, core = b["threads"][tid]
                cpu, wait, slices = cpu + c1 - c0, wait + w1 - w0, slices + s1 - s0
                if c1 > c0:
                    cores.add(core)
        report[name] = {
            "threads": len(members & set(b["threads"])),
            "cpu_ms_per_step": cpu / 1e6 / steps,
            "runqueue_wait_ms_per_step": wait / 1e6 / steps,
            "slices_per_step": slices / steps,
            "cpu_share_of_wall": cpu / 1e9 / wall if wall else 0.0,
            "last_cores": sorted(cores),
        }
    report["affinity"] = sorted(os.sched_getaffinity(0))
    # How busy this worker's cores were (by anything), and how much of that was this process:
    # a core idle while its worker waits means the worker waited for the other one.
    mine = report["affinity"]
    busy = sum(b["cores"][c][0] - a["cores"][c][0] for c in mine)
    idle = sum(b["cores"][c][1] - a["cores"][c][1] for c in mine)
    live = sum(g["cpu_ms_per_step"] for g in report.values() if isinstance(g, dict))
    hz = os.sysconf("SC_CLK_TCK")
    ours = 1000 * (b["process_ticks"] - a["process_ticks"]) / hz / steps  # ms per step
    # CPU of threads that ended inside the window (e.g. threads started per operation)
    report["exited_threads_cpu_ms_per_step"] = max(0.0, ours - live)
    irq = sum(b["cores"][c][2] - a["cores"][c][2] for c in mine)
    total = max(1, busy + idle)
    report["cores_idle_share"] = idle / total
    report["cores_irq_share"] = irq / total
    report["cores_busy_by_others_share"] = max(
        0.0, (busy - irq) / total - ours * steps / 1000 / wall / len(mine)
    )
    return report
