"""Trains like `python -m hvd_train CONFIG_ARGS...`, each checkpoint write held open for 2 s
after its files are written and before they are renamed into place (a slow disk), with the
file named by SLOW_CHECKPOINT_MARKER created when the first such write begins: a test can
then stop the job in the middle of a checkpoint.

Usage: slow_checkpoint.py --config FILE [--set KEY=VALUE ...]
"""

import os
import pathlib
import sys
import time

from hvd_train import checkpoint, cli

SLOW_S = 2.0
fsync_dir = checkpoint._fsync_dir


def slow_fsync_dir(path: str) -> None:
    if os.path.basename(path).startswith(".tmp-ckpt-"):
        pathlib.Path(os.environ["SLOW_CHECKPOINT_MARKER"]).touch()
        time.sleep(SLOW_S)
    fsync_dir(path)


checkpoint._fsync_dir = slow_fsync_dir
sys.exit(cli.main(sys.argv[1:]))
