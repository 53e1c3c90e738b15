"""`hvd-train data-bench`: the input pipeline alone, in examples/s, beside what the model consumes."""

from __future__ import annotations

from hvd_train.commands.environment import Role, setup_environment
from hvd_train.commands.train import parser
from hvd_train.config import load_config


def main(argv: list[str], prog: str) -> int:
    p = parser(prog, docs="docs/data.md")
    p.description = (
        "Measure the input pipeline alone (examples/s per worker) beside the rate the model "
        "consumes. Run it under horovodrun with the job's worker count."
    )
    p.add_argument("--batches", type=int, default=50, help="batches timed (default 50)")
    args = p.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    # The training step timed as training runs it: a worker's device and XLA.
    setup_environment(cfg, command="hvd-train data-bench", role=Role.TIMED_WORKER)
    from hvd_train.train.inference.data_bench import data_bench

    data_bench(cfg, max(1, args.batches))
    return 0
