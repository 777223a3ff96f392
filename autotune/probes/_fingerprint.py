"""A short, stable hash of what decides performance on a machine.

Studies and recipes carry it so a result measured on one machine is not applied to another. It covers
the CPU model, its x86 family and model numbers (a VM may give two CPU generations one name and the same ISA
flags) and ISA, the cores the cgroup cpuset gives (container, Slurm job: ``CpuTopology.cgroup``)
with their package, NUMA node and thread count, the GPUs CUDA can use -- those ``CUDA_VISIBLE_DEVICES``
selects, in CUDA's order (name, compute capability, links between them, a MIG device's memory) -- and torch's
version and build. It leaves out what varies between runs on the same machine: free memory, PCI bus ids,
clocks, host name, which GPU a rank of ``autotune run`` trains on (every rank inherits the command's
``CUDA_VISIBLE_DEVICES``; its local rank picks the device), and the process's CPU affinity -- ``autotune run``
pins a recipe's process to the CPUs
it measured and libiomp5's ``KMP_AFFINITY`` pins the main thread, and ``apply()`` in that process must
still recognise its machine. Facts probed without the runtime or the GPUs hash those parts as absent, so
compare fingerprints of probes made the same way.

The scheme is versioned: a fingerprint is ``v3-`` and 12 hex digits. A bare 12-digit hash is scheme 1
(autotune before the prefix: it hashed the CPUs the process may use, affinity included); scheme 2 did not hash
the family and model numbers. Fingerprints of two schemes cannot be compared, so a study or recipe recorded
with another scheme is refused with ``outdated_fingerprint()``'s explanation rather than taken for other
hardware.

>>> fingerprint_version("v3-0123456789ab"), fingerprint_version("0123456789ab")
(3, 1)
"""
from __future__ import annotations

import hashlib
import json
import re

from ._facts import CpuTopology, Gpu, Runtime

VERSION = 3
# What each scheme changed, for the line that refuses a study or recipe of an older one.
_CHANGES = {
    2: "fingerprints now describe the machine and its cgroup cpuset, not the CPUs a process was pinned to",
    3: "fingerprints now tell CPU generations apart by their family and model numbers, where the CPU's name may not",
}
_VERSIONED = re.compile(r"^v(\d+)-")


def fingerprint(cpu: CpuTopology, gpus: tuple[Gpu, ...], runtime: Runtime | None) -> str:
    """``v3-`` and 12 hex digits of SHA-256 over a canonical JSON of the deciding facts."""
    view = cpu.cgroup
    # psutil's partial topology knows no cgroup: the machine's own counts, never the affinity
    cores = [[c.package, c.numa_node, len(c.cpus)] for c in view.core_list] if view else [cpu.cores, cpu.threads]
    data = {
        "cpu": {"model": cpu.model, "family_model": cpu.family_model, "arch": cpu.arch, "isa": sorted(cpu.isa),
                "cores": cores},
        "gpus": [
            # a MIG device's slice decides its memory and SMs: hashed; whole GPUs hash as before schema 3
            {"name": g.name, "cc": g.compute_capability, "links": sorted(g.links.items()),
             **({"mig_memory": g.memory_bytes} if g.is_mig_device else {})}
            for g in sorted(gpus, key=lambda g: g.index)
        ],
        "torch": [runtime.torch_version, runtime.torch_build] if runtime else None,
    }
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return f"v{VERSION}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def fingerprint_version(recorded: str) -> int:
    """The scheme a fingerprint was made with: N for ``vN-…``, 1 for anything else (the bare hashes before)."""
    match = _VERSIONED.match(recorded)
    return int(match.group(1)) if match else 1


def outdated_fingerprint(recorded: str | None) -> str | None:
    """Why a recorded fingerprint of another scheme cannot be compared with this machine's, or None.

    >>> outdated_fingerprint("v3-0123456789ab") is None
    True
    >>> outdated_fingerprint("v2-0123456789ab")  # doctest: +ELLIPSIS
    "recorded with autotune's fingerprint v2 (v2-0123456789ab), which this autotune (v3) cannot compare: ..."
    """
    if not recorded or fingerprint_version(recorded) == VERSION:
        return None
    version = fingerprint_version(recorded)
    changes = "; ".join(why for v, why in _CHANGES.items() if v > version) or f"v{version} is newer than this autotune"
    return (f"recorded with autotune's fingerprint v{version} ({recorded}), which this autotune (v{VERSION}) cannot "
            f"compare: {changes}")
