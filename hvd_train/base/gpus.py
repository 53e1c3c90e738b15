"""This host's GPUs as the driver lists them (`nvidia-smi`), before TensorFlow loads.

One worker runs on each device listed here: a whole GPU, or a MIG instance of a GPU split into
them (CUDA shows a process one MIG instance at most, so such a worker is pinned to its instance
by UUID: `pin_mig_device`). NCCL runs one rank per physical GPU, so two instances of one GPU
never each get a worker (`shared_by_mig`). The launcher counts the devices to choose the worker
count; the worker pins itself and, with `runtime.bind_cores`, finds the cores nearest its GPU
(`nvidia-smi topo -m`); once started, the ranks compare the GPUs they hold (`identity`).
Standard library only: the launcher side imports it.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass

# `GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)` and, under a GPU split into MIG instances,
# `  MIG 1g.10gb     Device  0: (UUID: MIG-...)`.
_GPU_LINE = re.compile(r"^GPU (\d+):.*\(UUID: (GPU-[^)\s]+)\)")
_MIG_LINE = re.compile(r"^\s+MIG .*\(UUID: (MIG-[^)\s]+)\)")
_ESCAPES = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Device:
    """What one worker runs on: a whole GPU, or one MIG instance of a GPU."""

    index: int  # the physical GPU's index, as nvidia-smi and `topo -m` number it
    uuid: str  # what CUDA_VISIBLE_DEVICES selects it by: GPU-... or, for an instance, MIG-...
    gpu_uuid: str  # the physical GPU's UUID (`uuid` for a whole GPU)

    @property
    def mig(self) -> bool:
        return self.uuid != self.gpu_uuid


def nvidia_smi(*args: str) -> str:
    """nvidia-smi's output for `args`; "" without nvidia-smi or when it fails."""
    if not shutil.which("nvidia-smi"):
        return ""
    try:
        out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout if out.returncode == 0 else ""


def listed(text: str) -> list[list[Device]]:
    """`nvidia-smi -L`'s GPUs, each as the devices a worker can run on: its MIG instances when
    it is split into them, else the GPU itself."""
    gpus: list[tuple[Device, list[Device]]] = []
    for line in text.splitlines():
        gpu, mig = _GPU_LINE.match(line), _MIG_LINE.match(line)
        if gpu:
            gpus.append((Device(int(gpu.group(1)), gpu.group(2), gpu.group(2)), []))
        elif mig and gpus:
            whole = gpus[-1][0]
            gpus[-1][1].append(Device(whole.index, mig.group(1), whole.uuid))
    return [instances or [whole] for whole, instances in gpus]


def visible(gpus: list[list[Device]], cuda_visible: str | None) -> list[Device]:
    """The devices left by CUDA_VISIBLE_DEVICES (None: unset, every device).

    As CUDA reads it: indexes or UUIDs (a unique prefix will do), in the order given, up to
    the first entry that names no device (`-1` hides them all). An index or a GPU's UUID
    selects that GPU; for a GPU split into MIG instances, every instance of it, each then a
    worker's, pinned by its UUID (`pin_mig_device`).
    """
    if cuda_visible is None:
        return [d for gpu in gpus for d in gpu]
    chosen: list[Device] = []
    for entry in (e.strip() for e in cuda_visible.split(",")):
        found = _named(gpus, entry) if entry else []
        if not found:
            break
        chosen += [d for d in found if d not in chosen]
    return chosen


def _named(gpus: list[list[Device]], entry: str) -> list[Device]:
    """The devices one CUDA_VISIBLE_DEVICES entry names ([] for none)."""
    for gpu in gpus:
        if entry.isdigit() and gpu[0].index == int(entry):
            return gpu
        if entry.startswith("GPU-") and gpu[0].gpu_uuid.startswith(entry):
            return gpu
        if entry.startswith("MIG-"):
            instance = [d for d in gpu if d.uuid.startswith(entry)]
            if instance:
                return instance[:1]
    return []


def devices(environ: dict[str, str] | None = None) -> list[Device]:
    """The devices on this host one worker each can run on, narrowed by CUDA_VISIBLE_DEVICES;
    [] without nvidia-smi."""
    env = os.environ if environ is None else environ
    return visible(listed(nvidia_smi("-L")), env.get("CUDA_VISIBLE_DEVICES"))


def shared_by_mig(found: list[Device]) -> list[Device]:
    """The MIG instances of the first GPU that gives `found` (one worker each) two or more of
    its instances; [] when every worker has a physical GPU of its own.

    NCCL identifies a rank's GPU by its PCI bus id, which every instance of a GPU shares: two
    ranks on instances of one GPU end the job in "Duplicate GPU detected", as two ranks on one
    whole GPU do (NCCL has no MIG support: NVIDIA/nccl#1716).
    """
    for device in found:
        same = [d for d in found if d.gpu_uuid == device.gpu_uuid]
        if len(same) > 1:
            return same
    return []


def one_instance_per_gpu(found: list[Device]) -> list[Device]:
    """The first of `found`'s devices on each physical GPU, in order: a CUDA_VISIBLE_DEVICES
    that gives every worker a GPU of its own."""
    seen: set[str] = set()
    first = []
    for device in found:
        if device.gpu_uuid not in seen:
            seen.add(device.gpu_uuid)
            first.append(device)
    return first


def identity(ordinal: int) -> tuple[str, str, str] | None:
    """The GPU this process's CUDA device `ordinal` is, as NCCL tells ranks' GPUs apart: (this
    machine, the GPU's PCI bus id, the host's name for messages); None without CUDA's driver.

    The machine is the kernel's boot id, which containers on one host share and hosts do not
    (NCCL hashes the host name with it); the bus id is CUDA's (`cuDeviceGetPCIBusId`), the
    parent GPU's for a MIG instance. Read through the driver library TensorFlow has loaded.
    """
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    device, bus = ctypes.c_int(), ctypes.create_string_buffer(32)
    if (
        cuda.cuInit(0)
        or cuda.cuDeviceGet(ctypes.byref(device), ordinal)
        or cuda.cuDeviceGetPCIBusId(bus, len(bus), device)
    ):
        return None
    return _machine(), bus.value.decode(), socket.gethostname()


def _machine() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


def launcher_local_rank(environ: dict[str, str] | None = None) -> tuple[int, int]:
    """(local rank, local size) from the launcher's environment, readable before hvd.init()."""
    env = os.environ if environ is None else environ
    for rank_key, size_key in (
        ("HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),  # horovodrun (Gloo)
        ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),  # mpirun, horovodrun --mpi
    ):
        if rank_key in env and size_key in env:
            return int(env[rank_key]), int(env[size_key])
    if "SLURM_LOCALID" in env and "SLURM_STEP_TASKS_PER_NODE" in env:  # a task srun started
        return int(env["SLURM_LOCALID"]), _slurm_tasks_here(env)
    return 0, 1


def _slurm_tasks_here(env: dict[str, str]) -> int:
    """This node's tasks from Slurm's SLURM_STEP_TASKS_PER_NODE (`8(x2),4`: 8 on each of the
    first two nodes, then 4), indexed by SLURM_NODEID."""
    counts: list[int] = []
    for part in env["SLURM_STEP_TASKS_PER_NODE"].split(","):
        count, _, times = part.partition("(x")
        counts += [int(count)] * int(times.rstrip(")") or 1)
    node = int(env.get("SLURM_NODEID", "0"))
    return counts[node] if node < len(counts) else 1


def pin_mig_device() -> Device | None:
    """On a host with MIG instances, sets CUDA_VISIBLE_DEVICES to this worker's own device by
    UUID (its instance, or its whole GPU), chosen by local rank; returns it, else None.

    Must run before TensorFlow loads: CUDA reads the variable once, and shows a process at
    most one MIG instance, so choosing among instances later (`set_visible_devices`) cannot
    work. Whole GPUs alone are left to the worker's choice by local rank after TensorFlow
    loads (runtime/distributed.py `configure_devices`).
    """
    found = devices()
    local, _ = launcher_local_rank()
    if not any(d.mig for d in found) or local >= len(found):
        return None
    os.environ["CUDA_VISIBLE_DEVICES"] = found[local].uuid
    return found[local]


def nearest_cores(local: int, count: int, found: list[Device], topo: str) -> list[int]:
    """The cores of this process's own (`os.sched_getaffinity`) nearest the GPU of local
    worker `local` of `count`, from `nvidia-smi topo -m` (`topo`); [] when unknown.

    Workers whose GPUs are nearest the same cores split them: each takes its block of every
    range of the list (`0-15,32-47` between two: 0-7,32-39 and 8-15,40-47), which keeps a
    core and its hyperthread, listed a range apart, in one worker. A process that sees one
    device (pinned to its MIG instance, or narrowed by its launcher) takes its GPU's cores
    whole: which other workers are near them, it cannot tell.
    """
    if not found or (len(found) > 1 and local >= len(found)):  # no GPU of its own
        return []
    near = cpu_affinity(topo)
    own = found[local] if len(found) > 1 else found[0]
    allowed = os.sched_getaffinity(0)
    ranges = [[c for c in r if c in allowed] for r in _ranges(near.get(own.index, []))]
    ranges = [r for r in ranges if r]
    if not ranges:
        return []
    group = [
        i for i in range(min(count, len(found))) if near.get(found[i].index) == near[own.index]
    ]
    place = group.index(local) if local in group else 0
    return [c for r in ranges for c in _block(r, place, len(group))]


def _ranges(cores: list[int]) -> list[list[int]]:
    """Runs of consecutive cores: [0, 1, 2, 8, 9] as [[0, 1, 2], [8, 9]]."""
    runs: list[list[int]] = []
    for core in cores:
        if runs and core == runs[-1][-1] + 1:
            runs[-1].append(core)
        else:
            runs.append([core])
    return runs


def _block(cores: list[int], place: int, parts: int) -> list[int]:
    """Block `place` of `cores` cut into `parts`; with more parts than cores, one core each,
    shared round robin."""
    per = len(cores) // parts
    return cores[place * per : (place + 1) * per] if per else [cores[place % len(cores)]]


def cpu_affinity(topo: str) -> dict[int, list[int]]:
    """GPU index -> the cores nearest it, from `nvidia-smi topo -m`'s "CPU Affinity" column
    (`0-15,32-47`); a GPU whose column says N/A is left out."""
    # nvidia-smi may underline the header with terminal escapes.
    lines = [_ESCAPES.sub("", line) for line in topo.splitlines() if line.strip()]
    header = next((line.split("\t") for line in lines if "CPU Affinity" in line), None)
    if header is None:
        return {}
    column = [h.strip() for h in header].index("CPU Affinity")
    found = {}
    for line in lines:
        cells = line.split("\t")
        name = cells[0].strip()
        if re.fullmatch(r"GPU\d+", name) and len(cells) > column:
            cores = _cores(cells[column].strip())
            if cores:
                found[int(name[3:])] = cores
    return found


def _cores(text: str) -> list[int]:
    """`0-15,32-47` as the cores it lists; [] for anything else (N/A)."""
    cores: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return []
        cores += range(int(lo), int(hi or lo) + 1)
    return cores
