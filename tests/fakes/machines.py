"""Fake CPU topologies for tests of machines we lack, built on the live machine's facts."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from autotune.probes import AllowedCpus, Core


def two_sockets(facts: Any, mems: tuple[int, ...] = (0, 1)) -> Any:
    """2 sockets = 2 NUMA nodes, 4 cores each, SMT 2: core c of package p has CPUs p*4+c and p*4+c+8.
    ``mems``: the NUMA nodes whose memory this process may use. The cgroup gives the whole machine."""
    cores = tuple(Core(package=p, numa_node=p, cpus=(p * 4 + c, p * 4 + c + 8)) for p in range(2) for c in range(4))
    allowed = AllowedCpus(cpus="0-15", packages=2, cores=8, threads=16, numa_nodes=mems, core_list=cores)
    return replace(facts, cpu=replace(facts.cpu, allowed=allowed, cgroup=allowed))
