"""Which network NCCL's all-reduce took between hosts, read from NCCL's own log.

NCCL picks its transport between hosts at its first collective: InfiniBand or RoCE (`IB`) where
it finds an adapter and libibverbs, else TCP sockets (`Socket`), or a plugin's (`IBext`,
`AWS Libfabric`), and says which only at NCCL_DEBUG=INFO, in one line per rank:

    node1:4113:4180 [0] NCCL INFO Using network IB

Over sockets a job between hosts runs, its all-reduce several times slower, without a word.
A GPU worker therefore has NCCL write its INFO lines of start-up and network (`NCCL_DEBUG_SUBSYS
INIT,NET`, a few dozen lines) to a file of its own (`route`), and the run records the network
found there (`network`). The file is in the temporary folder, not the run's logs: collectives
that reach NCCL (the run folder's claim) come before the run folder is this job's; it goes when
the process ends. A user's own NCCL_DEBUG is left as it is: NCCL then writes where the user
asked, and the run records no network.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import tempfile
from collections.abc import MutableMapping

_NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$")


def path() -> str:
    """This process's NCCL log (`route`): hvd_train-nccl-PID.log in the temporary folder."""
    return os.path.join(tempfile.gettempdir(), f"hvd_train-nccl-{os.getpid()}.log")


def route(environ: MutableMapping[str, str]) -> bool:
    """Sends NCCL's INFO lines of start-up and network to `path()`, unless the user set
    NCCL_DEBUG; returns whether it did. Before NCCL's first call in this process: NCCL reads
    its variables once, at its first call (Horovod makes it at the first collective on a GPU).
    """
    if "NCCL_DEBUG" in environ:
        return False
    log = path()
    environ["NCCL_DEBUG"] = "INFO"
    environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")
    # NCCL expands %h (host) and %p (pid) in the name and reads %% as one %.
    environ["NCCL_DEBUG_FILE"] = log.replace("%", "%%")
    atexit.register(_remove, log)
    return True


def _remove(log: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(log)


def network(log: str) -> str | None:
    """The network NCCL's log at `log` says it used (`IB`, `Socket`, a plugin's name); None
    where it says none: no NCCL collective ran (a CPU worker, no step), or no log."""
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            found = [m.group(1) for line in f if (m := _NETWORK.search(line))]
    except OSError:
        return None
    return found[-1] if found else None


def sockets_warning(name: str | None, hosts: int) -> str | None:
    """The one line for a job across `hosts` hosts whose NCCL used TCP sockets; None else."""
    if name != "Socket" or hosts < 2:
        return None
    return (
        f"warning: NCCL sent the all-reduce between the {hosts} hosts over TCP sockets, "
        "several times slower than InfiniBand or RoCE: it found no adapter it could use "
        "(docs/launching.md#gpus-across-hosts)"
    )
