"""The one horovodrun command for a config: what every launcher starts.

`hvd-train launch`, `hvd-train sweep` and the shell launchers (`launch/single_node.sh`,
`launch/multi_node.sh`, through `hvd-train launch --print-command`) call `command`, so the same
config starts the same job whichever of them starts it (as accelerate's `prepare_*_cmd_env`
serve every accelerate launcher). The GPUs of this machine are counted here alone
(`count_gpus`, on base/gpus.py's list, the one each worker pins its device from), and a job
that would put two workers on one of them is refused here (`refuse_shared_gpus`).

This module imports nothing heavy (no TensorFlow, no Horovod): launchers call it before any job.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import sys
from dataclasses import dataclass

from hvd_train.base import gpus as gpu_devices
from hvd_train.base.errors import ConfigError, UserError
from hvd_train.config import Config, ElasticConfig, LaunchConfig, RuntimeConfig
from hvd_train.record.layout import RunDir

# Open MPI on a job whose ranks all run on this machine: only its same-host transports (shared
# memory). Otherwise every rank opens the TCP transport, which listens on all interfaces whatever
# btl_tcp_if_include says, and the libfabric one, which listens on the host's address
# (horovodrun's `-mca btl ^openib` turns back on what Debian's openmpi-mca-params.conf turns off).
# btl_base_include filters on top of `btl`, which horovodrun sets and mpirun takes only once.
# horovodrun as the install patches it adds the same to such a job itself, unless a btl
# parameter is in --mpi-args (as here); passed here too, the command the launchers print says it.
LOOPBACK_MPI_ARGS = ["--mca", "btl_base_include", "self,vader"]
# Without GPUs the workers share the cores with TensorFlow's threads: Open MPI must yield while
# it waits instead of busy-polling a core per rank. Only this machine's GPUs are counted: a
# hostfile of CPU hosts asks for it with --mpi on a launcher that has no GPU either.
CPU_MPI_ARGS = ["--mca", "mpi_yield_when_idle", "1"]


def count_gpus() -> int:
    """Devices on this machine a worker each can run on (`nvidia-smi -L`: a GPU, or each MIG
    instance of a GPU split into them), narrowed by CUDA_VISIBLE_DEVICES when it is set; 0
    without nvidia-smi. Never starts TensorFlow."""
    return len(gpu_devices.devices())


def training_gpus(runtime: RuntimeConfig) -> int:
    """The GPUs this host's workers train on: `count_gpus`, or none where `runtime.device` is
    cpu (the workers hide them: the job is shaped as on a host without a GPU)."""
    return 0 if runtime.device == "cpu" else count_gpus()


@dataclass(frozen=True)
class Placement:
    """Where a job's workers run and how they reach each other: what the launcher's flags say
    and the config does not. Each field left at its default lets `command` choose.

    Args:
        np: workers. Defaults to every slot of `hosts`, else one per GPU here (`count_gpus`),
            else `launch.cpu_workers` (`workers`).
        hosts: horovodrun's `-H host:slots,...`. Defaults to `localhost:NP`.
        controller: "mpi" or "gloo". Defaults to `horovod.controller` (`chosen_controller`).
        nics: interfaces the job talks on (`--network-interfaces`). Defaults to `lo` when all
            hosts are loopback, else (and for an elastic job) to Horovod's own choice.
        ssh: horovodrun's ssh flags (`--ssh-port P`, `--ssh-identity-file F`). Defaults to none.
    """

    np: int | None = None
    hosts: str | None = None
    controller: str | None = None
    nics: str = ""
    ssh: tuple[str, ...] = ()


def command(
    cfg: Config, config_path: str, overrides: list[str], placement: Placement
) -> tuple[list[str], dict[str, str]]:
    """The horovodrun command line and environment of the job `cfg` describes.

    Args:
        cfg: the resolved config (its Horovod knobs and elastic section shape the command).
        config_path: the YAML file the workers load (passed as its real path).
        overrides: the `--set key=value` items the workers apply after it.
        placement: where the workers run and how they talk (`Placement()`: every choice made
            here).

    Returns:
        (argv, env): env is this process's environment with what the job adds.
    """
    gpus = training_gpus(cfg.runtime)
    hosts, nics, ssh = placement.hosts, placement.nics, list(placement.ssh)
    np = placement.np or workers(cfg.launch, gpus, hosts)
    cmd = [_horovodrun(), "-np", str(np)]
    if cfg.elastic.enabled:  # Horovod Elastic (Gloo): hosts come and go as the script reports them
        e = cfg.elastic
        cmd += ["--min-np", str(e.min_workers)]
        cmd += ["--host-discovery-script", discovery_command(e.discovery_script)]
        cmd += ["--max-np", str(e.max_workers)] if e.max_workers else []
        cmd += ["--gloo", *ssh]
        cmd += ["--network-interfaces", nics] if nics else []  # named: no search (probe_note)
    else:
        mpi = chosen_controller(cfg, hosts, gpus, placement.controller) == "mpi"
        hosts = hosts or f"localhost:{np}"
        # horovodrun --mpi adds --allow-run-as-root (containers run as root), -bind-to none and
        # -map-by slot itself.
        cpu = CPU_MPI_ARGS if gpus == 0 else []
        cmd += ["-H", hosts, "--mpi" if mpi else "--gloo"]
        cmd += network_flags(hosts, mpi, cpu, nics, ssh)
    cmd += horovod_flags(cfg)
    cmd += [sys.executable, "-m", "hvd_train", "--config", os.path.realpath(config_path)]
    cmd += [arg for item in overrides for arg in ("--set", item)]
    return cmd, job_env()


def chosen_controller(
    cfg: Config, hosts: str | None, gpus: int, controller: str | None = None
) -> str:
    """ "mpi" or "gloo": `controller` (--mpi or --gloo) when given, else `horovod.controller`.
    Its default, auto, is Open MPI for a job on this host alone without a GPU, where mpirun is
    on the job's PATH (there Open MPI's all-reduce costs less CPU than Gloo's, on the cores the
    step computes on: docs/performance.md#one-cpu-host), else Gloo. Horovod Elastic is Gloo."""
    chosen = controller or cfg.horovod.controller
    if cfg.elastic.enabled:
        return "gloo"
    if chosen != "auto":
        return chosen
    local = hosts is None or on_loopback(hosts)
    found = shutil.which("mpirun", path=job_env()["PATH"])
    return "mpi" if local and not gpus and found else "gloo"


def workers(launch: LaunchConfig, gpus: int | None = None, hosts: str | None = None) -> int:
    """The default worker count: every slot of `hosts` when given, else one per GPU here
    (`gpus`, counted when not given), else `launch.cpu_workers`."""
    if hosts:
        return sum(slots for _, slots in host_slots(hosts))
    return (count_gpus() if gpus is None else gpus) or launch.cpu_workers


def host_slots(hosts: str) -> list[tuple[str, int]]:
    """horovodrun's `-H host:slots,...` as (host, slots); a host without `:slots` has one."""
    found = []
    for item in (h.strip() for h in hosts.split(",") if h.strip()):
        name, _, slots = item.rpartition(":") if ":" in item else (item, "", "1")
        if not slots.isdigit() or int(slots) < 1:
            raise UserError(f"--hosts: {item!r}: expected host:slots with slots >= 1")
        found.append((name, int(slots)))
    return found


def refuse_shared_gpus(np: int, hosts: str | None, gpus: int) -> None:
    """Raises UserError when this GPU host would get more workers than its GPUs (`gpus`): two
    workers would pin one GPU, which NCCL refuses. Hosts elsewhere count their own GPUs."""
    if not gpus:
        return
    here = np if not hosts else sum(n for h, n in placed(np, hosts) if is_this_host(h))
    if here <= gpus:
        refuse_mig_sharing(gpu_devices.devices()[:here])
        return
    given, fix = (
        (f"--np {np}", f"--np {gpus} or fewer")
        if not hosts
        else (f"--hosts {hosts}", f"at most {gpus} slot(s) for this host in --hosts")
    )
    raise UserError(
        f"{given}: {here} workers on this host, which has {gpus} GPU(s): one worker per GPU, "
        f"never two on one (NCCL refuses it); give {fix}"
    )


def refuse_mig_sharing(found: list[gpu_devices.Device]) -> None:
    """Raises UserError when two of this host's workers (one on each of `found`) would train on
    MIG instances of one GPU, which NCCL refuses as it refuses two ranks on one GPU."""
    shared = gpu_devices.shared_by_mig(found)
    if not shared:
        return
    own = ",".join(d.uuid for d in gpu_devices.one_instance_per_gpu(found))
    raise UserError(
        f"MIG: {len(shared)} workers would train on instances of one GPU (GPU {shared[0].index}, "
        f"{shared[0].gpu_uuid}), and NCCL runs one rank per physical GPU (it ends such a job in "
        f'"Duplicate GPU detected"); give each worker an instance of its own GPU '
        f"(CUDA_VISIBLE_DEVICES={own}) or train on whole GPUs"
    )


def placed(np: int, hosts: str) -> list[tuple[str, int]]:
    """(host, workers) as horovodrun places `np` workers: each host's slots in turn."""
    left, found = np, []
    for host, slots in host_slots(hosts):
        found.append((host, min(slots, left)))
        left -= found[-1][1]
    return found


def is_this_host(name: str) -> bool:
    """Whether a host of `-H` names this machine: loopback, or its host name."""
    own = socket.gethostname()  # no DNS look-up: a launcher must not wait on one
    return on_loopback(name) or name in (own, own.split(".")[0]) or name.split(".")[0] == own


def shared_cpu_note(
    cfg: Config, np: int, hosts: str | None, gpus: int, controller: str | None = None
) -> str | None:
    """One line before a job whose CPU workers share this host's cores, else None.

    Such workers split the cores, and each all-reduce's CPU work comes out of its worker's
    share: for a compute-bound model they beat one process on all cores, for one with large
    gradients against its compute they do not (docs/benchmarks.md). Which a model is shows
    only once it trains, so the line names the choice for the second; and Open MPI where Gloo
    would run (Gloo's all-reduce costs more CPU).
    """
    local = hosts is None or on_loopback(hosts)
    if gpus or np < 2 or not local or cfg.elastic.enabled:
        return None
    cores = len(os.sched_getaffinity(0))
    mpi = chosen_controller(cfg, hosts, gpus, controller) == "mpi"
    return (
        f"{np} workers will share this host's {cores} CPU cores: "
        + ("" if mpi else "--mpi spends less of them on the all-reduce; ")
        + "a model with large gradients against its compute trains faster in one process "
        "(--np 1; docs/performance.md#one-cpu-host)"
    )


def probe_note(elastic: ElasticConfig, hosts: str | None, nics: str) -> str | None:
    """One line before a job that may leave horovodrun to find its network interface, else None.

    With hosts on other machines and no interface named, horovodrun finds the one they have in
    common through a service of its own and one on every host, which listen on all interfaces
    while it starts (an interface they reach each other on is what they are looking for); its
    rendezvous server then listens on the address of the interface found
    (patches/horovod-0.28.1/0008). An elastic job's hosts come from its discovery script, unknown
    here.
    """
    if nics or not (elastic.enabled or (hosts and not on_loopback(hosts))):
        return None
    which = "the discovery script's hosts" if elastic.enabled else "these hosts"
    return (
        f"no --network-interface: unless {which} are all this machine, horovodrun finds "
        "their common interface through services listening on all interfaces of every host "
        "while it starts (docs/security.md#what-listens-where); --network-interface IF "
        "skips that"
    )


# Where the kernel lists RDMA adapters (InfiniBand, RoCE): NCCL's IB transport opens these.
INFINIBAND = "/sys/class/infiniband"


def sockets_note(gpus: int, hosts: str | None, environ: dict[str, str] | None = None) -> str | None:
    """One line before a GPU job across hosts whose NCCL will talk over TCP sockets, else None.

    NCCL uses InfiniBand (or RoCE) where it finds an adapter and its user-space library
    (libibverbs: the GPU image has it), else falls back to sockets without a word: the job
    runs, its all-reduce between hosts several times slower. Judged from this host, which
    horovodrun starts from and which is one of the job's in a cluster: no adapter listed in
    /sys/class/infiniband, or NCCL_IB_DISABLE=1.
    """
    env = os.environ if environ is None else environ
    if not gpus or not hosts or on_loopback(hosts) or len(host_slots(hosts)) < 2:
        return None
    adapters = sorted(os.listdir(INFINIBAND)) if os.path.isdir(INFINIBAND) else []
    if adapters and env.get("NCCL_IB_DISABLE", "0") in ("", "0"):
        return None
    why = "NCCL_IB_DISABLE=1" if adapters else f"no InfiniBand or RoCE adapter in {INFINIBAND}"
    return (
        f"NCCL will send the all-reduce between hosts over TCP sockets ({why}): it runs, "
        "several times slower than over InfiniBand; in a container pass the adapters "
        "(--device /dev/infiniband, docs/launching.md#gpus-across-hosts)"
    )


def mpi_note(controller: str, hosts: str | None) -> str | None:
    """One line before an Open MPI job with hosts on other machines, else None.

    On one host mpirun and the ranks listen on loopback alone (patches/horovod-0.28.1/0010);
    across hosts Open MPI binds mpirun's out-of-band listener and each rank's TCP transport
    to every address of their host, whatever its interface settings (docs/security.md).
    """
    if controller != "mpi" or not hosts or on_loopback(hosts):
        return None
    return (
        "--mpi across hosts: mpirun's out-of-band listener and each rank's TCP transport listen "
        "on all interfaces of their host, whatever the interface settings "
        "(docs/security.md#what-listens-where); under --gloo the job listens on its interface alone"
    )


def job_env() -> dict[str, str]:
    """The environment a job runs in: this one, TensorFlow's C++ log quieter (horovodrun
    imports TensorFlow too), and this interpreter's folder first on PATH."""
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    bindir = os.path.dirname(sys.executable)
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    return env


def _horovodrun() -> str:
    """HVD_TRAIN_HOROVODRUN, else the horovodrun beside this Python, else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    if os.environ.get("HVD_TRAIN_HOROVODRUN"):
        return os.environ["HVD_TRAIN_HOROVODRUN"]
    return beside if os.path.exists(beside) else shutil.which("horovodrun") or "horovodrun"


def horovod_flags(cfg: Config) -> list[str]:
    """The config's Horovod knobs as horovodrun flags (the trainer applies the same knobs
    itself when started without them, by plain mpirun)."""
    h, flags = cfg.horovod, []
    if h.fusion_threshold_mb is not None:
        flags += ["--fusion-threshold-mb", _number(h.fusion_threshold_mb)]
    if h.cycle_time_ms is not None:
        flags += ["--cycle-time-ms", _number(h.cycle_time_ms)]
    if h.timeline:  # rank 0 writes it; absolute, as workers on other hosts resolve it too
        flags += ["--timeline-filename", RunDir(os.path.realpath(cfg.run.dir)).timeline]
    return flags + (["--autotune"] if h.autotune else [])


def _number(value: float) -> str:
    return str(value)  # as `python -m hvd_train.config --get` prints it


def network_flags(
    hosts: str, mpi: bool, mpi_args: list[str] | None = None, nics: str = "",
    ssh: list[str] | None = None,
) -> list[str]:  # fmt: skip
    """horovodrun flags for the interfaces the job binds to and talks on, with `mpi_args` and
    the network's Open MPI flags as the one --mpi-args horovodrun keeps, and `ssh` between.

    Named interfaces (`nics`) win: Horovod sets Gloo's interface, btl_tcp_if_include and
    NCCL_SOCKET_IFNAME from them, and mpirun's own traffic follows oob_tcp_if_include. Else,
    when every host is this machine's loopback: `--network-interfaces lo` and, under MPI,
    LOOPBACK_MPI_ARGS. horovodrun's rendezvous server (Gloo) listens on the address the
    workers are given (patches/horovod-0.28.1/0008): 127.0.0.1 here, that interface's address
    across hosts; on one host horovodrun also puts mpirun's listeners on loopback (0010).
    What stays on all interfaces, whatever the flags: mpirun's out-of-band listener across
    hosts, and the services horovodrun searches for an interface with (`probe_note`):
    docs/security.md.
    """
    args = list(mpi_args or [])
    if nics:
        args += ["--mca", "oob_tcp_if_include", nics]
    elif on_loopback(hosts):
        args += LOOPBACK_MPI_ARGS
    interfaces = nics or ("lo" if on_loopback(hosts) else "")
    flags = ["--network-interfaces", interfaces] if interfaces else []
    # horovodrun pastes --mpi-args into the mpirun command that a shell runs: quote each word.
    mpi_flag = [f"--mpi-args={shlex.join(args)}"] if mpi and args else []
    return [*mpi_flag, *(ssh or []), *flags]


def on_loopback(hosts: str) -> bool:
    """Whether every host of horovodrun's `-H host:slots,...` is a loopback name or address."""
    names = [h.strip().rsplit(":", 1)[0] for h in hosts.split(",") if h.strip()]
    return bool(names) and all(n in ("localhost", "::1") or n.startswith("127.") for n in names)


def discovery_command(path: str) -> str:
    """`elastic.discovery_script` as horovodrun's `--host-discovery-script`: one quoted word.

    horovodrun runs the script here, on the launching host, through a shell (Horovod's
    `safe_shell_exec`: `Popen(command, shell=True)`), every second. The loader already refused
    anything but one plain path (workers load the config too, but the script need not exist
    on them, as on Kubernetes, where only the launcher has it); here it must exist and be
    executable, and its absolute path is shell-quoted: the folder it is relative to may hold
    any character.
    """
    full = os.path.abspath(path)
    if not os.path.isfile(full):
        raise ConfigError(
            f"elastic.discovery_script: {full}: no such file on this host, which runs it for "
            "horovodrun"
        )
    if not os.access(full, os.X_OK):
        raise ConfigError(f"elastic.discovery_script: {full}: not executable; chmod +x it")
    return shlex.quote(full)
