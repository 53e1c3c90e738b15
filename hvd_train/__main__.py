"""`python -m hvd_train --config FILE [--set key=value ...]`: see hvd_train.cli."""

import sys

from hvd_train.cli import main

sys.exit(main(prog="python -m hvd_train"))
