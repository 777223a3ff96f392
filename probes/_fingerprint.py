"""A short, stable hash of what decides performance on a machine.

Studies and recipes carry it so a result measured on one machine is not applied to another. It covers
the CPU model and ISA, the cores this process may use with their package, NUMA node and thread count,
the GPUs (name, compute capability, links) and torch's version and build. It leaves out what varies
between runs on the same machine: free memory, PCI bus ids, clocks, host name. Facts probed without the
runtime or the GPUs hash those parts as absent, so compare fingerprints of probes made the same way.
"""
from __future__ import annotations

import hashlib
import json

from ._facts import CpuTopology, Gpu, Runtime


def fingerprint(cpu: CpuTopology, gpus: tuple[Gpu, ...], runtime: Runtime | None) -> str:
    """12 hex digits of SHA-256 over a canonical JSON of the deciding facts."""
    data = {
        "cpu": {
            "model": cpu.model,
            "arch": cpu.arch,
            "isa": sorted(cpu.isa),
            "cores": [[c.package, c.numa_node, len(c.cpus)] for c in cpu.allowed.core_list],
        },
        "gpus": [
            {"name": g.name, "cc": g.compute_capability, "links": sorted(g.links.items())}
            for g in sorted(gpus, key=lambda g: g.index)
        ],
        "torch": [runtime.torch_version, runtime.torch_build] if runtime else None,
    }
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]
