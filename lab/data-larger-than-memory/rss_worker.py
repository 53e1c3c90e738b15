"""Runs `python -m hvd_train ARGS...` and, at exit, writes this process's peak RSS.

For lab/data-larger-than-memory/data_memory.py: `horovodrun ... python lab/data-larger-than-memory/rss_worker.py --config ...`.
Writes `$RSS_OUT/rss-rank{HOROVOD_RANK}.txt` with `ru_maxrss` (KiB on Linux: the high-water
mark of the resident set, VmHWM in /proc/PID/status).
"""

import atexit
import os
import resource
import runpy
import sys


def _write_peak() -> None:
    rank = os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with open(os.path.join(os.environ["RSS_OUT"], f"rss-rank{rank}.txt"), "w") as f:
        f.write(f"{peak}\n")


atexit.register(_write_peak)
sys.argv = ["hvd_train", *sys.argv[1:]]
runpy.run_module("hvd_train", run_name="__main__", alter_sys=True)
