"""Command line: `hvd-train --config FILE [--set key=value ...]` trains; sub-commands do the rest.

User errors (bad config, bad input) end in one line on stderr and exit code 2; a non-finite loss
or a failed write in one line and exit code 1; a stop by SIGTERM/SIGINT in one line and exit
code 128 + the signal's number. A traceback and exit code 1 are for everything else.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from hvd_train import inference
from hvd_train.errors import Interrupted, OneLineError, UserError, users_frame

if TYPE_CHECKING:
    from hvd_train.config import Config


def _train_parser(
    prog: str, docs: str = "docs/config.md (every key), docs/launching.md"
) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Train a Keras model with Horovod. Launch with "
        "`horovodrun -np N hvd-train --config FILE`, or run alone as one worker.",
        epilog=f"Docs: {docs}",
    )
    from hvd_train.config import add_config_arguments

    add_config_arguments(p)
    return p


def _cmd_train(argv: list[str], prog: str) -> int:
    args = _train_parser(prog).parse_args(argv)
    from hvd_train.config import load_config

    cfg = load_config(args.config, args.overrides)  # before TensorFlow loads: fast to fail
    from hvd_train import logs, startup, stops

    startup.mark("config")
    # From here a stop, or horovodrun ending the job after another worker failed, is recorded
    # (rank 0 writes summary.json), also during TensorFlow's import: Python's default would
    # end the process without a word.
    signals = stops.installed(cfg)
    # A launcher's worker: its output waits for its log in run.dir, which the trainer starts
    # once run.dir is this job's; alone, TensorFlow's start-up lines are kept for that log.
    logs.quiet_tensorflow()
    from hvd_train.trainer import train

    startup.mark("imports")  # TensorFlow, Horovod and the trainer
    train(cfg, config_path=args.config, signals=signals)
    return 0


def _cmd_config(argv: list[str], prog: str) -> int:
    from hvd_train.config import main as config_main

    return config_main(argv, prog)


def _cmd_launch(argv: list[str], prog: str) -> int:
    from hvd_train.launch import main as launch_main

    return launch_main(argv, prog)


def _cmd_doctor(argv: list[str], prog: str) -> int:
    from hvd_train.doctor import main as doctor_main

    return doctor_main(argv, prog)


def _cmd_convert_tfrecord(argv: list[str], prog: str) -> int:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Write an image folder (one sub-folder per class) as sharded TFRecord "
        "files for data.source: tfrecord (layout: docs/data.md).",
        epilog="Docs: docs/data.md",
    )
    p.add_argument("src", metavar="SRC_IMAGE_FOLDER", help="training images, a folder per class")
    p.add_argument("dst", metavar="DST", help="output folder: DST/train (and DST/val)")
    p.add_argument("--shards", type=int, default=8, help="files per split (default 8)")
    p.add_argument(
        "--val-dir", default="", metavar="FOLDER",
        help="validation images, a folder per class, written to DST/val; without it, training "
        "holds out data.validation_fraction of DST/train, as for the image folder itself",
    )  # fmt: skip
    p.add_argument(
        "--on-corrupt", choices=["error", "skip"], default="error",
        help="files that are not readable JPEG/PNG: stop naming them all (default), or leave them "
        "out, listed in DST/train/skipped.txt",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.shards < 1:
        p.error(f"--shards: expected a value >= 1, got {args.shards}")
    from hvd_train import logs

    logs.quiet_tensorflow()
    from hvd_train.tfrecords import convert

    convert(args.src, args.dst, args.shards, args.val_dir, args.on_corrupt)
    return 0


def _cmd_data_bench(argv: list[str], prog: str) -> int:
    p = _train_parser(prog, docs="docs/data.md")
    p.description = (
        "Measure the input pipeline alone (examples/s per worker) beside the rate the model "
        "consumes. Run it under horovodrun with the job's worker count."
    )
    p.add_argument("--batches", type=int, default=50, help="batches timed (default 50)")
    args = p.parse_args(argv)
    from hvd_train.config import load_config

    cfg = load_config(args.config, args.overrides)
    from hvd_train import logs

    logs.quiet_tensorflow(cfg.run.dir, "hvd-train data-bench")
    from hvd_train.input_diagnostics import data_bench

    data_bench(cfg, max(1, args.batches))
    return 0


def _cmd_lr_plot(argv: list[str], prog: str) -> int:
    p = _train_parser(prog, docs="docs/models.md")
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
    if args.workers < 1:
        raise UserError(f"--workers: expected a count >= 1, got {args.workers}")
    from hvd_train import logs

    logs.quiet_tensorflow()
    d = derive(cfg, args.workers, _train_examples(cfg, args.train_examples))
    from hvd_train import schedules

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
        from hvd_train.data import load_source

        return load_source(cfg).num_train
    raise UserError(
        f"lr-plot: data.source {cfg.data.source!r}: pass --train-examples N, the number of "
        "training examples (lr-plot does not read the data)"
    )


def _cmd_compare(argv: list[str], prog: str) -> int:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Compare runs: validation accuracy and loss against epoch and time "
        "(one PNG), and a table of batches, best accuracy, time to reach it and throughput.",
        epilog="Docs: docs/models.md",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run.dir of each run")
    p.add_argument("--out", default="compare.png", help="PNG to write")
    args = p.parse_args(argv)
    from hvd_train import compare

    runs = compare.load_runs(args.run_dirs)
    print(compare.format_table(compare.table(runs)))
    compare.plot(runs, args.out)
    print(f"wrote {args.out}")
    return 0


def _plan_parser(prog: str) -> argparse.ArgumentParser:
    from hvd_train.plan import LINK_EFFICIENCY, Assumptions, Network

    p = argparse.ArgumentParser(
        prog=prog,
        description="Predict throughput, scaling efficiency and time per epoch at 1, 2, 4, ... "
        "workers under Horovod's ring all-reduce, from a finished 1-worker run or from "
        "explicit numbers, and the network. Prints the assumptions under the table.",
        epilog="Docs: docs/performance.md (the model, and its check against published runs)",
    )
    src = p.add_argument_group("the workload: --run, or --throughput, --params and --batch")
    src.add_argument("--run", metavar="RUN_DIR", help="a finished 1-worker run.dir")
    src.add_argument("--throughput", type=float, help="one worker's examples/s")
    src.add_argument("--params", type=float, help="trainable parameters (e.g. 25.6e6)")
    src.add_argument("--batch", type=int, help="examples per worker per step")
    src.add_argument(
        "--examples-per-epoch", type=int, metavar="N",
        help="for the time per epoch (default: the run's; without a run, not shown)",
    )  # fmt: skip
    src.add_argument("--fp16", action="store_true", help="float16 gradients: 2 bytes each")
    d, a = Network(), Assumptions()
    net = p.add_argument_group("the network")
    for flag, kind, field, what in (
        ("--bandwidth-gbit", float, "bandwidth_gbit", "each host's link, Gbit/s"),
        ("--latency-us", float, "latency_us", "one network hop, microseconds"),
        ("--gpus-per-host", int, "gpus_per_host", "workers per host, sharing its link"),
        ("--intra-host-bandwidth-gbit", float, "intra_host_bandwidth_gbit",
         "between the workers of a host (NVLink, PCIe), Gbit/s"),
    ):  # fmt: skip
        default = getattr(d, field)
        net.add_argument(flag, type=kind, default=default, help=f"{what} (default {default:g})")
    net.add_argument(
        "--transport", choices=sorted(LINK_EFFICIENCY), default=d.transport,
        help=f"usable share of the line rate: {LINK_EFFICIENCY} (default {d.transport})",
    )  # fmt: skip
    p.add_argument("--workers", metavar="N,N,...", help="worker counts (default 1,2,4,...,512)")
    p.add_argument(
        "--fusion-threshold-mb", type=float,
        help=f"HOROVOD_FUSION_THRESHOLD in MB (default {a.fusion_threshold_mb:g})",
    )  # fmt: skip
    p.add_argument(
        "--cycle-time-ms", type=float,
        help=f"HOROVOD_CYCLE_TIME in ms (default {a.cycle_time_ms:g})",
    )  # fmt: skip
    p.add_argument(
        "--published", action="store_true",
        help="print the check against published runs (the table of docs/performance.md)",
    )  # fmt: skip
    return p


def _cmd_plan(argv: list[str], prog: str) -> int:
    args = _plan_parser(prog).parse_args(argv)
    if args.published:
        from hvd_train.published_scaling import markdown_table

        print(markdown_table(), end="")
        return 0
    from hvd_train import plan

    net = plan.Network(args.bandwidth_gbit, args.latency_us, args.gpus_per_host,
                       args.intra_host_bandwidth_gbit, args.transport)  # fmt: skip
    plan.check_network(net)
    a = plan.with_fusion(plan.Assumptions(), args.fusion_threshold_mb, args.cycle_time_ms)
    w = plan.workload(args.run, args.throughput, args.params, args.batch, args.fp16,
                      args.examples_per_epoch)  # fmt: skip
    workers = plan.parse_workers(args.workers) if args.workers else plan.default_workers()
    print(plan.format_table(plan.predict(w, workers, net, a)))
    print(plan.describe(w, net, a))
    return 0


def _cmd_sweep(argv: list[str], prog: str) -> int:
    from hvd_train.sweep import main as sweep_main

    return sweep_main(argv, prog)


Command = Callable[[list[str], str], int]  # (arguments after the command's name, prog) -> exit code

# name -> (function, the one line `hvd-train --help` shows). A new command is one row here.
COMMANDS: dict[str, tuple[Command, str]] = {
    "train": (_cmd_train, "train a model (the default command)"),
    "evaluate": (
        inference.evaluate_main,
        "exact metrics of a saved model or checkpoint on a dataset",
    ),
    "predict": (inference.predict_main, "write each image's predicted class and probability (CSV)"),
    "config": (_cmd_config, "print the resolved config, or single keys with --get"),
    "launch": (_cmd_launch, "start horovodrun for a config and restart it after a failure"),
    "doctor": (_cmd_doctor, "check this machine: TensorFlow, Horovod, controllers, GPUs"),
    "convert-tfrecord": (_cmd_convert_tfrecord, "write an image folder as TFRecord files"),
    "data-bench": (_cmd_data_bench, "measure the input pipeline alone, in examples/s"),
    "lr-plot": (_cmd_lr_plot, "draw the learning-rate schedule a run would follow"),
    "compare": (_cmd_compare, "compare finished runs: accuracy against epoch and time"),
    "sweep": (_cmd_sweep, "train at several worker counts and batch sizes; plot the speed-up"),
    "plan": (_cmd_plan, "predict throughput and efficiency at 1, 2, 4, ... workers"),
}
HELP_FLAGS = ("-h", "--help", "help")

# The documentation, in the repository: each page and the task it serves. Every command's
# --help ends with its page.
DOCS = {
    "README.md": "what hvd_train is, the quick start and a short tour",
    "docs/install.md": "the install, the TensorFlow stacks, `hvd-train doctor`",
    "docs/config.md": "every config key: its type, default and meaning",
    "docs/data.md": "your data: sources, TFRecords, sharding, input speed",
    "docs/models.md": "models, callbacks, schedules, augmentation, evaluate, predict",
    "docs/launching.md": "one node, several nodes, Slurm, Kubernetes",
    "docs/docker.md": "the Docker image and its test",
    "docs/faults.md": "what a run writes, exit codes, resume, restarts, elastic",
    "docs/performance.md": "what a run measures, the speed knobs, settings, `plan`",
    "docs/security.md": "what a config may run, what listens on the network",
    "docs/benchmarks.md": "measurements, with their commands and dates",
    "docs/validation.md": "what was run where: Docker, several hosts, stacks",
    "docs/development.md": "the code's layout and the test suite",
}


def usage(prog: str) -> str:
    """The top-level help: how to train, every command with its one line, the docs pages."""
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items())
    wide = max(map(len, DOCS))
    pages = "\n".join(f"  {page:<{wide}}  {task}" for page, task in DOCS.items())
    return (
        f"usage: {prog} --config FILE [--set KEY=VALUE ...]\n"
        f"       {prog} COMMAND [ARGS ...]\n\n"
        "Train Keras models with Horovod. Without a command it trains:\n"
        f"`{prog} --config FILE` is `{prog} train --config FILE`.\n\n"
        f"commands:\n{rows}\n\n"
        f"`{prog} COMMAND --help` or `{prog} help COMMAND`: a command's arguments.\n\n"
        f"docs (in the repository):\n{pages}\n"
    )


def main(argv: list[str] | None = None, prog: str = "hvd-train") -> int:
    argv = sys.argv[1:] if argv is None else argv
    # TensorFlow's C++ INFO lines (CPU features, oneDNN) drown the training log; opt back in
    # with TF_CPP_MIN_LOG_LEVEL=0.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    if argv and argv[0] in COMMANDS:
        command, argv, prog = COMMANDS[argv[0]][0], argv[1:], f"{prog} {argv[0]}"
    elif argv and argv[0].startswith("-") and argv[0] not in HELP_FLAGS:
        command = _cmd_train  # the default command: `hvd-train --config FILE`
    else:
        return _help(argv, prog)
    try:
        return command(argv, prog)
    except OneLineError as e:  # UserError 2, TrainingError 1: the class carries its code
        return _error(str(e), e.exit_code)
    except Interrupted as e:
        from hvd_train import logs

        logs.say(f"hvd_train: {e}", console=logs.on_console())
        return e.exit_code
    except Exception as e:
        return _bug(e)


def run(prog: str = "hvd-train") -> None:
    """The `hvd-train` and `python -m hvd_train` entry: main(), then its exit code."""
    code = main(prog=prog)
    if code == 0:
        exit_without_teardown()
    sys.exit(code)


def exit_without_teardown() -> NoReturn:
    """Exit code 0 after what an exit must do (atexit's handlers: Horovod's shutdown, which
    also finalizes MPI, and logging's; stdout and stderr flushed), without the interpreter's
    teardown: freeing a trained TensorFlow process's modules and objects one by one cost every
    worker 0.7 s of CPU at its end (a 1-step quickstart run alone: 5.8 s, now 5.0 s). Only
    after success, where the run has closed what it wrote; a failure exits the usual way."""
    import atexit

    from hvd_train import logs

    atexit._run_exitfuncs()
    logs.flush_std()
    os._exit(0)


def _error(message: str, code: int) -> int:
    """A one-line error: on the console, or, once a rank has its log, its failure line."""
    from hvd_train import logs

    if logs.attached():
        logs.failed(message)  # once: the trainer may have said it already
    else:
        logs.release(replay=False)
        print(f"hvd_train: error: {message}", file=sys.stderr, flush=True)
    return code


def _bug(e: Exception) -> int:
    """An unexpected error: its traceback in the rank's log and one line pointing there, exit
    code 1; without a log yet, the traceback on the console."""
    from hvd_train import logs

    if not logs.attached():
        logs.release(replay=True)
        raise
    where = users_frame(e)
    hint = f"at {where}; traceback in the log" if where else "a bug? traceback in the log"
    logs.failed(f"{type(e).__name__}: {' '.join(str(e).split())} ({hint})", e)
    return 1


def _help(argv: list[str], prog: str) -> int:
    """`hvd-train --help` and `hvd-train help` (0); `hvd-train help COMMAND` (its --help);
    bare `hvd-train` or an unknown command: the usage on stderr (2)."""
    if argv and argv[0] in HELP_FLAGS:
        if len(argv) > 1 and argv[1] in COMMANDS:
            return main([argv[1], "--help"], prog)
        if len(argv) == 1:
            print(usage(prog), end="")
            return 0
        argv = argv[1:]
    why = f"unknown command {argv[0]!r}" if argv else "no config; train with --config FILE"
    print(f"{prog}: error: {why}\n\n{usage(prog)}", end="", file=sys.stderr)
    return 2
