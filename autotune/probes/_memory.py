"""System memory: psutil on the live machine, ``/proc/meminfo`` of a recorded tree otherwise."""
from __future__ import annotations

import logging
from pathlib import Path

from ._facts import Memory, NumaNode

log = logging.getLogger(__name__)


def live_memory() -> Memory:
    import psutil

    vm = psutil.virtual_memory()
    return Memory(total_bytes=vm.total, available_bytes=vm.available)


def recorded_memory(root: str, numa_nodes: tuple[NumaNode, ...] = ()) -> Memory:
    """MemTotal/MemAvailable of ``ROOT/proc/meminfo``.

    Without meminfo the total is the sum of the NUMA nodes' memory (what hwloc reports as the machine's
    total); MemAvailable exists since Linux 3.14, older recordings leave ``available_bytes`` None.
    """
    fields = _meminfo(Path(root) / "proc" / "meminfo")
    total = fields.get("MemTotal")
    if total is None:
        sizes = [n.memory_bytes for n in numa_nodes if n.memory_bytes is not None]
        total = sum(sizes) if sizes else None
    return Memory(total_bytes=total, available_bytes=fields.get("MemAvailable"))


def _meminfo(path: Path) -> dict[str, int]:
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        log.debug("cannot read %s: %s", path, e)
        return {}
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if parts and parts[0].isdigit():
            fields[key.strip()] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return fields
