"""What every launcher hands horovodrun (hvd_train/launcher/horovodrun.py): the discovery script as one
checked, quoted word; for a job on this machine alone, the flags that keep it on loopback; and
the same command from `hvd-train launch`, `launch/single_node.sh` and `launch/multi_node.sh`.

The config's `elastic.discovery_script` reaches a shell: horovodrun runs it with Horovod's
`safe_shell_exec` (`Popen(command, shell=True)`). These tests run the value through that very
code, with shell syntax planted in the value and in the folder around it.
"""

from __future__ import annotations

import os
import pathlib
import shlex
import shutil
import subprocess
import sys

import pytest
from harness import run

from hvd_train.base.errors import ConfigError
from hvd_train.config import load_config
from hvd_train.launcher.horovodrun import Placement, command, network_flags, shared_cpu_note

ROOT = pathlib.Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
# No GPU on the machines that run these tests: Open MPI yields instead of busy-polling.
CPU = "--mca mpi_yield_when_idle 1"


def horovodrun_command(cfg, hosts=None, controller=None) -> list[str]:
    return command(cfg, "c.yaml", [], Placement(2, hosts, controller))[0]


def elastic(script: str):
    return load_config(QUICKSTART, ["elastic.enabled=true", f"elastic.discovery_script={script}"])


def flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def write_script(path: pathlib.Path, text: str = "echo localhost:2\n") -> pathlib.Path:
    path.write_text(f"#!/bin/sh\n{text}")
    path.chmod(0o755)
    return path


@pytest.mark.processes
@pytest.mark.parametrize(
    "tail",
    ["; touch {m}", " && touch {m}", " | tee {m}", "$(touch {m})", "`touch {m}`", "\ntouch {m}",
     " {m}", "'; touch {m}; '"],
    ids=["semicolon", "and", "pipe", "dollar-paren", "backquote", "newline", "argument", "quote"],
)  # fmt: skip
def test_discovery_script_with_shell_syntax_fails_at_load_and_runs_nothing(tmp_path, tail) -> None:
    script = write_script(tmp_path / "discover.sh")
    marker = tmp_path / "pwned"
    item = f"elastic.discovery_script={script}{tail.format(m=marker)}"
    proc = subprocess.run(
        [sys.executable, "-m", "hvd_train", "launch", "--config", str(QUICKSTART),
         "--set", "elastic.enabled=true", "--set", item],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()  # one line: the override (shortened), the key, what is expected
    assert line.startswith("hvd_train: error: --set elastic.discovery_script="), line
    assert "\n" not in line and "horovodrun" not in proc.stdout + proc.stderr
    assert (
        ": elastic.discovery_script: expected the path of one executable (no spaces, arguments "
        "or shell syntax: put those inside the script), got "
    ) in line
    assert not marker.exists()


def test_discovery_script_reaches_horovods_shell_as_one_word(tmp_path, monkeypatch) -> None:
    # A relative script in a folder whose name is shell syntax: the absolute path horovodrun
    # gets holds it, and Horovod's own discovery (the shell included) must still read it as a
    # file name.
    folder = tmp_path / "runs; touch pwned; $(touch pwned2) `touch pwned3` 'x"
    folder.mkdir()
    write_script(folder / "discover.sh", "echo localhost:2\necho 127.0.0.1:1\n")
    monkeypatch.chdir(folder)
    cmd = horovodrun_command(elastic("discover.sh"))
    value = flag(cmd, "--host-discovery-script")
    from horovod.runner.elastic.discovery import HostDiscoveryScript

    found = HostDiscoveryScript(value, slots=1).find_available_hosts_and_slots()
    assert found == {"localhost": 2, "127.0.0.1": 1}
    assert not list(tmp_path.rglob("pwned*")), "the folder's name ran as a command"


def test_discovery_script_must_be_an_executable_file_on_the_launching_host(tmp_path) -> None:
    missing = tmp_path / "nope.sh"
    with pytest.raises(ConfigError) as info:
        horovodrun_command(elastic(str(missing)))
    assert str(info.value) == (
        f"elastic.discovery_script: {missing}: no such file on this host, which runs it for "
        "horovodrun"
    )
    plain = write_script(tmp_path / "plain.sh")
    plain.chmod(0o644)
    with pytest.raises(ConfigError) as info:
        horovodrun_command(elastic(str(plain)))
    assert str(info.value) == f"elastic.discovery_script: {plain}: not executable; chmod +x it"


def test_workers_load_a_discovery_script_that_only_the_launcher_has() -> None:
    # On Kubernetes only the launcher pod has /etc/mpi/discover_hosts.sh; every worker loads
    # the same config, so the loader checks the form of the value, not the file.
    cfg = elastic("/nonexistent/etc/mpi/discover_hosts.sh")
    assert cfg.elastic.discovery_script == "/nonexistent/etc/mpi/discover_hosts.sh"


# --------------------------------------------------------------------------- every launcher


KNOBS = ["horovod.fusion_threshold_mb=32", "horovod.cycle_time_ms=2.5", "horovod.timeline=true",
         "horovod.autotune=true", "run.dir=res", "train.epochs=3"]  # fmt: skip
SETS = [arg for s in KNOBS for arg in ("--set", s)]


def printed(proc: subprocess.CompletedProcess) -> list[str]:
    """The one command a launcher printed (`+ ` first for the shell scripts), split as a shell
    would."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line.removeprefix("+ ") for line in proc.stdout.splitlines()
             if line.startswith(("+ ", "/"))]  # fmt: skip
    assert len(lines) == 1, proc.stdout
    return shlex.split(lines[0])


def launch(args: list[str], cwd: pathlib.Path) -> list[str]:
    return printed(run([sys.executable, "-m", "hvd_train", "launch", "--print-command",
                        "--config", str(QUICKSTART), *SETS, *args], cwd))  # fmt: skip


@pytest.mark.processes
@pytest.mark.parametrize("controller", ["--gloo", "--mpi"])
def test_every_launcher_starts_the_same_job_from_the_same_config(
    tmp_path, monkeypatch, controller
) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    monkeypatch.setenv("HVD_TRAIN_PYTHON", sys.executable)  # the Python the tests run
    dry = ["--dry-run", controller, *SETS]
    by_script = [
        printed(run([str(ROOT / "launch" / "single_node.sh"), str(QUICKSTART), *dry], tmp_path)),
        printed(run([str(ROOT / "launch" / "multi_node.sh"), "--hostfile", str(hostfile),
                     str(QUICKSTART), *dry], tmp_path)),
    ]  # fmt: skip
    by_launch = launch([controller], tmp_path)
    assert by_script == [by_launch, by_launch]
    knobs = ["--fusion-threshold-mb", "32", "--cycle-time-ms", "2.5", "--timeline-filename",
             str(tmp_path / "res" / "timeline.json"), "--autotune"]  # fmt: skip
    i = by_launch.index(sys.executable)
    assert by_launch[:5] == [by_launch[0], "-np", "2", "-H", "localhost:2"]
    assert by_launch[i - len(knobs) : i] == knobs
    assert by_launch[i:] == [sys.executable, "-m", "hvd_train", "--config", str(QUICKSTART), *SETS]
    assert by_launch.count("--allow-run-as-root") == 0, "horovodrun --mpi adds it itself"


# --------------------------------------------------------------------------- controller


def test_the_default_controller_is_open_mpi_on_this_cpu_host_alone_else_gloo(
    tmp_path, monkeypatch
) -> None:
    """`horovod.controller: auto` (the default): Open MPI for a job on this host alone without
    a GPU, where mpirun is on the job's PATH; Gloo across hosts, with GPUs, for Horovod
    Elastic, or without mpirun. --mpi and --gloo (or the key) still choose."""
    from hvd_train.launcher.horovodrun import chosen_controller

    cfg = load_config(QUICKSTART)
    assert cfg.horovod.controller == "auto"
    assert shutil.which("mpirun"), "the install puts Open MPI here"
    for hosts in (None, "localhost:2", "127.0.0.1:1,localhost:1"):
        assert chosen_controller(cfg, hosts, gpus=0) == "mpi", hosts
        assert horovodrun_command(cfg, hosts)[5] == "--mpi", hosts
    assert chosen_controller(cfg, "node1:2,node2:2", gpus=0) == "gloo"
    assert chosen_controller(cfg, None, gpus=2) == "gloo"
    assert chosen_controller(elastic(str(write_script(tmp_path / "d.sh"))), None, 0) == "gloo"
    assert chosen_controller(cfg, None, 0, controller="gloo") == "gloo"
    gloo = load_config(QUICKSTART, ["horovod.controller=gloo"])
    assert chosen_controller(gloo, None, 0) == "gloo"
    assert chosen_controller(gloo, "node1:2,node2:2", 0, controller="mpi") == "mpi"
    # No mpirun on the job's PATH (this Python's folder first, then PATH): Gloo.
    bare = tmp_path / "bin"
    bare.mkdir()
    monkeypatch.setenv("PATH", str(bare))
    assert chosen_controller(cfg, None, gpus=0) == "gloo"
    assert horovodrun_command(cfg)[5] == "--gloo"


# --------------------------------------------------------------------------- network


@pytest.mark.parametrize("hosts", [None, "localhost:2", "127.0.0.1:1,localhost:1"])
def test_a_job_on_this_machine_alone_is_kept_on_loopback(hosts) -> None:
    cfg = load_config(QUICKSTART)
    gloo = horovodrun_command(cfg, hosts, "gloo")
    assert gloo[5:8] == ["--gloo", "--network-interfaces", "lo"], gloo
    mpi = horovodrun_command(cfg, hosts, "mpi")
    mpi_args = f"{CPU} --mca btl_base_include self,vader"
    assert mpi[5:9] == ["--mpi", f"--mpi-args={mpi_args}", "--network-interfaces", "lo"], mpi


def test_a_job_on_other_hosts_is_left_to_horovods_interface_choice() -> None:
    cfg = load_config(QUICKSTART)
    for hosts in ("node1:2,node2:2", "localhost:1,node2:1"):
        gloo = horovodrun_command(cfg, hosts, "gloo")
        assert gloo[5] == "--gloo" and gloo[6] == sys.executable, gloo
        mpi = horovodrun_command(cfg, hosts, "mpi")
        assert mpi[5:] == ["--mpi", f"--mpi-args={CPU}", sys.executable, "-m", "hvd_train",
                           "--config", os.path.realpath("c.yaml")]  # fmt: skip


def test_an_elastic_job_gets_no_interface_its_hosts_may_not_have(tmp_path) -> None:
    # Hosts come and go as the discovery script says: loopback now is no promise for later.
    script = write_script(tmp_path / "discover.sh")
    cmd = horovodrun_command(elastic(str(script)), None, "mpi")
    assert "--network-interfaces" not in cmd and not any(a.startswith("--mpi") for a in cmd)


def test_mpi_args_reach_horovodruns_shell_quoted() -> None:
    # horovodrun pastes --mpi-args into the mpirun command line a shell runs.
    flags = network_flags("localhost:2", True, ["--mca", "plm_rsh_args", "-p 2222"])
    assert flags[0] == "--mpi-args=--mca plm_rsh_args '-p 2222' --mca btl_base_include self,vader"


@pytest.mark.processes
def test_launch_takes_interface_names_only(tmp_path) -> None:
    # Horovod pastes them into mpirun's shell command line.
    proc = run([sys.executable, "-m", "hvd_train", "launch", "--config", str(QUICKSTART),
                "--network-interface", "eth0;touch x", "--print-command"], tmp_path)  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.splitlines()[-1].endswith(
        "error: argument --network-interface: expects interface names (eth0 or eth0,eth1), "
        "got 'eth0;touch x'"
    ), proc.stderr
    assert not (tmp_path / "x").exists()


def test_a_job_whose_cpu_workers_share_this_host_is_told_the_faster_choices() -> None:
    cfg = load_config(QUICKSTART)
    note = shared_cpu_note(cfg, 2, None, gpus=0, controller="gloo")
    cores = len(os.sched_getaffinity(0))
    assert note.startswith(f"2 workers will share this host's {cores} CPU cores"), note
    assert "--np 1" in note and "--mpi" in note
    assert "--mpi" not in shared_cpu_note(cfg, 2, "localhost:2", gpus=0, controller="mpi")
    assert "--mpi" not in shared_cpu_note(cfg, 2, None, gpus=0)  # the default: Open MPI here
    assert shared_cpu_note(cfg, 1, None, gpus=0) is None  # one process already
    assert shared_cpu_note(cfg, 2, None, gpus=2) is None  # a GPU each
    assert shared_cpu_note(cfg, 4, "host1:2,host2:2", gpus=0) is None  # not measured there
    assert shared_cpu_note(elastic("discover.sh"), 2, None, gpus=0) is None  # Gloo only
