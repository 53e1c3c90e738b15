"""Logs, as each Python process of a venv exits, one JSON line: its command, whether it had
imported TensorFlow, its CPU seconds (user + sys, its threads included) and the test that started
it. Python imports this module at start-up from site-packages; it does nothing unless
HVD_TRAIN_CENSUS names the file to append to.

A process ended by SIGKILL logs nothing. One that ends through `os._exit` after running its
`atexit` handlers (hvd_train's worker does) would reach both hooks: it logs once.
"""

import atexit
import json
import os
import resource
import sys
import time

_FILE = os.environ.get("HVD_TRAIN_CENSUS")
_STARTED = time.time()
_logged = []


def _log() -> None:
    if _logged or not _FILE:
        return
    _logged.append(True)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    line = {
        "pid": os.getpid(),
        "argv": sys.argv[:6],
        "tensorflow": "tensorflow" in sys.modules,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "wall_s": time.time() - _STARTED,
        "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
    }
    try:
        with open(_FILE, "a") as f:  # one short write: lines of processes do not interleave
            f.write(json.dumps(line) + "\n")
    except OSError:
        pass


if _FILE:
    atexit.register(_log)
    _exit = os._exit

    def _logged_exit(code: int) -> None:
        _log()
        _exit(code)

    os._exit = _logged_exit
