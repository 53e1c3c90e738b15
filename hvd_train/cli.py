"""Command line: `hvd-train --config FILE [--set key=value ...]` trains; sub-commands do the rest.

User errors (bad config, bad input) end in one line on stderr and exit code 2; a non-finite loss
or a failed write in one line and exit code 1; a stop by SIGTERM/SIGINT in one line and exit
code 128 + the signal's number. A traceback and exit code 1 are for everything else.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn

from hvd_train.base.errors import Interrupted, OneLineError, users_frame
from hvd_train.commands import (
    compare,
    config,
    convert_tfrecord,
    data_bench,
    doctor,
    evaluate,
    export,
    launch,
    lr_plot,
    plan,
    predict,
    sweep,
    train,
)

Command = Callable[[list[str], str], int]  # (arguments after the command's name, prog) -> exit code

# name -> (the command's `main(argv, prog)`, the one line `hvd-train --help` shows). A new
# command is one module in commands/ and one row here.
COMMANDS: dict[str, tuple[Command, str]] = {
    "train": (train.main, "train a model (the default command)"),
    "evaluate": (evaluate.main, "exact metrics of a saved model or checkpoint on a dataset"),
    "predict": (predict.main, "write each image's predicted class and probability (CSV)"),
    "export": (export.main, "write a run's model for serving: SavedModel, ONNX, LiteRT; checked"),
    "config": (config.main, "print the resolved config, or single keys with --get"),
    "launch": (launch.main, "start horovodrun for a config and restart it after a failure"),
    "doctor": (doctor.main, "check this machine: TensorFlow, Horovod, controllers, GPUs"),
    "convert-tfrecord": (convert_tfrecord.main, "write an image folder as TFRecord files"),
    "data-bench": (data_bench.main, "measure the input pipeline alone, in examples/s"),
    "lr-plot": (lr_plot.main, "draw the learning-rate schedule a run would follow"),
    "compare": (compare.main, "compare finished runs: accuracy against epoch and time"),
    "sweep": (sweep.main, "train at several worker counts and batch sizes; plot the speed-up"),
    "plan": (plan.main, "predict throughput and efficiency at 1, 2, 4, ... workers"),
}
HELP_FLAGS = ("-h", "--help", "help")

# The documentation, in the repository: each page and the task it serves. Every command's
# --help ends with its page.
DOCS = {
    "README.md": "what hvd_train is, the quick start and a short tour",
    "docs/install.md": "the install, the TensorFlow stacks, `hvd-train doctor`",
    "docs/config.md": "every config key: its type, default and meaning",
    "docs/data.md": "your data: sources, TFRecords, sharding, input speed",
    "docs/models.md": "models, callbacks, schedules, augmentation, evaluate, predict, export",
    "docs/horovod.md": "your Horovod Keras script on Keras 3: `import hvd_train.horovod as hvd`",
    "docs/launching.md": "one node, several nodes, Slurm, Kubernetes",
    "docs/docker.md": "the Docker image and its test",
    "docs/faults.md": "what a run writes, exit codes, resume, restarts, elastic",
    "docs/tracking.md": "runs in MLflow or W&B: what is logged, one tracked run per run",
    "docs/performance.md": "what a run measures, the speed knobs, settings, `plan`",
    "docs/security.md": "what a config may run, what listens on the network",
    "docs/benchmarks.md": "each measured claim; its runs, dates and commands in lab/",
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
        command = train.main  # the default command: `hvd-train --config FILE`
    else:
        return _help(argv, prog)
    try:
        return command(argv, prog)
    except OneLineError as e:  # UserError 2, TrainingError 1: the class carries its code
        return _error(str(e), e.exit_code)
    except Interrupted as e:
        from hvd_train.base import logs

        logs.say(f"hvd_train: {e}", console=logs.on_console())
        return e.exit_code
    except Exception as e:
        return _bug(e)


# How long a failed process may take to end (its atexit handlers and the interpreter's
# teardown) before the watchdog ends it: `watch_the_exit`.
EXIT_WATCHDOG_S = 60.0


def run(prog: str = "hvd-train") -> None:
    """The `hvd-train` and `python -m hvd_train` entry: main(), then its exit code."""
    code = main(prog=prog)
    if code != 0:
        watch_the_exit()
    exit_without_teardown(code)


def watch_the_exit() -> None:
    """A failure exits through atexit's handlers (Horovod's shutdown). Should one hang, every
    thread's traceback goes to stderr after EXIT_WATCHDOG_S and the process ends with exit
    code 1: the record already says `failed`, and no job is held forever by a worker that has
    nothing left to do. faulthandler's watchdog is a thread of C that needs no interpreter
    lock, so it fires whatever holds it."""
    import faulthandler

    faulthandler.dump_traceback_later(EXIT_WATCHDOG_S, exit=True)


def exit_without_teardown(code: int = 0) -> NoReturn:
    """Exit with `code` after what an exit must do (atexit's handlers: Horovod's shutdown,
    which also finalizes MPI, and logging's; stdout and stderr flushed), without the
    interpreter's teardown. Freeing a trained TensorFlow process's modules and objects one by
    one costs every worker CPU time at its end, for nothing (docs/benchmarks.md, "Start-up");
    and after a failure it could hang, past atexit's handlers, with no Python frame left (a
    2-worker job whose input file was cut short under it: rank 1 printed its data error, then
    the watchdog ended it with exit code 1 in place of the error's 2). The run has closed what
    it wrote, successful or not, before main() returns."""
    import atexit

    from hvd_train.base import logs

    atexit._run_exitfuncs()
    logs.flush_std()
    os._exit(code)


def _error(message: str, code: int) -> int:
    """A one-line error: on the console, or, once a rank has its log, its failure line."""
    from hvd_train.base import logs

    if logs.attached():
        logs.failed(message)  # once: the trainer may have said it already
    else:
        logs.release(replay=False)
        logs.print_line(f"hvd_train: error: {message}", sys.stderr)
    return code


def _bug(e: Exception) -> int:
    """An unexpected error: its traceback in the rank's log and one line pointing there, exit
    code 1; without a log yet, the traceback on the console."""
    from hvd_train.base import logs

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
