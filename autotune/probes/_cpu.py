"""CPU topology: hwloc's whole-system tree turned into ``CpuTopology``, with the allowed view derived from it.

One lstopo run with ``--disallowed`` gives both views: the Machine object carries ``allowed_cpuset`` and
``allowed_nodeset`` (the cgroup cpuset), and the allowed view keeps what hwloc itself keeps when it
drops disallowed objects (``remove_empty()`` in hwloc's topology.c): PUs and NUMA nodes that are
allowed, and every object above them. On the live machine the allowed CPUs are further narrowed to
``os.sched_getaffinity(0)``: ``taskset``/``numactl --physcpubind`` change the affinity, not the cgroup.
The cgroup's view before that narrowing is kept too (``CpuTopology.cgroup``): the fingerprint hashes it,
so a process that ``autotune run`` or libiomp5 pinned to fewer CPUs still matches its machine.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

from ._cpulist import format_cpulist
from ._facts import AllowedCpus, Core, CpuTopology, NumaNode
from ._hwloc import Obj, Tree
from ._isa import CpuInfo, family_model, normalize_model

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _HwCore:
    package: int  # logical index of the enclosing Package (0 when hwloc made none)
    pus: tuple[int, ...]  # online PUs, in hwloc's logical order


def from_tree(tree: Tree, info: CpuInfo | None, affinity: frozenset[int] | None = None) -> CpuTopology:
    """``CpuTopology`` of an hwloc tree. ``affinity`` (live only) narrows the allowed CPUs further."""
    info = info or CpuInfo(isa=(), model=None, vendor=None, arch=None)
    allowed_cpus = tree.allowed_cpus & affinity if affinity is not None else tree.allowed_cpus
    packages = [o for o in tree.machine.walk() if o.type == "Package"]
    cores = list(_cores(tree.machine, {id(p): i for i, p in enumerate(packages)}))
    local = _local_nodes(tree.machine)
    kinds = _kind_labels(tree)
    return CpuTopology(
        model=info.model or normalize_model(_first_info(packages, "CPUModel")),
        vendor=info.vendor or _first_info(packages, "CPUVendor"),
        arch=tree.machine.infos.get("Architecture") or info.arch,
        packages=max(1, len(packages)),
        dies=sum(1 for o in tree.machine.walk() if o.type == "Die"),
        cores=len(cores),
        threads=len(tree.online),
        threads_per_core=tuple(sorted({len(c.pus) for c in cores})),
        numa_nodes=_numa_nodes(tree.machine, local),
        offline_cpus=format_cpulist(tree.complete - tree.online),
        isa=info.isa,
        allowed=_allowed(tree, packages, cores, local, kinds, allowed_cpus),
        core_kinds=tuple(k for k in dict.fromkeys(kinds.values()) if any(kinds.get(c.pus[0]) == k for c in cores)),
        source="hwloc",
        partial=False,
        cgroup=_allowed(tree, packages, cores, local, kinds, tree.allowed_cpus),
        family_model=info.family_model or family_model(_first_info(packages, "CPUFamilyNumber"),
                                                       _first_info(packages, "CPUModelNumber")),
    )


def _cores(obj: Obj, package_index: dict[int, int], package: int = 0) -> Iterator[_HwCore]:
    """Every core with its online PUs. A PU that hwloc placed under no Core counts as its own core."""
    package = package_index.get(id(obj), package)
    if obj.type == "Core":
        pus = tuple(o.os_index for o in obj.walk() if o.type == "PU" and o.os_index is not None)
        if pus:
            yield _HwCore(package, pus)
        return
    if obj.type == "PU" and obj.os_index is not None:
        yield _HwCore(package, (obj.os_index,))
        return
    for child in obj.children:
        yield from _cores(child, package_index, package)


def _local_nodes(machine: Obj) -> dict[int, int]:
    """Each PU's local NUMA node, as the kernel has it (``/sys/devices/system/node/nodeN/cpulist``).

    hwloc gives a CPU-less node (GPU memory, MCDRAM, CXL, NVDIMM) the cpuset of the CPUs near it, so a PU
    can lie in several nodes' cpusets. Its local node is the one hwloc gave no memory subtype (plain
    DRAM), then the one with the fewest CPUs, then the lowest number.
    """
    nodes = sorted(((o.os_index, o) for o in machine.walk() if o.type == "NUMANode" and o.os_index is not None),
                   key=lambda n: (n[1].subtype is not None, len(n[1].cpuset), n[0]))
    local: dict[int, int] = {}
    for index, node in nodes:
        for pu in node.cpuset:
            local.setdefault(pu, index)
    return local


def _numa_nodes(machine: Obj, local: dict[int, int]) -> tuple[NumaNode, ...]:
    nodes = {o.os_index: o for o in machine.walk() if o.type == "NUMANode" and o.os_index is not None}
    return tuple(
        NumaNode(id=i, cpus=format_cpulist(pu for pu, n in local.items() if n == i),
                 memory_bytes=nodes[i].local_memory, kind=nodes[i].subtype)
        for i in sorted(nodes)
    )


def _allowed(tree: Tree, packages: list[Obj], cores: list[_HwCore], local: dict[int, int],
             kinds: dict[int, str], cpus: frozenset[int]) -> AllowedCpus:
    nodes = {o.os_index for o in tree.machine.walk() if o.type == "NUMANode" and o.os_index is not None}
    nodes &= tree.allowed_nodes
    core_list = tuple(
        Core(package=c.package, numa_node=local.get(c.pus[0]), cpus=tuple(p for p in c.pus if p in cpus),
             kind=kinds.get(c.pus[0]))
        for c in cores if cpus.intersection(c.pus)
    )
    kept_packages = [
        p for p in packages
        if cpus & p.cpuset or any(o.type == "NUMANode" and o.os_index in nodes for o in p.walk())
    ]
    return AllowedCpus(
        cpus=format_cpulist(cpus),
        packages=len(kept_packages) if packages else 1,
        cores=len(core_list),
        threads=len(cpus),
        numa_nodes=tuple(sorted(nodes)),
        core_list=core_list,
    )


def _kind_labels(tree: Tree) -> dict[int, str]:
    """Each PU's CPU kind on hybrid CPUs (two or more kinds), else nothing.

    The label is hwloc's CoreType ("IntelAtom", "IntelCore") when it knows it (live x86), else
    ``kind<rank>@<max MHz>`` with rank 0 the most power-efficient kind, as hwloc orders them.
    """
    if len(tree.kinds) < 2:
        return {}
    labels: dict[int, str] = {}
    for rank, kind in enumerate(tree.kinds):
        label = kind.infos.get("CoreType")
        if not label:
            mhz = kind.infos.get("FrequencyMaxMHz")
            label = f"kind{rank}@{mhz}MHz" if mhz else f"kind{rank}"
        labels.update(dict.fromkeys(kind.cpus, label))
    return labels


def _first_info(objs: list[Obj], name: str) -> str | None:
    return next((o.infos[name] for o in objs if o.infos.get(name)), None)


def from_psutil(info: CpuInfo | None, affinity: frozenset[int]) -> CpuTopology:
    """The partial topology psutil can give when hwloc is missing: counts, no packages/NUMA layout.

    Each allowed CPU is reported as its own core in ``core_list`` (the grouping is unknown);
    ``partial=True`` tells consumers that only the counts and the allowed CPUs are reliable. The cgroup's
    view is unknown (``cgroup=None``): psutil sees only the affinity.
    """
    import psutil  # imported on use, as everywhere in the probe: importing autotune stays light

    info = info or CpuInfo(isa=(), model=None, vendor=None, arch=None)
    threads = psutil.cpu_count(logical=True) or len(affinity)
    cores = psutil.cpu_count(logical=False) or threads
    cpus = format_cpulist(affinity)
    core_list = tuple(Core(package=0, numa_node=None, cpus=(c,)) for c in sorted(affinity))
    allowed = AllowedCpus(cpus=cpus, packages=1, cores=len(core_list), threads=len(affinity), numa_nodes=(),
                          core_list=core_list)
    return CpuTopology(
        model=info.model, vendor=info.vendor, arch=info.arch or os.uname().machine, packages=1, dies=0,
        cores=cores, threads=threads, threads_per_core=(threads // cores,) if threads % cores == 0 else (),
        numa_nodes=(), offline_cpus="", isa=info.isa, allowed=allowed, source="psutil", partial=True,
        family_model=info.family_model,
    )
