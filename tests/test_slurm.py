"""Inside a Slurm allocation (hvd_train/launcher/slurm.py): hosts and workers per host from Slurm's
variables, as `hvd-train launch --slurm` hands them to horovodrun. In-process, with the
variables Slurm sets; a real Slurm cluster is not part of these tests."""

from __future__ import annotations

import os
import shlex
import subprocess

import pytest
from harness import QUICKSTART

from hvd_train.commands import launch as launch_command
from hvd_train.config import load_config
from hvd_train.launcher import horovodrun, launch, srun_ssh
from hvd_train.launcher.slurm import SlurmError, expand_counts, expand_nodelist, hosts


@pytest.mark.parametrize(
    ("listed", "names"),
    [
        ("node[01-03,07],gpu-a", ["node01", "node02", "node03", "node07", "gpu-a"]),
        ("n[8-10]", ["n8", "n9", "n10"]),  # the width of the range's start: none here
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("login1", ["login1"]),
        ("a, b", ["a", "b"]),
    ],
)
def test_a_compressed_host_list_gives_every_host_in_slurms_order(listed, names) -> None:
    assert expand_nodelist(listed) == names


@pytest.mark.parametrize("listed", ["n[1-3", "n1-3]", "n[3-1]", "n[a-b]", "n[[1]]", "n[]", ","])
def test_a_malformed_host_list_is_one_line_naming_the_variable(listed) -> None:
    with pytest.raises(SlurmError) as e:
        expand_nodelist(listed)
    assert str(e.value).startswith("--slurm: SLURM_JOB_NODELIST") and "\n" not in str(e.value)


def test_compressed_counts_repeat_as_slurm_writes_them() -> None:
    assert expand_counts("SLURM_TASKS_PER_NODE", "2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(SlurmError, match=r"SLURM_TASKS_PER_NODE='2\(3\)': expected counts"):
        expand_counts("SLURM_TASKS_PER_NODE", "2(3)")


ALLOCATION = {"SLURM_JOB_NODELIST": "node[1-2]", "SLURM_TASKS_PER_NODE": "1(x2)"}


@pytest.mark.parametrize(
    ("extra", "slots"),
    [
        ({}, [1, 1]),  # Slurm's layout: one task a node by default
        ({"SLURM_TASKS_PER_NODE": "3,1"}, [3, 1]),
        ({"SLURM_GPUS_ON_NODE": "4"}, [4, 4]),  # --gpus-per-node 4, tasks not asked for
        ({"SLURM_NTASKS_PER_NODE": "2"}, [2, 2]),  # asked for, no GPUs: kept
        ({"SLURM_NTASKS_PER_NODE": "2", "SLURM_GPUS_ON_NODE": "0"}, [2, 2]),
        ({"SLURM_GPUS_ON_NODE": "4", "SLURM_NTASKS_PER_NODE": "2"}, [4, 4]),  # one per GPU
        ({"SLURM_GPUS_ON_NODE": "4", "SLURM_NTASKS_PER_NODE": "4"}, [4, 4]),
    ],
)
def test_workers_per_host_follow_the_gpus_then_the_tasks_asked_for_then_slurms_layout(
    extra, slots
) -> None:
    assert hosts({**ALLOCATION, **extra}) == list(zip(["node1", "node2"], slots, strict=True))


def test_counts_for_another_number_of_hosts_are_refused() -> None:
    with pytest.raises(
        SlurmError, match="SLURM_TASKS_PER_NODE gives 3 nodes, SLURM_JOB_NODELIST 2"
    ):
        hosts({**ALLOCATION, "SLURM_TASKS_PER_NODE": "1(x3)"})


def print_command(monkeypatch, capsys, env: dict[str, str], *args: str) -> tuple[int, str]:
    for key in ("SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_TASKS_PER_NODE",
                "SLURM_NTASKS_PER_NODE", "SLURM_GPUS_ON_NODE"):  # fmt: skip
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    argv = ["--slurm", "--config", str(QUICKSTART), "--print-command", *args]
    code = launch_command.main(argv, "hvd-train launch")
    return code, capsys.readouterr().out


def test_launch_slurm_starts_every_slot_of_the_allocation(monkeypatch, capsys) -> None:
    env = {"SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_GPUS_ON_NODE": "4",
           "SLURM_TASKS_PER_NODE": "1(x2)"}  # fmt: skip
    code, out = print_command(monkeypatch, capsys, env)
    argv = shlex.split(out)
    assert code == 0
    assert argv[argv.index("-np") + 1] == "8" and argv[argv.index("-H") + 1] == "gpu01:4,gpu02:4"
    code, out = print_command(monkeypatch, capsys, env, "--np", "6")  # fewer: the user's choice
    assert shlex.split(out)[shlex.split(out).index("-np") + 1] == "6"


def test_launch_slurm_outside_an_allocation_is_one_line_and_exit_2(monkeypatch, capsys) -> None:
    with pytest.raises(SlurmError, match="SLURM_JOB_NODELIST is not set: run it inside an"):
        print_command(monkeypatch, capsys, {})


@pytest.mark.parametrize(
    ("ssh_argv", "host", "command"),
    [  # horovodrun's start of a Gloo worker (util/remote.py), its port and key after the host
     (["-o", "PasswordAuthentication=no", "-o", "StrictHostKeyChecking=no", "node2", "-p",
       "2222", "-i", "/keys/id", "cd /proj > /dev/null 2>&1 ; HOROVOD_RANK=1 python -m x"],
      "node2", "cd /proj > /dev/null 2>&1 ; HOROVOD_RANK=1 python -m x"),
     # horovodrun's check of each host first, with its connect timeout
     (["-o", "PasswordAuthentication=no", "-o", "StrictHostKeyChecking=no", "node2",
       "-o", "ConnectTimeout=10", "true"], "node2", "true"),
     # Open MPI's rsh launcher: options joined, a user, the command in several words
     (["-x", "-p2223", "mpiuser@node3", "orted", "-mca", "ess", "env"], "node3",
      "orted -mca ess env")],
)  # fmt: skip
def test_horovodruns_ssh_becomes_a_step_of_the_job_on_that_node(ssh_argv, host, command) -> None:
    """Under --slurm, what horovodrun (or mpirun) would run over ssh runs as `srun` on that
    node: a step of the job, sharing its resources there (--overlap), one task, the command
    as ssh hands it to the remote shell."""
    assert srun_ssh.srun_command(ssh_argv) == [
        "srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={host}", "--mpi=none",
        "--input=none", "/bin/sh", "-c", command,
    ]  # fmt: skip


@pytest.mark.parametrize("ssh_argv", [[], ["-o", "A=b"], ["node2"], ["-p", "22", "node2"]])
def test_an_ssh_without_host_or_command_is_refused(ssh_argv) -> None:
    with pytest.raises(ValueError, match=r"^expected `ssh \[options\] HOST COMMAND`"):
        srun_ssh.srun_command(ssh_argv)


def test_launch_slurm_puts_its_srun_ssh_first_on_the_jobs_path(tmp_path, monkeypatch) -> None:
    """The job's environment under --slurm starts PATH with a folder whose `ssh` runs srun
    (a stand-in srun here records what it is given); without --slurm, PATH is left alone."""
    env = {"SLURM_JOB_NODELIST": "node[1-2]", "SLURM_TASKS_PER_NODE": "1(x2)"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    stand_in = tmp_path / "bin" / "srun"
    stand_in.parent.mkdir()
    stand_in.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/srun-args.txt\n')
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stand_in.parent}{os.pathsep}{os.environ['PATH']}")
    cfg = load_config(str(QUICKSTART), [])
    args = launch_command.parser("hvd-train launch").parse_args(
        ["--slurm", "--config", str(QUICKSTART)]
    )
    args.hosts = "node1:1,node2:1"
    _, job = launch.command(cfg, args, 2, [])
    first = job["PATH"].split(os.pathsep)[0]
    ssh = subprocess.run([os.path.join(first, "ssh"), "-o", "A=b", "node2", "echo", "hi"],
                         env=job, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert ssh.returncode == 0, ssh.stderr
    assert (tmp_path / "srun-args.txt").read_text().splitlines() == [
        "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=node2", "--mpi=none",
        "--input=none", "/bin/sh", "-c", "echo hi",
    ]  # fmt: skip
    args.slurm = False
    assert launch.command(cfg, args, 2, [])[1]["PATH"] == horovodrun.job_env()["PATH"]
