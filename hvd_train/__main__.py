"""`python -m hvd_train --config FILE [--set key=value ...]`: see hvd_train.cli."""

from hvd_train.cli import run

run(prog="python -m hvd_train")
