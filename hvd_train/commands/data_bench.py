"""`hvd-train data-bench`: the input pipeline alone, in examples/s, beside what the model consumes."""

from __future__ import annotations

from hvd_train.base import logs
from hvd_train.commands.train import before_tensorflow, parser
from hvd_train.config import load_config
from hvd_train.record.layout import RunDir
from hvd_train.runtime.keras import binding


def main(argv: list[str], prog: str) -> int:
    p = parser(prog, docs="docs/data.md")
    p.description = (
        "Measure the input pipeline alone (examples/s per worker) beside the rate the model "
        "consumes. Run it under horovodrun with the job's worker count."
    )
    p.add_argument("--batches", type=int, default=50, help="batches timed (default 50)")
    args = p.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    binding.prepare(cfg.runtime.keras)  # before TensorFlow loads: what tf.keras means
    before_tensorflow(cfg.runtime)
    logs.quiet_tensorflow(RunDir(cfg.run.dir).started_run_logs(), "hvd-train data-bench")
    binding.import_tensorflow()  # matplotlib deferred, the collector paused
    from hvd_train.runtime import xla

    # Before Horovod's library loads: its XLA all-reduce is registered then or never.
    xla.prepare(cfg.runtime.jit_compile)
    from hvd_train.train.inference.data_bench import data_bench

    data_bench(cfg, max(1, args.batches))
    return 0
