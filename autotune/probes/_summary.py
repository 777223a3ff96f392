"""The human-readable text ``autotune probe`` prints."""
from __future__ import annotations

from ._facts import CudaView, Facts, Gpu, Runtime

_NOT_PROBED = "not probed"


def summary(facts: Facts, more: tuple[tuple[str, str], ...] = ()) -> str:
    """A few aligned lines: CPU, NUMA, allowed CPUs, memory, runtime, GPUs, fingerprint, then ``more`` (label,
    value) rows aligned with them (``autotune probe``'s measured limits).

    >>> from autotune.probes import probe
    >>> summary(probe(runtime=False, gpus=False)).splitlines()[0]
    'Machine      this machine'
    """
    cpu = facts.cpu
    source = "hwloc" if not cpu.partial else f"{cpu.source}, partial: hwloc unavailable"
    tpc = "/".join(map(str, cpu.threads_per_core)) or "?"
    rows = [
        ("Machine", f"recorded tree {facts.root}" if facts.root else "this machine"),
        ("CPU", f"{cpu.model or 'unknown model'} ({cpu.vendor or 'unknown vendor'}, {cpu.arch or '?'}"
                f"{', ' + cpu.family_model if cpu.family_model else ''}) [{source}]"),
        # hwloc shows Die objects only where the kernel reports several per package: 0 means "not split".
        ("Topology", f"{_n(cpu.packages, 'package')}, " + (f"{_n(cpu.dies, 'die')}, " if cpu.dies else "")
                     + f"{_n(cpu.cores, 'core')}, "
                     f"{_n(cpu.threads, 'thread')} ({tpc} per core)"
                     + (f", kinds {', '.join(cpu.core_kinds)}" if cpu.core_kinds else "")),
        *(("NUMA" if k == 0 else "", f"node {n.id}: cpus {n.cpus or '-'}, {_size(n.memory_bytes)}"
           + (f" ({n.kind})" if n.kind else "")) for k, n in enumerate(cpu.numa_nodes)),
        ("Offline", cpu.offline_cpus or "none"),
        ("Allowed", f"cpus {cpu.allowed.cpus or '-'}: {_n(cpu.allowed.threads, 'thread')} on "
                    f"{_n(cpu.allowed.cores, 'core')}, {_n(cpu.allowed.packages, 'package')}, "
                    f"NUMA nodes {_ids(cpu.allowed.numa_nodes)}"),
        ("ISA", " ".join(cpu.isa) or "none of the tracked flags"),
        ("Memory", f"{_size(facts.memory.total_bytes)} total, {_size(facts.memory.available_bytes)} available"),
        *_runtime_rows(facts.runtime, facts.root),
        *_gpu_rows(facts.gpus, facts.root, facts.cuda),
        ("Fingerprint", facts.fingerprint),
        *more,
    ]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def _runtime_rows(rt: Runtime | None, root: str | None) -> list[tuple[str, str]]:
    if rt is None:
        return [("Runtime", f"{_NOT_PROBED} ({'recorded tree' if root else 'runtime=False'})")]
    torch = f"torch {rt.torch_version} ({rt.torch_build}" + (f", CUDA {rt.cuda_version})" if rt.cuda_version else ")")
    libs = ", ".join(f"{name} {path}" for name, path in (("iomp5", rt.iomp5_path), ("jemalloc", rt.jemalloc_path),
                                                          ("tcmalloc", rt.tcmalloc_path)) if path)
    tools = ", ".join(f"{name} {path}" for name, path in (("numactl", rt.numactl_path),
                                                          ("taskset", rt.taskset_path)) if path)
    ipex = f"IPEX {rt.ipex_version}" + ("" if rt.ipex_compatible else " (does not match torch)")
    return [
        ("Runtime", f"Python {rt.python}, " + (torch if rt.torch_version else "torch not importable")),
        ("", f"OpenMP {rt.openmp or 'none'}, oneDNN {rt.onednn or 'none'}, "
             f"distributed {'/'.join(rt.distributed_backends) or 'none'}, "
             f"C++ compiler for torch.compile {'found' if rt.compile_cpu_ok else 'missing'}"
             + (f", {ipex}" if rt.ipex_version else "")
             + ("" if rt.glibc is None else f", C library {'glibc' if rt.glibc else 'not glibc'}")),
        ("", f"libraries: {libs or 'no iomp5/jemalloc/tcmalloc'}; tools: {tools or 'no numactl/taskset'}"),
    ]


def _selection(cuda: CudaView | None, shown: int) -> list[tuple[str, str]]:
    """Which GPUs CUDA can use and why, when that is not simply all of them."""
    if cuda is None or (cuda.visible_devices is None and cuda.device_order is None and shown == cuda.nvml_gpus):
        return []
    chosen = ", ".join(f"{name}={value}" for name, value in (("CUDA_VISIBLE_DEVICES", cuda.visible_devices),
                                                            ("CUDA_DEVICE_ORDER", cuda.device_order))
                       if value is not None) or "MIG: one MIG device per process"
    return [("CUDA", f"{_n(shown, 'device')} of {_n(cuda.nvml_gpus, 'GPU')} visible ({chosen}); "
                     "numbered in CUDA's order, nvidia-smi's index in brackets")]


def _gpu_row(g: Gpu) -> str:
    mig = ""
    if g.is_mig_device:
        mig = f", MIG device {g.uuid}"
    elif g.mig:
        mig = ", MIG"
    if g.mig_devices:
        mig += " (" + ", ".join(f"{m.uuid} {_size(m.memory_bytes)}" for m in g.mig_devices) + ")"
    return (f"{g.index}{f' [{g.nvml_index}]' if g.nvml_index not in (None, g.index) else ''}: {g.name}, "
            f"cc {g.compute_capability}, {_size(g.memory_bytes)}, {g.pci_bus_id}, "
            f"NUMA {g.numa_node if g.numa_node is not None else '?'}, cpus {g.cpu_affinity or '?'}{mig}"
            f"{f', compute mode {g.compute_mode}' if g.compute_mode not in (None, 'Default') else ''}")


def _gpu_rows(gpus: tuple[Gpu, ...], root: str | None, cuda: CudaView | None = None) -> list[tuple[str, str]]:
    if root is not None:
        return [("GPUs", f"{_NOT_PROBED} (recorded tree)")]
    if not gpus:
        seen = f" ({cuda.nvml_gpus} GPUs, none visible to CUDA)" if cuda and cuda.nvml_gpus else ""
        return [("GPUs", f"none{seen or ' (no NVIDIA driver, library or GPU)'}"), *_selection(cuda, 0)]
    rows = [("GPUs" if g.index == gpus[0].index else "", _gpu_row(g)) for g in gpus]
    rows += _selection(cuda, len(gpus))
    if len(gpus) > 1:
        header = "     " + " ".join(f"{g.index:>5}" for g in gpus)
        rows.append(("Links", header))
        for g in gpus:
            cells = " ".join(f"{'X' if p.index == g.index else g.links.get(str(p.index), '?'):>5}" for p in gpus)
            rows.append(("", f"{g.index:>4} {cells}"))
    return rows


def _n(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def _size(n: int | None) -> str:
    if n is None:
        return "? GiB"
    return f"{n / 2**30:.1f} GiB"


def _ids(ids: tuple[int, ...]) -> str:
    return ",".join(map(str, ids)) or "unknown"
