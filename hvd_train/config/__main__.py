"""`python -m hvd_train.config ...`: `hvd-train config ...` (launch scripts, docs/launching.md)."""

import sys

from hvd_train.commands.config import main

sys.exit(main(prog="python -m hvd_train.config"))
