"""`hvd-train launch`: horovodrun under a supervisor that restarts a failed job from its checkpoint.

    hvd-train launch --config FILE [--set k=v ...] [--np N] [--hosts H:S,...] [--mpi | --gloo]
                     [--max-restarts N] [--network-interface IF] [--ssh-port P]
                     [--ssh-identity-file F] [--print-command]

The command is horovodrun.command's, as for every launcher; `--print-command` prints it (one
line, shell-quoted) instead of running it: launch/*.sh run what it prints. What an attempt does,
and when it is restarted: hvd_train/launcher/launch.py.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex

from hvd_train.config import add_config_arguments, load_config
from hvd_train.launcher import horovodrun, launch, slurm
from hvd_train.record import mlflow_run, wandb_run


def parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description=__doc__.split("\n\n")[0],
        epilog="Docs: docs/launching.md (restarts and elastic: docs/faults.md)",
    )
    add_config_arguments(p)
    p.add_argument("--np", type=int, help="workers (default: every slot of --hosts, else the "
                   "GPUs here, else launch.cpu_workers); at most one per GPU")  # fmt: skip
    where = p.add_mutually_exclusive_group()
    where.add_argument("--hosts",
                       help="horovodrun -H, e.g. host1:4,host2:4 (default localhost:NP)")  # fmt: skip
    where.add_argument("--slurm", action="store_true",
                       help="the hosts of this Slurm allocation, and workers per host: its "
                       "GPUs a node (one worker each), else its --ntasks-per-node, else its "
                       "tasks a node")  # fmt: skip
    controller = p.add_mutually_exclusive_group()
    controller.add_argument("--mpi", dest="controller", action="store_const", const="mpi",
                            help="Open MPI (default: horovod.controller from the config; its "
                            "default, auto: Open MPI on this host alone without a GPU, else "
                            "Gloo)")  # fmt: skip
    controller.add_argument("--gloo", dest="controller", action="store_const", const="gloo",
                            help="Gloo (default: horovod.controller from the config)")  # fmt: skip
    p.add_argument("--max-restarts", type=int, default=0, metavar="N",
                   help="start the job again after a failure, up to N times (default 0)")  # fmt: skip
    p.add_argument("--network-interface", dest="nics", metavar="IF[,IF]", type=_nics,
                   help="interfaces the job talks on (default: lo on this machine alone, else "
                   "Horovod's choice)")  # fmt: skip
    p.add_argument("--ssh-port", type=int, help="horovodrun's ssh port for the other hosts")
    p.add_argument("--ssh-identity-file", metavar="F", help="horovodrun's ssh key")
    p.add_argument("--print-command", action="store_true",
                   help="print the horovodrun command (one line, shell-quoted) and exit; the "
                   "shell launchers run what it prints")  # fmt: skip
    return p


def _nics(text: str) -> str:
    # Horovod pastes the names into a shell command line (mpirun's): names only.
    if not re.fullmatch(r"[A-Za-z0-9_.:-]+(,[A-Za-z0-9_.:-]+)*", text):
        raise argparse.ArgumentTypeError(
            f"expects interface names (eth0 or eth0,eth1), got {text!r}"
        )
    return text


def main(argv: list[str], prog: str) -> int:
    args = parser(prog).parse_args(argv)
    cfg = load_config(args.config, args.overrides)  # the shared loader: fails fast, exit 2
    if cfg.logging.mlflow and not args.print_command:  # one line, exit 2: no job started
        mlflow_run.check_reachable(mlflow_run.where(cfg.logging))
    if cfg.logging.wandb and not args.print_command:  # likewise
        wandb_run.check_reachable(wandb_run.where(cfg.logging))
    if args.slurm:  # the allocation's hosts; every slot a worker unless --np says fewer
        allocation = slurm.hosts(os.environ)
        args.hosts = slurm.horovodrun_hosts(allocation)
        args.np = args.np or sum(slots for _, slots in allocation)
        if note := slurm.gpus_note(os.environ):
            launch.say(note)
    gpus = horovodrun.training_gpus(cfg.runtime)
    np_ = args.np or horovodrun.workers(cfg.launch, gpus, args.hosts)
    if not cfg.elastic.enabled:  # an elastic job's hosts come from its discovery script
        horovodrun.refuse_shared_gpus(np_, args.hosts, gpus)
    notes = [horovodrun.shared_cpu_note(cfg, np_, args.hosts, gpus, args.controller),
             horovodrun.probe_note(cfg.elastic, args.hosts, args.nics or ""),
             horovodrun.sockets_note(gpus, args.hosts),
             horovodrun.mpi_note(horovodrun.chosen_controller(cfg, args.hosts, gpus,
                                                              args.controller), args.hosts)]  # fmt: skip
    for note in filter(None, notes):
        launch.say(note)
    if args.print_command:
        print(shlex.join(launch.command(cfg, args, np_, args.overrides)[0]))
        return 0
    return launch.attempts(cfg, args, np_)
