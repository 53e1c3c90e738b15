"""launch/single_node.sh and launch/multi_node.sh, run for real: real horovodrun jobs, real ssh.

The multi-node tests start private ssh servers (tests/sshd.py): on 127.0.0.x for the
pre-flight, and in two network namespaces joined by a veth pair for a job across two "hosts"
with their own addresses, launched from one of them as on a real cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import shlex
import shutil
import socket
import subprocess
import uuid

import pytest
import sshd
from harness import QUICKSTART, ROOT, finish_listening, run, start

import hvd_train
from hvd_train.record.summary import problems

pytestmark = pytest.mark.processes

SINGLE = ROOT / "launch" / "single_node.sh"
MULTI = ROOT / "launch" / "multi_node.sh"
# The virtualenv the scripts default to: the one for the stack HVD_TRAIN_TF names (scripts/stack.sh).
STACK_VENV = subprocess.check_output(
    ["bash", str(ROOT / "scripts" / "stack.sh"), "venv"], text=True
)
VENV_PY = ROOT / STACK_VENV.strip() / "bin" / "python"
# The quickstart cut to one epoch of 4 steps: what every real job here trains. The launch is
# under test, not the training (tests/test_multiworker.py covers that).
SETS = ["train.epochs=1", "train.steps_per_epoch=4", "train.verbose=false",
        "logging.tensorboard=false", "run.dir=out"]  # fmt: skip
ONE_EPOCH = [arg for s in SETS for arg in ("--set", s)]


def printed_command(stdout: str) -> list[str]:
    """The horovodrun command the script printed (`+ ...`), split as the shell would."""
    lines = [line for line in stdout.splitlines() if line.startswith("+ ")]
    assert len(lines) == 1, stdout[-3000:]
    return shlex.split(lines[0][2:])


def expect(proc: subprocess.CompletedProcess, code: int) -> subprocess.CompletedProcess:
    assert proc.returncode == code, (
        f"exit {proc.returncode}, expected {code}\n--- stdout\n{proc.stdout[-6000:]}\n"
        f"--- stderr\n{proc.stderr[-6000:]}"
    )
    return proc


def summary(run_dir: pathlib.Path) -> dict:
    """run.dir's summary.json, which holds only declared fields (record/summary.py)."""
    s = json.loads((run_dir / "summary.json").read_text())
    assert problems(s) == [], problems(s)
    return s


# --------------------------------------------------------------------------- single node


@pytest.mark.multiworker
def test_single_node_trains_with_two_cpu_workers_from_any_folder(tmp_path) -> None:
    verbose = ["--set", "train.verbose=2"]  # the default: epoch lines, a live bar on a terminal
    proc = expect(run([str(SINGLE), str(QUICKSTART), *ONE_EPOCH, *verbose], cwd=tmp_path), 0)
    # mpirun's ranks write to a pseudo-terminal of its own, which isatty() calls a terminal:
    # rank 0 still prints epoch lines, not the bar's frames, tagged line by line.
    assert "[hvd_train] epoch 1/1: loss" in proc.stdout, proc.stdout[-3000:]
    assert "━" not in proc.stdout and "step -" not in proc.stdout, proc.stdout[-3000:]
    cmd = printed_command(proc.stdout)
    # The default controller on a CPU host alone: Open MPI, yielding while it waits, shared
    # memory between the ranks, and loopback for the rest.
    horovodrun = str(VENV_PY.parent / "horovodrun")
    assert cmd[:6] == [horovodrun, "-np", "2", "-H", "localhost:2", "--mpi"], cmd
    mpi_args = "--mpi-args=--mca mpi_yield_when_idle 1 --mca btl_base_include self,vader"
    assert cmd[6:9] == [mpi_args, "--network-interfaces", "lo"], "this machine: loopback"
    assert cmd[9:] == [str(VENV_PY), "-m", "hvd_train", "--config", str(QUICKSTART), *ONE_EPOCH,
                       *verbose]  # fmt: skip
    s = summary(tmp_path / "out")
    assert (s["status"], s["world_size"], s["controller"]) == ("completed", 2, "mpi")
    assert s["epochs_completed"] == 1
    # Two CPU workers share this host: each binds to its own cores (runtime.bind_cores unset),
    # and the launcher said so before the job, with the faster choices.
    logs = "".join(p.read_text() for p in sorted((tmp_path / "out" / "logs").glob("rank-*.log")))
    bound = dict(re.findall(r"\[rank (\d)\] bound to cores (\[[\d, ]+\])", logs))
    assert sorted(bound) == ["0", "1"], logs[-3000:]
    if len(os.sched_getaffinity(0)) >= 2:
        assert bound["0"] != bound["1"], bound
    assert "2 workers will share this host's" in proc.stderr and "--np 1" in proc.stderr


@pytest.mark.multiworker
def test_single_node_mpi_controller_runs_as_root_without_busy_polling(tmp_path) -> None:
    proc = expect(run([str(SINGLE), str(QUICKSTART), "--mpi", *ONE_EPOCH], cwd=tmp_path), 0)
    cmd = printed_command(proc.stdout)
    # Shared memory only between the ranks: no rank opens Open MPI's TCP transport, which
    # would listen on every interface (docs/security.md).
    assert cmd[5:9] == ["--mpi", "--mpi-args=--mca mpi_yield_when_idle 1 --mca btl_base_include "
                        "self,vader", "--network-interfaces", "lo"], cmd  # fmt: skip
    s = summary(tmp_path / "out")
    assert (s["status"], s["world_size"], s["controller"]) == ("completed", 2, "mpi")
    shared_memory = "gradients all-reduced through shared memory (one host)"
    assert shared_memory in proc.stdout, proc.stdout[-3000:]


@pytest.mark.multiworker
def test_single_node_exits_with_the_jobs_failure(tmp_path) -> None:
    # The config loads, but 40 examples cannot fill one global batch of 2 x 32: every worker
    # stops with a data error, so horovodrun, and the script that became it, fail.
    sets = ["--set", "data.source=synthetic", "--set", "data.train_examples=40"]
    proc = run([str(SINGLE), str(QUICKSTART), *ONE_EPOCH, *sets], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]  # the first failed worker's, via horovodrun
    assert "fewer than one global batch" in proc.stdout + proc.stderr
    assert not (tmp_path / "out" / "summary.json").exists()


def test_single_node_bad_config_gives_the_loaders_one_line_and_exit_2(tmp_path) -> None:
    proc = expect(run([str(SINGLE), str(QUICKSTART), "--set", "train.epocs=1"], cwd=tmp_path), 2)
    assert proc.stderr.strip().splitlines() == [
        "hvd_train: error: --set train.epocs=1: train.epocs: unknown key; did you mean train.epochs?"
    ]
    assert "horovodrun" not in proc.stdout


def test_single_node_passes_the_configs_horovod_knobs_as_flags(tmp_path) -> None:
    sets = ["horovod.fusion_threshold_mb=32", "horovod.cycle_time_ms=2.5",
            "horovod.timeline=true", "horovod.autotune=true", "run.dir=res"]  # fmt: skip
    args = [a for s in sets for a in ("--set", s)]
    proc = expect(run([str(SINGLE), str(QUICKSTART), "--dry-run", *args], cwd=tmp_path), 0)
    cmd = printed_command(proc.stdout)
    knobs = cmd[cmd.index("--network-interfaces") + 2 : cmd.index(str(VENV_PY))]
    assert knobs == ["--fusion-threshold-mb", "32", "--cycle-time-ms", "2.5",
                     "--timeline-filename", str(tmp_path / "res" / "timeline.json"), "--autotune"]  # fmt: skip
    plain = printed_command(
        expect(run([str(SINGLE), str(QUICKSTART), "--dry-run"], tmp_path), 0).stdout
    )
    after = plain[plain.index("--network-interfaces") + 2]
    assert after == str(VENV_PY), "no knob set in the config: no flag"


def test_single_node_reads_controller_and_cpu_workers_from_the_config(tmp_path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("horovod:\n  controller: mpi\nlaunch:\n  cpu_workers: 3\n")
    cmd = printed_command(expect(run([str(SINGLE), str(config), "--dry-run"], tmp_path), 0).stdout)
    assert cmd[1:6] == ["-np", "3", "-H", "localhost:3", "--mpi"]
    cmd = printed_command(
        expect(
            run([str(SINGLE), str(config), "--dry-run", "--gloo", "--np", "1"], tmp_path), 0
        ).stdout
    )
    assert cmd[1:6] == ["-np", "1", "-H", "localhost:1", "--gloo"]


def test_single_node_starts_one_worker_per_gpu(tmp_path, monkeypatch) -> None:
    # nvidia-smi -L as the driver prints it on a 4-GPU machine (there is no GPU here).
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n" + "".join(
        f"echo 'GPU {i}: NVIDIA A100-SXM4-40GB (UUID: GPU-{i})'\n" for i in range(4)))  # fmt: skip
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    proc = expect(run([str(SINGLE), str(QUICKSTART), "--mpi", "--dry-run"], tmp_path), 0)
    cmd = printed_command(proc.stdout)
    assert cmd[1:6] == ["-np", "4", "-H", "localhost:4", "--mpi"]
    assert not any("yield" in a for a in cmd), "GPU workers keep MPI's low-latency polling"
    # Two workers on one GPU: refused before anything starts (issue 60), one line, exit 2.
    proc = expect(run([str(SINGLE), str(QUICKSTART), "--np", "5", "--dry-run"], tmp_path), 2)
    assert proc.stderr.count("\n") == 1 and "5 workers on this host, which has 4" in proc.stderr
    assert "+ " not in proc.stdout, "no command printed, none run"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    cmd = printed_command(
        expect(run([str(SINGLE), str(QUICKSTART), "--dry-run"], tmp_path), 0).stdout
    )
    assert cmd[1:4] == ["-np", "2", "-H"]
    # hvd-train launch counts them the same way (it once ignored CUDA_VISIBLE_DEVICES).
    launch = [
        str(VENV_PY),
        "-m",
        "hvd_train",
        "launch",
        "--config",
        str(QUICKSTART),
        "--print-command",
    ]
    for visible, np in (("1,3", "2"), ("0", "1"), ("", "2"), ("-1", "2")):  # 2: launch.cpu_workers
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        assert shlex.split(expect(run(launch, tmp_path), 0).stdout)[1:3] == ["-np", np], visible
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert shlex.split(expect(run(launch, tmp_path), 0).stdout)[1:3] == ["-np", "4"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--np", "0"], "single_node.sh: error: --np expects a positive integer, got '0'"),
        (["--frobnicate"], "single_node.sh: error: unknown option --frobnicate"),
    ],
)
def test_single_node_rejects_bad_arguments(tmp_path, args, message) -> None:
    proc = expect(run([str(SINGLE), str(QUICKSTART), *args], tmp_path), 2)
    assert proc.stderr.startswith(message), proc.stderr


# --------------------------------------------------------------------------- hostfile


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("node1 slots=2\nnode2 slots=x\n", "{f}:2: expected 'HOST slots=N' with N >= 1, got 'node2 slots=x'"),
        ("# two hosts\n\nnode1\n", "{f}:3: expected 'HOST slots=N' with N >= 1, got 'node1'"),
        ("node1 slots=0\n", "{f}:1: expected 'HOST slots=N' with N >= 1, got 'node1 slots=0'"),
        ("node1 slots=2 extra\n", "{f}:1: expected 'HOST slots=N' with N >= 1, got 'node1 slots=2 extra'"),
        ("node1:2\n", "{f}:1: expected 'HOST slots=N' with N >= 1, got 'node1:2'"),
        ("node1 slots=1\n  node1   slots=1\n", "{f}:2: host node1 is listed twice"),
        ("# nothing\n\n", "{f}: no hosts; expected lines 'HOST slots=N'"),
    ],
)  # fmt: skip
def test_bad_hostfile_line_fails_with_its_number(tmp_path, text, message) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text(text)
    proc = expect(run([str(MULTI), "--hostfile", str(hostfile), str(QUICKSTART)], tmp_path), 2)
    assert proc.stderr.strip() == "multi_node.sh: error: " + message.format(f=hostfile)


def test_multi_node_command_has_hosts_ssh_options_and_interface(tmp_path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# GPU boxes\nnode-a.example slots=4   # 4 x A100\n\n10.0.0.7 slots=2\n")
    key = sshd.make_keys(tmp_path)
    proc = expect(run([str(MULTI), "--hostfile", str(hostfile), str(QUICKSTART), "--dry-run",
                       "--ssh-port", "2222", "--ssh-identity-file", str(key),
                       "--network-interface", "eth1", "--set", "train.epochs=2"], tmp_path), 0)  # fmt: skip
    cmd = printed_command(proc.stdout)
    assert cmd[1:] == ["-np", "6", "-H", "node-a.example:4,10.0.0.7:2", "--gloo",
                       "--ssh-port", "2222", "--ssh-identity-file", str(key),
                       "--network-interfaces", "eth1", str(VENV_PY), "-m", "hvd_train",
                       "--config", str(QUICKSTART), "--set", "train.epochs=2"]  # fmt: skip


def test_multi_node_network_flags_follow_the_hosts_and_the_named_interface(tmp_path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node-a slots=2\nnode-b slots=2\n")
    args = [str(MULTI), "--hostfile", str(hostfile), str(QUICKSTART), "--dry-run", "--mpi"]
    named = printed_command(expect(run([*args, "--network-interface", "eth1"], tmp_path), 0).stdout)
    # Open MPI's own traffic (mpirun and its daemons) keeps to the named interface too.
    assert named[5:9] == ["--mpi", "--mpi-args=--mca mpi_yield_when_idle 1 --mca "
                          "oob_tcp_if_include eth1", "--network-interfaces", "eth1"], named  # fmt: skip
    unnamed = printed_command(expect(run(args, tmp_path), 0).stdout)
    assert unnamed[5:7] == ["--mpi", "--mpi-args=--mca mpi_yield_when_idle 1"], unnamed
    assert str(VENV_PY) == unnamed[7], "other hosts, no interface named: Horovod finds one"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    local = printed_command(expect(run(args, tmp_path), 0).stdout)
    assert local[5:9] == ["--mpi", "--mpi-args=--mca mpi_yield_when_idle 1 --mca btl_base_include "
                          "self,vader", "--network-interfaces", "lo"], local  # fmt: skip
    proc = expect(run([*args, "--network-interface", "eth0;touch x"], tmp_path), 2)
    assert proc.stderr.strip() == (
        "multi_node.sh: error: --network-interface expects interface names (eth0 or eth0,eth1), "
        "got 'eth0;touch x'"
    )


# --------------------------------------------------------------------------- over ssh


@pytest.fixture(scope="module")
def ssh_setup(tmp_path_factory):
    """A client key and a free port for private sshd servers; skips if sshd cannot run."""
    why = sshd.unavailable()
    if why:
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("ssh")
    return folder, sshd.make_keys(folder), sshd.free_port()


@pytest.mark.multiworker
def test_multi_node_checks_hosts_over_ssh_then_trains(tmp_path, ssh_setup) -> None:
    folder, key, port = ssh_setup
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    with sshd.sshd(folder / "local", "127.0.0.1", port, key):
        proc = run([str(MULTI), "--hostfile", str(hostfile), str(QUICKSTART), *ONE_EPOCH,
                    "--ssh-port", str(port), "--ssh-identity-file", str(key)], tmp_path)  # fmt: skip
    expect(proc, 0)
    here = subprocess.run([str(VENV_PY), "-m", "hvd_train", "doctor", "--versions"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          check=True).stdout.strip()  # fmt: skip
    assert f"pre-flight: all 1 host(s) answer with {here}" in proc.stdout
    assert printed_command(proc.stdout)[1:5] == ["-np", "2", "-H", "localhost:2"]
    s = summary(tmp_path / "out")
    assert (s["status"], s["world_size"], s["epochs_completed"]) == ("completed", 2, 1)


def test_preflight_names_the_host_whose_versions_differ(tmp_path, ssh_setup) -> None:
    folder, key, port = ssh_setup
    # 127.0.0.2 is a host whose hvd_train is another release: its sshd, and so every session
    # it starts, sees a different hvd_train/__init__.py (bind-mounted in a mount namespace).
    # Only the version differs: the rest of __init__.py (its choice of Keras on TensorFlow 2.16+)
    # is what the other release would run too.
    init = (ROOT / "hvd_train" / "__init__.py").read_text()
    other = tmp_path / "other_init.py"
    other.write_text(re.sub(r'__version__ = "[^"]*"', '__version__ = "0.0.9"', init))
    assert 'version__ = "0.0.9"' in other.read_text()
    bind = ("unshare", "--mount", "--propagation", "private", "sh", "-c",
            f'mount --bind {other} {ROOT}/hvd_train/__init__.py && exec "$@"', "sh")  # fmt: skip
    hostfile = tmp_path / "hosts"
    hostfile.write_text("127.0.0.1 slots=1\n127.0.0.2 slots=1\n")
    with contextlib.ExitStack() as stack:
        stack.enter_context(sshd.sshd(folder / "a", "127.0.0.1", port, key))
        try:
            stack.enter_context(sshd.sshd(folder / "b", "127.0.0.2", port, key, wrap=bind))
        except RuntimeError as e:
            pytest.skip(f"cannot start sshd in a mount namespace here: {e}")
        proc = run([str(MULTI), "--hostfile", str(hostfile), str(QUICKSTART),
                    "--ssh-port", str(port), "--ssh-identity-file", str(key)], tmp_path)  # fmt: skip
    expect(proc, 3)
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 2, proc.stderr
    assert re.fullmatch(
        r"multi_node\.sh: error: host 127\.0\.0\.2: versions differ: hvd_train=0\.0\.9 "
        rf"tensorflow=\S+ horovod=\S+ there, hvd_train={re.escape(hvd_train.__version__)} "
        r"tensorflow=\S+ horovod=\S+ here "
        r"\(every host needs the same install\)",
        errors[0],
    ), errors[0]
    assert errors[1] == "multi_node.sh: error: pre-flight failed on 1 host(s)"
    assert "horovodrun" not in proc.stdout


def test_preflight_names_the_host_that_does_not_answer(tmp_path, ssh_setup) -> None:
    folder, key, port = ssh_setup
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=1\n")  # nothing listens on the port
    proc = expect(run([str(MULTI), "--hostfile", str(hostfile), str(QUICKSTART),
                       "--ssh-port", str(port), "--ssh-identity-file", str(key)], tmp_path), 3)  # fmt: skip
    assert proc.stderr.startswith(
        f"multi_node.sh: error: host localhost: not reachable over ssh: ssh: connect to host "
        f"localhost port {port}: Connection refused"
    ), proc.stderr


@pytest.fixture(scope="module")
def two_hosts(ssh_setup):
    """Two network namespaces joined by a veth pair (10.213.7.1 and .2 on `hvd0`), sshd in each.

    Like real hosts, each resolves its own name to its own address: `ip netns exec` mounts
    /etc/netns/NAME/hosts over /etc/hosts for everything started in NAME.
    """
    if not shutil.which("ip") or not shutil.which("unshare"):
        pytest.skip("needs iproute2 (ip netns) and util-linux (unshare)")
    folder, key, port = ssh_setup
    tag = uuid.uuid4().hex[:6]
    names = [f"hvd{tag}a", f"hvd{tag}b"]
    setup = [
        *(["ip", "netns", "add", n] for n in names),
        ["ip", "link", "add", f"hv{tag}a", "type", "veth", "peer", "name", f"hv{tag}b"],
        *(
            ["ip", "link", "set", f"hv{tag}{s}", "netns", n]
            for s, n in zip("ab", names, strict=False)
        ),
    ]
    for i, n in enumerate(names):
        ns = ["ip", "netns", "exec", n, "ip"]
        setup += [[*ns, "link", "set", f"hv{tag}{'ab'[i]}", "name", "hvd0"],
                  [*ns, "addr", "add", f"10.213.7.{i + 1}/24", "dev", "hvd0"],
                  [*ns, "link", "set", "hvd0", "up"], [*ns, "link", "set", "lo", "up"]]  # fmt: skip
    hosts_files = [pathlib.Path("/etc/netns", n, "hosts") for n in names]
    try:
        for i, path in enumerate(hosts_files):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"127.0.0.1 localhost\n10.213.7.{i + 1} {socket.gethostname()}\n")
        for cmd in setup:
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                pytest.skip(f"cannot make network namespaces here: {' '.join(cmd)}: {done.stderr}")
        with contextlib.ExitStack() as stack:
            for i, n in enumerate(names):
                stack.enter_context(sshd.sshd(folder / n, f"10.213.7.{i + 1}", port, key, netns=n))
            yield names, key, port, hosts_files
    finally:
        for n, path in zip(names, hosts_files, strict=False):
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
            shutil.rmtree(path.parent, ignore_errors=True)


def launch_from_first_host(names: list[str], cmd: list[str], tmp_path: pathlib.Path):
    """Runs `cmd` in the first namespace, with a private ~/.ssh for horovodrun's known_hosts.

    Returns (the CompletedProcess, every socket its processes there listened on meanwhile)."""
    dot_ssh = tmp_path / "dot_ssh"
    dot_ssh.mkdir(exist_ok=True)
    pathlib.Path("/root/.ssh").mkdir(mode=0o700, exist_ok=True)
    wrapped = ["ip", "netns", "exec", names[0], "unshare", "--mount", "--propagation", "private",
               "sh", "-c", f'mount --bind {dot_ssh} /root/.ssh && exec "$@"', "sh", *cmd]  # fmt: skip
    return finish_listening(start(wrapped, tmp_path), 400)


@pytest.mark.multiworker
def test_multi_node_trains_across_two_hosts_in_network_namespaces(tmp_path, two_hosts) -> None:
    names, key, port, _ = two_hosts
    hostfile = tmp_path / "hosts"
    hostfile.write_text("10.213.7.1 slots=1\n10.213.7.2 slots=1\n")
    # Launched from the first host, as on a cluster: horovodrun reaches the second over ssh.
    cmd = [str(MULTI), "--hostfile", str(hostfile), str(QUICKSTART), *ONE_EPOCH,
           "--ssh-port", str(port), "--ssh-identity-file", str(key), "--network-interface", "hvd0"]  # fmt: skip
    proc, listening = launch_from_first_host(names, cmd, tmp_path)
    expect(proc, 0)
    assert "pre-flight: all 2 host(s) answer" in proc.stdout
    assert printed_command(proc.stdout)[1:5] == ["-np", "2", "-H", "10.213.7.1:1,10.213.7.2:1"]
    s = summary(tmp_path / "out")
    assert (s["status"], s["world_size"], s["epochs_completed"]) == ("completed", 2, 1)
    # On the first host, horovodrun's rendezvous server (and anything else its processes
    # there open: rank 0's Gloo listener) listens on that host's address on the named
    # interface, not on all (docs/security.md).
    assert {x.address for x in listening} == {"10.213.7.1"}, listening
    assert any(x.process == "horovodrun" for x in listening), listening
    # Rank 1 ran on the second host: its sshd let the launcher in (pre-flight, then the worker).
    second_sshd_log = (ssh_folder(key) / names[1] / "sshd.log").read_text()
    assert second_sshd_log.count("Accepted publickey for root from 10.213.7.1") >= 2


@pytest.mark.multiworker
def test_multi_node_without_an_interface_says_horovodrun_searches_then_trains(
    tmp_path, two_hosts
) -> None:
    """No --network-interface: one line says horovodrun searches for the hosts' common
    interface (its services listen on all interfaces meanwhile); its rendezvous server then
    listens on the first host's address on the interface found."""
    names, key, port, _ = two_hosts
    hostfile = tmp_path / "hosts"
    hostfile.write_text("10.213.7.1 slots=1\n10.213.7.2 slots=1\n")
    cmd = [str(MULTI), "--hostfile", str(hostfile), str(QUICKSTART), *ONE_EPOCH,
           "--ssh-port", str(port), "--ssh-identity-file", str(key)]  # fmt: skip
    proc, listening = launch_from_first_host(names, cmd, tmp_path)
    expect(proc, 0)
    assert proc.stderr.count("no --network-interface: unless these hosts are all this") == 1
    assert summary(tmp_path / "out")["status"] == "completed"
    # The search's own services, when seen, on all interfaces (0.0.0.0); nothing else.
    assert "10.213.7.1" in {x.address for x in listening if x.process == "horovodrun"}, listening
    assert {x.address for x in listening} <= {"10.213.7.1", "0.0.0.0"}, listening


def test_preflight_catches_a_host_name_that_resolves_to_loopback(tmp_path, two_hosts) -> None:
    # Debian's default /etc/hosts maps the host's name to 127.0.1.1; Horovod 0.28.1's Gloo then
    # makes the peers connect to themselves, and the job aborts after it started.
    names, key, port, hosts_files = two_hosts
    saved = hosts_files[1].read_text()
    hosts_files[1].write_text(f"127.0.0.1 localhost\n127.0.1.1 {socket.gethostname()}\n")
    try:
        hostfile = tmp_path / "hosts"
        hostfile.write_text("10.213.7.1 slots=1\n10.213.7.2 slots=1\n")
        cmd = [str(MULTI), "--hostfile", str(hostfile), str(QUICKSTART),
               "--ssh-port", str(port), "--ssh-identity-file", str(key)]  # fmt: skip
        proc = expect(launch_from_first_host(names, cmd, tmp_path)[0], 3)
    finally:
        hosts_files[1].write_text(saved)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("multi_node.sh:")]
    assert errors[0] == (
        f"multi_node.sh: error: host 10.213.7.2: its name '{socket.gethostname()}' resolves to "
        "127.0.1.1, not to its address on the job's network: Horovod's Gloo controller needs "
        "that (map the name in /etc/hosts, or use --mpi)"
    ), proc.stderr


def ssh_folder(key: pathlib.Path) -> pathlib.Path:
    return key.parent
