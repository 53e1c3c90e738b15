"""`hvd-train lr-plot`: the learning-rate schedule a run would follow, drawn without training."""

from __future__ import annotations

from hvd_train.base.errors import UserError
from hvd_train.commands.environment import setup_environment
from hvd_train.commands.train import parser
from hvd_train.config import Config


def main(argv: list[str], prog: str) -> int:
    p = parser(prog, docs="docs/models.md")
    p.description = "Draw the learning-rate schedule a run would follow, without training."
    p.add_argument("--workers", type=int, default=1, help="worker count (default 1)")
    p.add_argument(
        "--train-examples", type=int, default=None, metavar="N",
        help="training examples per epoch; needed for sources other than synthetic and digits",
    )  # fmt: skip
    p.add_argument("--out", default="lr_schedule.png", help="PNG to write")
    args = p.parse_args(argv)
    from hvd_train.config import derive, load_config

    cfg = load_config(args.config, args.overrides)
    setup_environment(cfg)  # the schedule is TensorFlow's
    if args.workers < 1:
        raise UserError(f"--workers: expected a count >= 1, got {args.workers}")
    d = derive(cfg, args.workers, _train_examples(cfg, args.train_examples))
    from hvd_train.runtime import schedules

    values = schedules.plot(cfg, d, args.out)
    peak = max(range(len(values)), key=values.__getitem__)
    print(
        f"{cfg.optimizer.schedule} after {d.warmup_steps} warm-up steps | {d.world_size} "
        f"worker(s), global batch {d.global_batch}, {d.steps_per_epoch} steps/epoch x "
        f"{cfg.train.epochs} epochs = {len(values)} steps\n"
        f"first step {values[0]:.6g}, highest {values[peak]:.6g} (step {peak}), "
        f"last step {values[-1]:.6g}\nwrote {args.out}"
    )
    return 0


def _train_examples(cfg: Config, given: int | None) -> int:
    """How many training examples the configured source holds, without loading images."""
    if given is not None:
        if given < 1:
            raise UserError(f"--train-examples: expected a count >= 1, got {given}")
        return given
    if cfg.data.source == "synthetic":
        return cfg.data.train_examples
    if cfg.data.source == "digits":
        from hvd_train.data.sources import load_source

        return load_source(cfg).num_train
    raise UserError(
        f"lr-plot: data.source {cfg.data.source!r}: pass --train-examples N, the number of "
        "training examples (lr-plot does not read the data)"
    )
