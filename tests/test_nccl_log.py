"""summary.json's `nccl_network`: which network NCCL's all-reduce took between hosts, read from
NCCL's own log (hvd_train/base/nccl_log.py). No GPU here: the logs are NCCL's lines as NCCL
2.x prints them at NCCL_DEBUG=INFO, in the shape of those posted in NVIDIA/nccl's issues (an
InfiniBand cluster, NVIDIA/nccl#952; RoCE on DGX H100s, NVIDIA/nccl-tests#185; sockets, the
fallback with no adapter), with our own host names and addresses."""

from __future__ import annotations

import os

import pytest

from hvd_train.base import nccl_log

INFINIBAND = """\
node1:4113:4113 [0] NCCL INFO Bootstrap : Using ib0:10.0.0.1<0>
node1:4113:4113 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal implementation
node1:4113:4113 [0] NCCL INFO cudaDriverVersion 12080
node1:4113:4180 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.0.1<0>
node1:4113:4180 [0] NCCL INFO Using network IB
node1:4113:4180 [0] NCCL INFO comm 0x55d0c8a0 rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 18000 commId 0x1f2e - Init COMPLETE
"""
ROCE = """\
node2:52:52 [0] NCCL INFO Bootstrap : Using enp220s0np0:10.0.1.2<0>
node2:52:97 [0] NCCL INFO NET/IB : Using [0]mlx5_10:1/RoCE [1]mlx5_11:1/RoCE [RO]; OOB enp220s0np0:10.0.1.2<0>
node2:52:97 [0] NCCL INFO Using non-device net plugin version 0
node2:52:97 [0] NCCL INFO Using network IB
"""
SOCKETS = """\
node1:977:977 [0] NCCL INFO Bootstrap : Using eth0:10.0.2.1<0>
node1:977:1012 [0] NCCL INFO NET/IB : No device found.
node1:977:1012 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.2.1<0>
node1:977:1012 [0] NCCL INFO Using network Socket
"""
PLUGIN = """\
node3:8:8 [0] NCCL INFO Plugin Path : /opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so
node3:8:40 [0] NCCL INFO P2P plugin IBext
node3:8:40 [0] NCCL INFO Using network IBext
"""
# NCCL set up but no collective crossed a host yet: no network line.
BOOTSTRAP_ONLY = "node1:977:977 [0] NCCL INFO Bootstrap : Using eth0:10.0.2.1<0>\n"


@pytest.mark.parametrize(
    "log, expected",
    [(INFINIBAND, "IB"), (ROCE, "IB"), (SOCKETS, "Socket"), (PLUGIN, "IBext"),
     (BOOTSTRAP_ONLY, None)],
    ids=["infiniband", "roce", "sockets", "plugin", "no-network-line"],
)  # fmt: skip
def test_the_network_is_the_one_nccls_log_names(tmp_path, log, expected) -> None:
    path = tmp_path / "nccl.log"
    path.write_text(log)
    assert nccl_log.network(str(path)) == expected


def test_no_log_is_no_network(tmp_path) -> None:
    """A CPU worker never routes NCCL's log: the run records no network, and says nothing."""
    assert nccl_log.network(str(tmp_path / "absent.log")) is None


def test_a_gpu_worker_sends_nccls_start_up_and_network_lines_to_its_own_file(tmp_path) -> None:
    environ: dict[str, str] = {}
    assert nccl_log.route(environ) is True
    assert environ["NCCL_DEBUG"] == "INFO"
    assert environ["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert environ["NCCL_DEBUG_FILE"] == nccl_log.path()
    assert os.path.basename(nccl_log.path()) == f"hvd_train-nccl-{os.getpid()}.log"


def test_the_users_own_nccl_debug_is_left_alone() -> None:
    environ = {"NCCL_DEBUG": "WARN", "NCCL_DEBUG_FILE": "/scratch/nccl.%h.%p"}
    assert nccl_log.route(environ) is False
    assert environ == {"NCCL_DEBUG": "WARN", "NCCL_DEBUG_FILE": "/scratch/nccl.%h.%p"}


def test_the_users_subsystems_are_kept() -> None:
    environ = {"NCCL_DEBUG_SUBSYS": "ALL"}
    nccl_log.route(environ)
    assert environ["NCCL_DEBUG_SUBSYS"] == "ALL"


def test_a_percent_in_the_temporary_folder_reaches_nccl_as_one(monkeypatch, tmp_path) -> None:
    """NCCL expands %h and %p in NCCL_DEBUG_FILE and reads %% as a literal %."""
    folder = tmp_path / "50%host"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr("tempfile.tempdir", None)  # gettempdir() reads TMPDIR again
    environ: dict[str, str] = {}
    nccl_log.route(environ)
    assert environ["NCCL_DEBUG_FILE"] == str(folder).replace("%", "%%") + os.sep + os.path.basename(
        nccl_log.path()
    )
    assert "%%host" in environ["NCCL_DEBUG_FILE"] and "%host" in nccl_log.path()


@pytest.mark.parametrize(
    "network, hosts, warns",
    [("Socket", 2, True), ("Socket", 1, False), ("IB", 4, False), (None, 2, False)],
)
def test_one_warning_line_for_sockets_between_hosts(network, hosts, warns) -> None:
    line = nccl_log.sockets_warning(network, hosts)
    assert (line is not None) == warns
    if line:
        assert "\n" not in line and "TCP sockets" in line and f"{hosts} hosts" in line
