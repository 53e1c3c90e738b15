"""Runs `hvd-train ARGS` alone, as a user starts a command (or horovodrun a worker), and prints
`AT_IMPORT <json>`: what the process holds at the moment `tensorflow` is first imported (the
variables TensorFlow, XLA and CUDA read then, once; the SIGTERM handler; whether stderr is
caught; the collector; the start-up marks). Then it ends the process: what comes after the
import is not this check's.
"""

import gc
import importlib.abc
import json
import os
import signal
import sys

from hvd_train.base import startup

_CONSOLE = os.fstat(2)


class _WatchTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "tensorflow":
            now = os.fstat(2)
            state = {
                variable: os.environ.get(variable)
                for variable in ("TF_USE_LEGACY_KERAS", "CUDA_VISIBLE_DEVICES", "TF_XLA_FLAGS")
            }
            state["sigterm_handled"] = signal.getsignal(signal.SIGTERM) != signal.SIG_DFL
            state["stderr_caught"] = (now.st_dev, now.st_ino) != (_CONSOLE.st_dev, _CONSOLE.st_ino)
            state["collector_on"] = gc.isenabled()
            state["marks"] = list(startup.phases())
            print(f"AT_IMPORT {json.dumps(state)}", flush=True)
            os._exit(0)
        return None  # any other import goes on as usual


sys.meta_path.insert(0, _WatchTensorFlow())
from hvd_train import cli

code = cli.main(sys.argv[1:])
print(f"NEVER_IMPORTED CODE {code}", flush=True)
