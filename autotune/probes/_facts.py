"""The probed facts: frozen dataclasses that round-trip through JSON.

Every later stage (search spaces, trial runner, recipe store) reads these and nothing else, so
the search can be replayed on recorded hardware. ``None`` means "unknown / not probed", never 0.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

# 2: ``CpuTopology.cgroup`` (the cgroup's view, which the fingerprint hashes); schema-1 documents read with it None
# 3: ``Facts.gpus`` are the devices CUDA can use, in CUDA's order (``Gpu.index`` is the CUDA ordinal,
#    ``Gpu.nvml_index`` the physical GPU), with UUIDs and MIG devices, and ``Facts.cuda`` says what selected
#    them; schema-2 documents (every GPU NVML saw, NVML's order) read with those None/empty
# 4: ``CpuTopology.family_model`` (x86 family and model numbers, which the fingerprint hashes); older documents
#    read with it None
SCHEMA_VERSION = 4


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpus: str  # CPU list in kernel syntax ("0-3,8"); "" for a CPU-less node
    memory_bytes: int | None = None
    kind: str | None = None  # hwloc's memory subtype of a CPU-less node ("GPUMemory", "MCDRAM", ...); None for DRAM


@dataclass(frozen=True)
class Core:
    """One physical core the process may use, with the hardware threads (PUs) it may use.

    ``package`` is the package's logical index (0..packages-1, hwloc's order); ``numa_node`` the kernel
    number of the core's local node, which may lie outside ``AllowedCpus.numa_nodes`` when the cpuset
    forbids that node's memory.
    """

    package: int
    numa_node: int | None
    cpus: tuple[int, ...]
    # hybrid CPUs: hwloc's CoreType ("IntelCore", "IntelAtom") or, where hwloc lacks it (recorded trees),
    # "kind<rank>@<max MHz>" with rank 0 the most power-efficient kind; None on non-hybrid CPUs
    kind: str | None = None


@dataclass(frozen=True)
class AllowedCpus:
    """The part of the machine this process may use (cgroup cpuset, Slurm, taskset)."""

    cpus: str
    packages: int
    cores: int
    threads: int
    numa_nodes: tuple[int, ...]
    core_list: tuple[Core, ...] = ()  # in hwloc's logical order: package, then NUMA node, then core


@dataclass(frozen=True)
class CpuTopology:
    model: str | None
    vendor: str | None
    arch: str | None
    packages: int
    dies: int
    cores: int
    threads: int
    threads_per_core: tuple[int, ...]  # distinct values seen (mixed on hybrid CPUs / offline siblings)
    numa_nodes: tuple[NumaNode, ...]
    offline_cpus: str
    isa: tuple[str, ...]
    allowed: AllowedCpus
    core_kinds: tuple[str, ...] = ()
    source: str = "hwloc"  # "hwloc" or "psutil" (partial topology)
    partial: bool = False
    # The part the cgroup cpuset gives (container, Slurm job) before this process's affinity (taskset,
    # numactl, autotune run's pinning, libiomp5's KMP_AFFINITY) narrows it to ``allowed``: hwloc's allowed
    # cpuset. The fingerprint hashes this view. None where unknown (psutil's partial topology, schema 1).
    cgroup: AllowedCpus | None = None
    # x86 "family 25 model 17": told apart where the model name is not (a VM's "AMD EPYC"); None elsewhere
    family_model: str | None = None


@dataclass(frozen=True)
class Memory:
    total_bytes: int | None
    available_bytes: int | None


@dataclass(frozen=True)
class Runtime:
    """What the Python/torch runtime offers. Live-only: None when probing a recorded tree."""

    python: str
    torch_version: str | None
    torch_build: str | None  # "cpu" | "cuda" | "rocm"
    cuda_version: str | None
    openmp: str | None  # "gnu" | "intel" | None (torch built without OpenMP)
    iomp5_path: str | None
    jemalloc_path: str | None
    tcmalloc_path: str | None
    numactl_path: str | None
    taskset_path: str | None
    onednn: str | None
    distributed_backends: tuple[str, ...] = ()
    compile_cpu_ok: bool | None = None  # torch.compile's CPU backend has a working C++ compiler
    ipex_version: str | None = None
    ipex_compatible: bool | None = None
    glibc: bool | None = None  # the C library is glibc: its malloc takes the thresholds of ``allocator=glibc-kept``
    # False: probed without importing torch (``probe(import_torch=False)``): ``openmp``, ``onednn`` and
    # ``distributed_backends`` are unknown, not absent; a launch plan and a fingerprint need none of them
    imported: bool = True


@dataclass(frozen=True)
class MigDevice:
    """One MIG device of a GPU in MIG mode: its UUID (``MIG-…``) and the memory of its slice."""

    uuid: str
    memory_bytes: int


@dataclass(frozen=True)
class Gpu:
    """A device CUDA can use: a whole GPU, or one MIG device of a GPU in MIG mode (``uuid`` ``MIG-…``, the
    slice's memory in ``memory_bytes``; the rest is its GPU's)."""

    index: int  # CUDA's ordinal in a process started with the probed CUDA_VISIBLE_DEVICES/CUDA_DEVICE_ORDER
    name: str
    compute_capability: str  # "9.0"
    memory_bytes: int
    pci_bus_id: str
    numa_node: int | None = None
    cpu_affinity: str | None = None
    mig: bool | None = None  # the GPU's MIG mode
    links: dict[str, str] = field(default_factory=dict)  # peer index -> "NV18" | "PIX" | ... | "SYS"
    p2p: dict[str, bool] = field(default_factory=dict)
    uuid: str | None = None  # "GPU-…", or "MIG-…" for a MIG device
    nvml_index: int | None = None  # the physical GPU in NVML's order (nvidia-smi's index)
    mig_devices: tuple[MigDevice, ...] = ()  # every MIG device of the GPU (MIG mode on)
    compute_mode: str | None = None  # nvidia-smi's: Default, Exclusive_Process (one CUDA context), Prohibited

    @property
    def is_mig_device(self) -> bool:
        return bool(self.uuid and self.uuid.startswith("MIG-"))


@dataclass(frozen=True)
class CudaView:
    """What chose ``Facts.gpus`` out of the GPUs NVML sees: the variables (None: unset) and NVML's count."""

    visible_devices: str | None
    device_order: str | None
    nvml_gpus: int


@dataclass(frozen=True)
class Facts:
    cpu: CpuTopology
    memory: Memory
    runtime: Runtime | None
    gpus: tuple[Gpu, ...]
    fingerprint: str
    root: str | None = None  # recorded tree probed instead of "/", or None for the live machine
    schema_version: int = SCHEMA_VERSION
    cuda: CudaView | None = None  # None: GPUs not probed (or a document of schema 2)

    def to_dict(self) -> dict[str, Any]:
        """The versioned JSON document: ``schema_version`` first, then every field."""
        data = dataclasses.asdict(self)
        return {"schema_version": data.pop("schema_version"), **data}

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Facts:
        cpu = dict(data["cpu"])
        cpu["allowed"] = _allowed_from_dict(cpu["allowed"])
        if cpu.get("cgroup") is not None:
            cpu["cgroup"] = _allowed_from_dict(cpu["cgroup"])
        cpu["numa_nodes"] = tuple(NumaNode(**n) for n in cpu["numa_nodes"])
        for key in ("threads_per_core", "isa", "core_kinds"):
            cpu[key] = tuple(cpu.get(key, ()))
        runtime = data.get("runtime")
        if runtime is not None:
            runtime = Runtime(**{**runtime, "distributed_backends": tuple(runtime.get("distributed_backends", ()))})
        return cls(
            cpu=CpuTopology(**cpu),
            memory=Memory(**data["memory"]),
            runtime=runtime,
            gpus=tuple(_gpu_from_dict(g) for g in data.get("gpus", ())),
            fingerprint=data["fingerprint"],
            root=data.get("root"),
            schema_version=data.get("schema_version", SCHEMA_VERSION),
            cuda=CudaView(**data["cuda"]) if data.get("cuda") else None,
        )

    @classmethod
    def from_json(cls, text: str) -> Facts:
        return cls.from_dict(json.loads(text))


def _gpu_from_dict(data: dict[str, Any]) -> Gpu:
    return Gpu(**{**data, "mig_devices": tuple(MigDevice(**m) for m in data.get("mig_devices", ()))})


def _allowed_from_dict(data: dict[str, Any]) -> AllowedCpus:
    return AllowedCpus(**{
        **data,
        "numa_nodes": tuple(data["numa_nodes"]),
        "core_list": tuple(Core(**{**c, "cpus": tuple(c["cpus"])}) for c in data.get("core_list", ())),
    })
