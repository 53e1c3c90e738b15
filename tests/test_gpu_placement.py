"""One worker per GPU, never two on one (issue 60): how many workers, on which device, bound to
which cores. GPU hosts are stood in for by a fake `nvidia-smi` on PATH that prints what the
driver prints (`-L` with plain GPUs and MIG instances, `topo -m`), and Slurm by its variables;
the launcher's decisions run in-process."""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys

import harness
import pytest
from harness import QUICKSTART, WORKERS

from hvd_train import cli
from hvd_train.base import gpus
from hvd_train.launcher import horovodrun

H100 = "NVIDIA H100 80GB HBM3"


def gpu_lines(count: int) -> list[str]:
    """`nvidia-smi -L` on a host of `count` whole GPUs."""
    return [
        f"GPU {i}: {H100} (UUID: GPU-{i}0000000-aaaa-bbbb-cccc-dddddddddddd)" for i in range(count)
    ]


# One A100 split into three MIG instances, as the driver lists them under their GPU.
MIG_A100 = [
    "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)",
    "  MIG 3g.20gb     Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)",
    "  MIG 2g.10gb     Device  1: (UUID: MIG-cba663e8-9bed-5b25-b243-5985ef7c9beb)",
    "  MIG 1g.5gb      Device  2: (UUID: MIG-1d4fa523-eb0c-5ac2-9e5e-d0f8a6a5a3e8)",
]
MIG_UUIDS = [line.split("UUID: ")[1].rstrip(")") for line in MIG_A100[1:]]

# `nvidia-smi topo -m` on a two-socket host with 8 GPUs: GPUs 0-3 near the first socket's
# cores and their hyperthreads (0-15,32-47), GPUs 4-7 near the second's, the header
# underlined with terminal escapes as nvidia-smi may print it.
TOPO = "\n".join(
    [
        "\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tNIC0\tCPU Affinity\t"
        "NUMA Affinity\tGPU NUMA ID\x1b[0m",
        *(
            f"GPU{i}\t"
            + "\t".join(" X " if j == i else "NV18" for j in range(8))
            + f"\tSYS\t{'0-15,32-47' if i < 4 else '16-31,48-63'}\t{i // 4}\t\tN/A"
            for i in range(8)
        ),
        "NIC0\t" + "\t".join(["SYS"] * 8) + "\t X ",
        "",
        "Legend:",
        "  X    = Self",
        "  NV#  = Connection traversing a bonded set of # NVLinks",
    ]
)


@pytest.fixture
def nvidia_smi(tmp_path, monkeypatch):
    """Puts a fake nvidia-smi first on PATH; call it with the lines `-L` prints."""

    def install(lines: list[str], topo: str = TOPO) -> None:
        (tmp_path / "L.txt").write_text("\n".join(lines) + "\n")
        (tmp_path / "topo.txt").write_text(topo + "\n")
        fake = tmp_path / "bin" / "nvidia-smi"
        fake.parent.mkdir(exist_ok=True)
        fake.write_text(
            "#!/bin/sh\n"
            f'[ "$1" = -L ] && exec cat {tmp_path / "L.txt"}\n'
            f'[ "$1 $2" = "topo -m" ] && exec cat {tmp_path / "topo.txt"}\n'
            "exit 6\n"
        )
        fake.chmod(0o755)
        monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")

    for key in ("CUDA_VISIBLE_DEVICES", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"):  # fmt: skip
        monkeypatch.delenv(key, raising=False)
    return install


def launch(capsys, *args: str) -> tuple[int, list[str], str]:
    """`hvd-train launch --print-command` in-process: (exit code, command, stderr)."""
    code = cli.main(["launch", "--config", str(QUICKSTART), "--print-command", *args])
    out, err = capsys.readouterr()
    return code, shlex.split(out), err


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_a_gpu_split_into_mig_instances_counts_each_instance(nvidia_smi) -> None:
    nvidia_smi(MIG_A100 + gpu_lines(2)[1:])  # GPU 0 split in three, GPU 1 whole
    assert horovodrun.count_gpus() == 4
    assert [d.uuid for d in gpus.devices()][:3] == MIG_UUIDS


@pytest.mark.parametrize(
    ("visible", "count"),
    [(None, 1), ("0", 1), ("", 0), ("-1", 0), ("0,1", 1), ("GPU-00000000", 1)],
)
def test_cuda_visible_devices_narrows_the_count_as_cuda_reads_it(
    nvidia_smi, monkeypatch, visible, count
) -> None:
    nvidia_smi(gpu_lines(1))
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert horovodrun.count_gpus() == count


def test_cuda_visible_devices_names_mig_instances_by_uuid(nvidia_smi, monkeypatch) -> None:
    nvidia_smi(MIG_A100)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{MIG_UUIDS[2]},{MIG_UUIDS[0]}")
    assert [d.uuid for d in gpus.devices()] == [MIG_UUIDS[2], MIG_UUIDS[0]]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    nvidia_smi(gpu_lines(4))
    assert [d.index for d in gpus.devices()] == [1, 3]


def test_instances_of_one_gpu_never_each_get_a_worker(nvidia_smi, capsys) -> None:
    """Three MIG instances of one A100 would be three ranks on one GPU to NCCL, which ends
    such a job in "Duplicate GPU detected" (it has no MIG support: NVIDIA/nccl#1716): refused
    in one line naming MIG and the CUDA_VISIBLE_DEVICES that works, exit 2, before any job."""
    nvidia_smi(MIG_A100 + gpu_lines(2)[1:])  # GPU 0 split in three, GPU 1 whole
    code, argv, err = launch(capsys)
    assert (code, argv) == (2, [])
    assert err.splitlines() == [
        "hvd_train: error: MIG: 3 workers would train on instances of one GPU (GPU 0, "
        "GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77), and NCCL runs one rank per physical GPU "
        '(it ends such a job in "Duplicate GPU detected"); give each worker an instance of its '
        f"own GPU (CUDA_VISIBLE_DEVICES={MIG_UUIDS[0]},GPU-10000000-aaaa-bbbb-cccc-dddddddddddd) "
        "or train on whole GPUs"
    ], err


def test_one_mig_instance_per_gpu_gets_a_worker_each(nvidia_smi, monkeypatch, capsys) -> None:
    """Narrowed to one instance of each GPU (or --np that takes one), every worker has a GPU
    of its own: one worker each, each pinned to its instance."""
    second = [line.replace("GPU 0:", "GPU 1:").replace("GPU-5d5b", "GPU-6e6c")
              .replace("MIG-", "MIG-2") for line in MIG_A100]  # fmt: skip
    nvidia_smi(MIG_A100 + second)
    own = [MIG_UUIDS[0], "MIG-2" + MIG_UUIDS[1][4:]]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(own))
    code, argv, _ = launch(capsys)
    assert code == 0 and flag(argv, "-np") == "2" and flag(argv, "-H") == "localhost:2"
    monkeypatch.setenv("HOROVOD_LOCAL_SIZE", "2")
    for local in (0, 1):
        monkeypatch.setenv("HOROVOD_LOCAL_RANK", str(local))
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(own))
        assert gpus.pin_mig_device().uuid == own[local]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    code, argv, _ = launch(capsys, "--np", "1")  # the first instance of GPU 0 alone
    assert code == 0 and flag(argv, "-np") == "1"


@pytest.mark.parametrize("local", [0, 1, 2])
def test_each_worker_on_a_mig_host_is_pinned_to_its_instance_by_uuid(
    nvidia_smi, monkeypatch, local
) -> None:
    nvidia_smi(MIG_A100)
    monkeypatch.setenv("HOROVOD_LOCAL_RANK", str(local))
    monkeypatch.setenv("HOROVOD_LOCAL_SIZE", "3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # the launcher's: all of GPU 0
    assert gpus.pin_mig_device().uuid == MIG_UUIDS[local]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == MIG_UUIDS[local]
    assert [d.uuid for d in gpus.devices()] == [MIG_UUIDS[local]], "the worker sees its own"


def test_workers_on_whole_gpus_are_left_to_choose_by_local_rank(nvidia_smi, monkeypatch) -> None:
    nvidia_smi(gpu_lines(8))
    monkeypatch.setenv("HOROVOD_LOCAL_RANK", "3")
    monkeypatch.setenv("HOROVOD_LOCAL_SIZE", "8")
    assert gpus.pin_mig_device() is None and "CUDA_VISIBLE_DEVICES" not in os.environ


def test_the_worker_pins_its_mig_instance_before_tensorflow_loads(nvidia_smi, monkeypatch) -> None:
    """`hvd-train train` (what horovodrun starts) sets CUDA_VISIBLE_DEVICES to the instance
    before it imports TensorFlow: CUDA reads it once."""
    from hvd_train.base import logs, startup
    from hvd_train.commands import train
    from hvd_train.record import stops
    from hvd_train.runtime.keras import binding

    nvidia_smi(MIG_A100)
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    seen = []

    class Loaded(Exception):
        pass

    def import_tensorflow() -> None:
        seen.append(os.environ.get("CUDA_VISIBLE_DEVICES"))
        raise Loaded

    monkeypatch.setattr(startup, "mark", lambda phase: None)  # this process's marks untouched
    monkeypatch.setattr(stops, "installed", lambda cfg: None)
    monkeypatch.setattr(logs, "quiet_tensorflow", lambda *args: None)
    monkeypatch.setattr(binding, "prepare", lambda choice: None)
    monkeypatch.setattr(binding, "import_tensorflow", import_tensorflow)
    with pytest.raises(Loaded):
        train.main(["--config", str(QUICKSTART)], "hvd-train")
    assert seen == [MIG_UUIDS[1]]


def test_hosts_without_np_start_every_slot(nvidia_smi, capsys) -> None:
    nvidia_smi(gpu_lines(8))
    code, argv, _ = launch(capsys, "--hosts", "a:8,b:8")
    assert code == 0 and flag(argv, "-np") == "16" and flag(argv, "-H") == "a:8,b:8"


@pytest.mark.parametrize(
    ("args", "named", "fix"),
    [
        (["--np", "2"], "--np 2: 2 workers on this host, which has 1 GPU(s)", "--np 1 or fewer"),
        (["--hosts", "localhost:2"], "--hosts localhost:2: 2 workers on this host, which has 1",
         "at most 1 slot(s) for this host"),
        (["--hosts", f"{socket.gethostname()}:2,b:1"], "2 workers on this host, which has 1",
         "at most 1 slot(s) for this host"),
    ],
)  # fmt: skip
def test_more_workers_than_gpus_on_this_host_is_one_line_and_exit_2(
    nvidia_smi, capsys, args, named, fix
) -> None:
    nvidia_smi(gpu_lines(1))
    code, argv, err = launch(capsys, *args)
    assert (code, argv) == (2, [])
    assert err.count("\n") == 1 and named in err and fix in err, err


def test_workers_up_to_the_gpus_here_and_any_on_other_hosts_are_started(nvidia_smi, capsys) -> None:
    nvidia_smi(gpu_lines(1))
    assert launch(capsys, "--np", "1")[0] == 0
    code, argv, _ = launch(capsys, "--hosts", "localhost:1,b:4")
    assert code == 0 and flag(argv, "-np") == "5"
    # horovodrun fills the hosts' slots in turn: one worker of these lands here.
    assert launch(capsys, "--hosts", "localhost:4", "--np", "1")[0] == 0
    assert launch(capsys, "--hosts", "b:2,localhost:4", "--np", "3")[0] == 0
    assert launch(capsys, "--hosts", "b:2,localhost:4", "--np", "4")[0] == 2


SLURM_KEYS = ("SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_TASKS_PER_NODE",
              "SLURM_NTASKS_PER_NODE", "SLURM_GPUS_ON_NODE")  # fmt: skip


def slurm(monkeypatch, **env: str) -> None:
    for key in SLURM_KEYS:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def test_slurm_gpus_a_node_win_over_fewer_tasks_a_node_and_say_so(monkeypatch, capsys) -> None:
    """launch/slurm.sbatch's `--ntasks-per-node=1` under `sbatch --gpus-per-node=8`."""
    slurm(monkeypatch, SLURM_JOB_NODELIST="gpu[01-02]", SLURM_NTASKS_PER_NODE="1",
          SLURM_GPUS_ON_NODE="8", SLURM_TASKS_PER_NODE="1(x2)")  # fmt: skip
    code, argv, err = launch(capsys, "--slurm")
    assert code == 0 and flag(argv, "-np") == "16" and flag(argv, "-H") == "gpu01:8,gpu02:8"
    said = [line for line in err.splitlines() if "SLURM_GPUS_ON_NODE" in line]
    assert len(said) == 1 and "8 GPUs a node" in said[0] and "1 task(s) a node" in said[0]


def test_slurm_more_tasks_a_node_than_gpus_is_one_line_and_exit_2(monkeypatch, capsys) -> None:
    slurm(monkeypatch, SLURM_JOB_NODELIST="gpu[01-02]", SLURM_NTASKS_PER_NODE="16",
          SLURM_GPUS_ON_NODE="8")  # fmt: skip
    code, argv, err = launch(capsys, "--slurm")
    assert (code, argv) == (2, []) and err.count("\n") == 1
    assert "16 tasks a node (SLURM_NTASKS_PER_NODE) but 8 GPUs a node" in err, err


def test_bound_workers_take_the_cores_nearest_their_gpu(nvidia_smi, monkeypatch) -> None:
    nvidia_smi(gpu_lines(8))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    found, topo = gpus.devices(), gpus.nvidia_smi("topo", "-m")
    # GPUs 0-3 share the first socket: a quarter of its cores and of their hyperthreads each.
    assert gpus.nearest_cores(1, 8, found, topo) == [4, 5, 6, 7, 36, 37, 38, 39]
    assert gpus.nearest_cores(4, 8, found, topo) == [16, 17, 18, 19, 48, 49, 50, 51]
    # One worker per socket: all of its socket's cores.
    assert gpus.nearest_cores(0, 1, found, topo) == [*range(16), *range(32, 48)]
    assert gpus.nearest_cores(8, 9, found, topo) == [], "a worker without a GPU: no GPU's cores"


def test_bind_cores_takes_the_gpus_cores_on_a_gpu_host_else_a_block(
    nvidia_smi, monkeypatch, tmp_path
) -> None:
    from hvd_train.runtime import cores

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    nvidia_smi(gpu_lines(8))
    assert cores.for_worker(5, 8) == [20, 21, 22, 23, 52, 53, 54, 55]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6")  # narrowed by its launcher: its GPU's cores
    assert cores.for_worker(6, 8) == [*range(16, 32), *range(48, 64)]
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no nvidia-smi: a block, as before
    assert cores.for_worker(5, 8) == [40, 41, 42, 43, 44, 45, 46, 47]


@pytest.mark.processes
def test_every_rank_refuses_a_gpu_another_rank_holds(tmp_path) -> None:
    """The ranks all-gather their GPU's identity (its machine and PCI bus id, as NCCL tells
    GPUs apart) before any collective that could reach NCCL: two ranks on one GPU, as a
    scheduler that sets each rank's CUDA_VISIBLE_DEVICES can place them, end on every rank in
    the same line naming both ranks and the GPU, and no rank is left waiting. The same bus id
    on two machines, or a rank that cannot read its GPU's, passes. Stand-in identities per
    rank (tests/workers/gpu_identity.py); no GPU here."""
    job = [sys.executable, str(WORKERS / "gpu_identity.py"), str(tmp_path)]
    harness.check(harness.horovodrun(2, job, tmp_path, timeout=180))
    seen = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert seen[0] == seen[1], seen
    assert seen[0] == {
        "own gpus, two hosts": None,
        "own gpus, one host": None,
        "one gpu": "rank 0 and rank 1 both train on the GPU at PCI 00000000:2A:00.0 on gpu-a: "
        'one GPU per rank, never two ranks on one (NCCL would end the job in "Duplicate GPU '
        'detected"; MIG instances of one GPU are one GPU to it); give each rank its own GPU '
        "(CUDA_VISIBLE_DEVICES), or let hvd-train launch start one worker per GPU",
        "no driver on one": None,
        "one on the cpu": None,
    }


def test_the_worker_checks_the_gpu_it_chose(monkeypatch) -> None:
    """configure_devices, once it has chosen this worker's GPU by local rank, checks that GPU
    (its CUDA ordinal) against the other ranks'; a CPU worker joins the check with none.
    TensorFlow's GPU list is stood in."""
    import tensorflow as tf

    from hvd_train.runtime import distributed

    listed = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(4)]
    checked = []
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: listed)
    monkeypatch.setattr(tf.config.experimental, "set_memory_growth", lambda d, on: None)
    monkeypatch.setattr(tf.config, "set_visible_devices", lambda d, kind=None: None)
    monkeypatch.setattr(tf.config.threading, "set_intra_op_parallelism_threads", lambda n: None)
    monkeypatch.setattr(tf.config.threading, "set_inter_op_parallelism_threads", lambda n: None)
    monkeypatch.setattr(distributed, "local_rank", lambda: 2)
    monkeypatch.setattr(distributed, "local_size", lambda: 4)
    monkeypatch.setattr(distributed, "refuse_shared_gpu", checked.append)
    assert distributed.configure_devices(0, 0) == "gpu"
    assert checked == [2]
    # A rank on the CPU takes part too (None): a collective the others would wait in otherwise.
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [])
    assert distributed.configure_devices(0, 0) == "cpu"
    assert checked == [2, None]


@pytest.mark.parametrize(
    ("adapters", "ib_disable", "why"),
    [([], None, "no InfiniBand or RoCE adapter in {sys}"),
     (["mlx5_0"], "1", "NCCL_IB_DISABLE=1"),
     (["mlx5_0", "mlx5_1"], None, None)],
)  # fmt: skip
def test_a_gpu_job_across_hosts_over_sockets_is_said_in_one_line(
    nvidia_smi, monkeypatch, capsys, tmp_path, adapters, ib_disable, why
) -> None:
    """NCCL falls back to TCP sockets without a word where this host has no RDMA adapter (or
    NCCL_IB_DISABLE=1): the launcher says so once, before the job; with adapters, nothing.
    /sys/class/infiniband is stood in."""
    sys_ib = tmp_path / "infiniband"
    sys_ib.mkdir()
    for name in adapters:
        (sys_ib / name).mkdir()
    monkeypatch.setattr(horovodrun, "INFINIBAND", str(sys_ib))
    if ib_disable:
        monkeypatch.setenv("NCCL_IB_DISABLE", ib_disable)
    else:
        monkeypatch.delenv("NCCL_IB_DISABLE", raising=False)
    nvidia_smi(gpu_lines(8))
    code, argv, err = launch(capsys, "--hosts", f"{socket.gethostname()}:8,node-b:8")
    assert code == 0 and flag(argv, "-np") == "16"
    said = [line for line in err.splitlines() if "TCP sockets" in line]
    expected = (
        f"NCCL will send the all-reduce between hosts over TCP sockets "
        f"({(why or '').format(sys=sys_ib)}): it runs, several times slower than over InfiniBand; in a "
        "container pass the adapters (--device /dev/infiniband, "
        "docs/launching.md#gpus-across-hosts)"
    )
    assert [line.split("] ", 1)[-1] for line in said] == ([expected] if why else []), err
    code, _, err = launch(capsys)  # one host: no NCCL between hosts
    assert code == 0 and "TCP sockets" not in err


@pytest.mark.parametrize(
    ("env", "expected"),
    [({"SLURM_LOCALID": "3", "SLURM_STEP_TASKS_PER_NODE": "8(x2)", "SLURM_NODEID": "1"}, (3, 8)),
     ({"SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "8(x2),4", "SLURM_NODEID": "2"}, (1, 4)),
     # horovodrun's own variables win: the batch step's SLURM_LOCALID=0 reaches its workers too
     ({"SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "HOROVOD_LOCAL_RANK": "5",
       "HOROVOD_LOCAL_SIZE": "8"}, (5, 8))],
)  # fmt: skip
def test_a_worker_srun_started_takes_its_gpu_by_slurm_localid(env, expected) -> None:
    """A worker Slurm started itself (srun, one task per GPU) has no launcher's local rank:
    Slurm's SLURM_LOCALID and this node's task count pick its GPU and cores."""
    assert gpus.launcher_local_rank(env) == expected
