"""`hvd-train data-bench`: the input pipeline alone, in examples/s, beside what the model consumes."""

from __future__ import annotations

from hvd_train.commands.train import parser


def main(argv: list[str], prog: str) -> int:
    p = parser(prog, docs="docs/data.md")
    p.description = (
        "Measure the input pipeline alone (examples/s per worker) beside the rate the model "
        "consumes. Run it under horovodrun with the job's worker count."
    )
    p.add_argument("--batches", type=int, default=50, help="batches timed (default 50)")
    args = p.parse_args(argv)
    from hvd_train.config import load_config

    cfg = load_config(args.config, args.overrides)
    from hvd_train.train.data_bench import data_bench

    data_bench(cfg, max(1, args.batches))
    return 0
