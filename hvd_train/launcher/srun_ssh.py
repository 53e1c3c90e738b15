"""Workers started by Slurm, not over ssh: an `ssh` for horovodrun that runs `srun` instead.

horovodrun starts each worker on another host with `ssh HOST COMMAND` (and checks each host
first with `ssh HOST true`). Under `hvd-train launch --slurm` the job's PATH starts with a
folder whose `ssh` runs this module, which turns that into a step of the job:

    srun --overlap --nodes=1 --ntasks=1 --nodelist=HOST --mpi=none --input=none \
        /bin/sh -c COMMAND

So the worker runs where ssh is blocked between nodes (many clusters allow it only into nodes
of your own job, or not at all), inside the job's cgroup with the CPUs and GPUs Slurm gave it on
that node (a step's default: all of the job's resources there), instead of escaping them as an
ssh-started process does. srun passes SIGINT, SIGTERM and SIGUSR1 on to the worker, as the
launcher's stops need, and ends when the worker does, with its exit code.

Standard library only: it runs before anything else on the launching host.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile

# ssh's options that take a value (OpenSSH's getopt string), as horovodrun and Open MPI pass
# them: `-o Key=value`, `-p PORT`, `-i FILE`; a value may also be joined (`-p2222`).
_WITH_VALUE = set("BbcDEeFIiJLlmOopQRSWw")
SHIM = "ssh"


def srun_command(ssh_argv: list[str]) -> list[str]:
    """The srun command that runs what `ssh ssh_argv...` would run on its host.

    OpenSSH reads options before and after the host; the first word after the host that is
    not an option starts the command, whose words ssh joins with spaces for the remote shell.

    Raises:
        ValueError: no host, or no command (an interactive login has no step to run).
    """
    host, words, i = None, [], 0
    while i < len(ssh_argv):
        word = ssh_argv[i]
        if word.startswith("-") and len(word) > 1 and not words:
            i += 2 if word[1] in _WITH_VALUE and len(word) == 2 else 1
            continue
        if host is None:
            host = word
        else:
            words = ssh_argv[i:]
            break
        i += 1
    if host is None or not words:
        raise ValueError(f"expected `ssh [options] HOST COMMAND`, got: ssh {' '.join(ssh_argv)}")
    host = host.rpartition("@")[2]  # user@host: the step runs as the job's user anyway
    return [
        "srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={host}", "--mpi=none",
        "--input=none", "/bin/sh", "-c", " ".join(words),
    ]  # fmt: skip


def install(folder: str | None = None) -> str:
    """Writes the `ssh` that runs this module into `folder` (a new private one when None);
    returns the folder, for the front of the job's PATH."""
    folder = folder or tempfile.mkdtemp(prefix="hvd_train-srun-")
    path = os.path.join(folder, SHIM)
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\nexec {sys.executable} -m hvd_train.launcher.srun_ssh "$@"\n')
    os.chmod(path, stat.S_IRWXU)
    return folder


def main(argv: list[str]) -> int:
    try:
        cmd = srun_command(argv)
    except ValueError as e:
        print(f"hvd_train srun_ssh: {e}", file=sys.stderr)
        return 255  # ssh's own code for its errors
    os.execvp(cmd[0], cmd)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
