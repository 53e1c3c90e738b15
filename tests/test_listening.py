"""What a job listens on: real 2-worker jobs on one host, their listening TCP sockets read from
/proc/net/tcp* while they train (horovodrun, its workers, mpirun under MPI; docs/security.md),
and the one line `hvd-train launch` says where horovodrun must search for an interface itself.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import socket
import subprocess

import pytest
from harness import (
    BIN,
    PYTHON,
    QUICKSTART,
    check,
    finish_watching,
    listening,
    open_mpi_transports,
    start,
    two_local_hosts,
    variant,
)

from hvd_train.config import load_config
from hvd_train.launcher.horovodrun import Placement, command, mpi_note, probe_note

# The quickstart cut to one epoch of 4 steps: what listens is under test, not the training.
SETS = ["train.epochs=1", "train.steps_per_epoch=4", "train.verbose=false",
        "logging.tensorboard=false", "run.dir=out"]  # fmt: skip
TRAIN = ["--config", str(QUICKSTART), *(arg for s in SETS for arg in ("--set", s))]


def trains(cmd: list[str], tmp_path: pathlib.Path) -> tuple[set, set, str, dict]:
    """Runs the job to completion; returns every socket its processes listened on meanwhile,
    the Open MPI transports they loaded, the job's stderr and its summary.json."""
    proc, (seen, transports) = finish_watching(start(cmd, tmp_path), 300, listening,
                                               open_mpi_transports)  # fmt: skip
    check(proc)
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (s["status"], s["world_size"], s["epochs_completed"]) == ("completed", 2, 1), s
    return seen, transports, proc.stderr, s


@pytest.mark.processes
@pytest.mark.multiworker
@pytest.mark.parametrize(
    ("launcher", "controller"),
    # Each launcher with its own default controller (Gloo for `hvd-train launch`, MPI for
    # horovodrun where Open MPI is installed); the other two pairs are CI's (harness.variant).
    [("hvd-train launch", "--gloo"), variant("hvd-train launch", "--mpi"),
     ("horovodrun", "--mpi"), variant("horovodrun", "--gloo")],
)  # fmt: skip
def test_a_job_on_one_host_listens_on_loopback_only(tmp_path, launcher, controller) -> None:
    """Nothing of a 2-worker job on one host listens beyond loopback, under `hvd-train launch
    --np 2` (which passes `--network-interfaces lo`, and under MPI `--mca btl_base_include
    self,vader`) as under plain `horovodrun -np 2 -H localhost:2` (no interface named:
    horovodrun picks `lo`, and under MPI, as the install patches it, keeps the ranks on shared
    memory and puts mpirun's listeners on loopback). Unpatched, mpirun listens on 0.0.0.0 and
    [::] (Open MPI 4.1's out-of-band listener), and plain horovodrun's ranks on 0.0.0.0:1024+."""
    if launcher == "horovodrun":
        cmd = [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", controller,
               PYTHON, "-m", "hvd_train", *TRAIN]  # fmt: skip
    else:
        cmd = [PYTHON, "-m", "hvd_train", "launch", "--np", "2", controller, *TRAIN]
    seen, transports, stderr, s = trains(cmd, tmp_path)
    assert [x for x in seen if not x.on_loopback()] == [], seen
    # Under MPI the ranks load shared memory's transport, and not libfabric's, whose close
    # sleeps 1 s at every rank's end (patches/horovod-0.28.1/0016); under Gloo, neither.
    assert ({"vader", "ofi"} & transports) == ({"vader"} if controller == "--mpi" else set())
    # Seen for sure, there for the job's life: horovodrun's rendezvous server (Gloo), mpirun's
    # listeners (MPI). Gloo's own listeners live only while the ranks connect: seen or not,
    # they are in the check above.
    always = "mpirun" if controller == "--mpi" else "horovodrun"
    assert any(x.process == always for x in seen), seen
    if launcher == "hvd-train launch":
        if controller == "--mpi":  # in the horovodrun command the launch prints
            assert "--mca btl_base_include self,vader" in stderr, stderr[-3000:]
        # The launch's start reached the workers (through mpirun too): start-up counts from
        # the command.
        startup = s["startup_s"]
        assert list(startup)[:2] == ["process", "config"] and startup["process"] > 0, startup


@pytest.mark.processes
@pytest.mark.multiworker
def test_an_elastic_job_on_one_host_listens_on_loopback_only(tmp_path) -> None:
    """Nothing of a Horovod Elastic job on one host listens beyond loopback: two one-slot hosts,
    both this machine (localhost and 127.0.0.1); horovodrun's rendezvous server starts once the
    hosts are known, each worker has Gloo's listener and a notification service. (A worker
    killed, the job re-forms: tests/test_faults.py.)"""
    discover = two_local_hosts(tmp_path)
    elastic = ["elastic.enabled=true", "elastic.min_workers=1",
               f"elastic.discovery_script={discover}", "optimizer.warmup_epochs=0"]  # fmt: skip
    cmd = [PYTHON, "-m", "hvd_train", "launch", "--np", "2", *TRAIN,
           *(arg for s in elastic for arg in ("--set", s))]  # fmt: skip
    seen, _, _, _ = trains(cmd, tmp_path)
    assert [x for x in seen if not x.on_loopback()] == [], seen
    assert any(x.process == "horovodrun" for x in seen), seen
    # The two workers' notification services, there for each worker's life.
    assert len([x for x in seen if x.process.startswith("python")]) >= 2, seen


def test_horovods_servers_listen_where_they_are_told_and_elsewhere_as_before() -> None:
    """Horovod as patches/horovod-0.28.1/0008 leaves it, in this process: the
    rendezvous server on the address horovodrun gives it, an Elastic worker's notification
    service on the one address of its interface; other callers' servers as before."""
    from horovod.runner.common.util import network, secret
    from horovod.runner.elastic.worker import WorkerNotificationService
    from horovod.runner.http.http_server import RendezvousServer

    def bound(server) -> str:
        return server.socket.getsockname()[0]

    told, default = RendezvousServer(address="127.0.0.1"), RendezvousServer()
    try:
        told.start(), default.start()
        assert (bound(told._httpd), bound(default._httpd)) == ("127.0.0.1", "0.0.0.0")
    finally:
        told.stop(), default.stop()
    key = secret.make_secret_key()
    worker = WorkerNotificationService(key, "lo", manager=None)
    other = network.BasicService("a service", key, "lo")
    try:
        assert worker.addresses() == {"lo": [("127.0.0.1", worker.get_port())]}
        assert (bound(worker._server), bound(other._server)) == ("127.0.0.1", "0.0.0.0")
    finally:
        worker.shutdown(), other.shutdown()


@pytest.fixture
def mpirun(monkeypatch):
    """Horovod's mpi_run as the install patches it, mpirun's start faked: a function of
    (hosts, --mpi-args, environment) returning the mpirun command horovodrun would start and
    the environment it would start it with."""
    from horovod.runner import mpi_run as m
    from horovod.runner.common.util.settings import Settings

    def open_mpi(tcp_flag, env=None):  # new lists, as Horovod's: mpi_run adds to them
        return list(m._OMPI_FLAGS), list(m._NO_BINDING_ARGS), m._OMPI_IMPL

    monkeypatch.setattr(m, "_get_mpi_implementation_flags", open_mpi)
    started = []
    monkeypatch.setattr(
        m.safe_shell_exec, "execute", lambda cmd, env, **_: started.append((cmd, env)) or 0
    )

    def start(hosts: str, mpi_args: str = "", env: dict | None = None) -> tuple[str, dict]:
        started.clear()
        settings = Settings(num_proc=2, hosts=hosts, extra_mpi_args=mpi_args, run_func_mode=True)
        m.mpi_run(settings, ["lo"], dict(env or {}), ["true"])
        [(cmd, job_env)] = started
        return cmd, job_env

    return start


def test_horovodrun_keeps_an_open_mpi_job_on_one_host_on_loopback(
    mpirun, monkeypatch, tmp_path, capsys
) -> None:
    """Horovod's mpi_run as patches/horovod-0.28.1/0010 leaves it, mpirun's start
    faked: every host this machine, `-mca btl_base_include self,vader` (not twice: the
    launchers pass it in --mpi-args) and the library first in mpirun's LD_PRELOAD, a user's
    entry kept; a host elsewhere, neither; the library not built, one line, and mpirun starts
    as before."""
    from horovod.runner import mpi_run as m

    def preload(env: dict) -> str:
        return env.get("LD_PRELOAD", "")

    cmd, env = mpirun("localhost:1,127.0.0.1:1", env={"LD_PRELOAD": "libuser.so"})
    assert cmd.count("-mca btl_base_include self,vader") == 1, cmd
    assert preload(env) == f"{m._LOOPBACK_BIND}:libuser.so" and os.path.isfile(m._LOOPBACK_BIND)
    cmd, _ = mpirun("localhost:2", mpi_args="--mca btl_base_include self,vader")
    assert cmd.count("btl_base_include") == 1, cmd
    cmd, env = mpirun("localhost:1,192.0.2.99:1")  # a host elsewhere (TEST-NET-1)
    assert ("btl_base_include" in cmd, preload(env)) == (False, ""), cmd
    capsys.readouterr()
    monkeypatch.setattr(m, "_LOOPBACK_BIND", str(tmp_path / "not-built.so"))
    cmd, env = mpirun("localhost:2")
    assert ("-mca btl_base_include self,vader" in cmd, preload(env)) == (True, ""), cmd
    err = capsys.readouterr().err
    assert err.startswith("horovodrun: mpirun listens on all interfaces, not on loopback alone: "
                          f"{tmp_path / 'not-built.so'} was not built"), err  # fmt: skip
    assert err.count("\n") == 1, err


def test_horovodrun_leaves_open_mpis_libfabric_transport_closed_on_one_host(mpirun) -> None:
    """patches/horovod-0.28.1/0016, mpirun's start faked: every host this machine, horovodrun's
    `-mca btl ^openib` becomes `-mca btl ^openib,ofi` (the launchers' btl_base_include in
    --mpi-args too); a btl list or an ofi transport that the user chose stays, and so does a
    job with a host elsewhere."""

    def btl(hosts: str, mpi_args: str = "", env: dict | None = None) -> list[str]:
        """The btl lists of the mpirun command horovodrun starts."""
        return re.findall(r"-?-mca btl (\S+)", mpirun(hosts, mpi_args, env)[0])

    assert btl("localhost:2") == ["^openib,ofi"]
    assert btl("localhost:1,127.0.0.1:1", "--mca btl_base_include self,vader") == ["^openib,ofi"]
    assert btl("localhost:1,192.0.2.99:1") == ["^openib"]  # a host elsewhere (TEST-NET-1)
    assert btl("localhost:2", "--mca btl self,tcp") == ["^openib", "self,tcp"]
    assert btl("localhost:2", "--mca btl_base_include self,ofi") == ["^openib"]
    assert btl("localhost:2", "--mca btl_ofi_mode 2") == ["^openib"]
    # "ofi" inside another word names no transport
    assert btl("localhost:2", "--mca orte_tmpdir_base /tmp/profiles") == ["^openib,ofi"]
    assert btl("localhost:2", env={"OMPI_MCA_btl": "self,vader"}) == ["^openib"]
    assert btl("localhost:2", env={"OMPI_MCA_btl_base_include": "ofi"}) == ["^openib"]


@pytest.mark.processes
def test_the_library_binds_to_loopback_in_mpirun_alone_and_leaves_the_ranks(tmp_path) -> None:
    """The library horovodrun puts in mpirun's LD_PRELOAD (scripts/loopback_bind.c), in a
    program named mpirun: a bind to every interface, IPv4 or IPv6, lands on loopback, one to
    an address stays, and its entry leaves LD_PRELOAD (the ranks mpirun starts never load it;
    another entry stays). In any other program (the shell that starts mpirun) nothing changes."""
    from horovod.runner import mpi_run

    probe = ("import os, socket\n"
             "for family, host in ((socket.AF_INET, ''), (socket.AF_INET6, '::'),\n"
             "                     (socket.AF_INET, '127.0.0.2')):\n"
             "    s = socket.socket(family)\n"
             "    s.bind((host, 0))\n"
             "    print(s.getsockname()[0])\n"
             "print(os.environ.get('LD_PRELOAD'))\n")  # fmt: skip
    python = os.path.realpath(PYTHON)
    named = tmp_path / "mpirun"
    named.symlink_to(python)
    env = {**os.environ, "LD_PRELOAD": f"{mpi_run._LOOPBACK_BIND}:libm.so.6"}
    outs = []
    for program in (named, pathlib.Path(python)):
        proc = subprocess.run([str(program), "-I", "-c", probe], env=env, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        outs.append(proc.stdout.split())
    assert outs[0] == ["127.0.0.1", "::1", "127.0.0.2", "libm.so.6"], outs
    assert outs[1] == ["0.0.0.0", "::", "127.0.0.2", env["LD_PRELOAD"]], outs


def test_where_horovodrun_must_search_for_an_interface_launch_says_so_in_one_line() -> None:
    """Hosts on other machines and no interface named, or an elastic job without one (its
    hosts unknown at launch): the one case where something listens on all interfaces of a Gloo
    job, said before it starts."""
    cfg = load_config(QUICKSTART)
    for hosts in (None, "localhost:2", "127.0.0.1:1,localhost:1"):  # lo: nothing to search
        assert probe_note(cfg.elastic, hosts, "") is None
    assert probe_note(cfg.elastic, "node-a:2,node-b:2", "eth1") is None  # named
    note = probe_note(cfg.elastic, "node-a:2,node-b:2", "")
    assert note.startswith("no --network-interface: unless these hosts are all this machine, "
                           "horovodrun finds their common interface through services listening "
                           "on all interfaces of every host while it starts"), note  # fmt: skip
    elastic = load_config(QUICKSTART, ["elastic.enabled=true", "elastic.discovery_script=d.sh"])
    assert "unless the discovery script's hosts are all" in probe_note(elastic.elastic, None, "")
    assert probe_note(elastic.elastic, None, "eth1") is None


def test_an_mpi_job_across_hosts_is_told_what_listens_on_all_interfaces_in_one_line() -> None:
    """Across hosts Open MPI's listeners stay on every interface: said before the job starts;
    on one host, or under Gloo, nothing to say."""
    for controller, hosts in (("mpi", None), ("mpi", "localhost:2"), ("gloo", "node-a:2,node-b:2"),
                              ("mpi", "127.0.0.1:1,localhost:1")):  # fmt: skip
        assert mpi_note(controller, hosts) is None, (controller, hosts)
    note = mpi_note("mpi", "node-a:2,node-b:2")
    assert note.startswith("--mpi across hosts: mpirun's out-of-band listener and each rank's "
                           "TCP transport listen on all interfaces of their host"), note  # fmt: skip
    assert "\n" not in note


def test_an_elastic_job_talks_on_the_interface_it_is_given(tmp_path) -> None:
    """`--network-interface` reaches horovodrun for an elastic job too (none by default: its
    hosts come and go)."""
    script = tmp_path / "d.sh"
    script.write_text("#!/bin/sh\necho localhost:2\n")
    script.chmod(0o755)
    cfg = load_config(QUICKSTART, ["elastic.enabled=true", f"elastic.discovery_script={script}"])
    named, _ = command(cfg, str(QUICKSTART), [], Placement(np=2, nics="eth1"))
    i = named.index("--network-interfaces")
    assert named[i + 1] == "eth1" and named.index(PYTHON) > i, named
    assert "--network-interfaces" not in command(cfg, str(QUICKSTART), [], Placement(np=2))[0]


def test_a_socket_listening_on_all_interfaces_is_seen_as_such() -> None:
    """The reader of /proc/net/tcp* the tests above rely on, on sockets of this process."""
    from harness import listening

    sockets = [socket.socket(), socket.socket(), socket.socket(socket.AF_INET6)]
    try:
        for s, host in zip(sockets, ("127.0.0.1", "", "::"), strict=True):
            s.bind((host, 0))
            s.listen()
        seen = {(x.address, x.port, x.on_loopback()) for x in listening(os.getpid())}
        ports = [s.getsockname()[1] for s in sockets]
        assert {("127.0.0.1", ports[0], True), ("0.0.0.0", ports[1], False),
                ("::", ports[2], False)} <= seen, seen  # fmt: skip
    finally:
        for s in sockets:
            s.close()
