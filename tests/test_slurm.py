"""Inside a Slurm allocation (hvd_train/launcher/slurm.py): hosts and workers per host from Slurm's
variables, as `hvd-train launch --slurm` hands them to horovodrun. In-process, with the
variables Slurm sets; a real Slurm cluster is not part of these tests."""

from __future__ import annotations

import shlex

import pytest
from harness import QUICKSTART

from hvd_train.commands import launch as launch_command
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
