"""Hardware facts for autotune (installed as ``autotune.probes``).

``probe()`` reads the machine once and returns ``Facts``: CPU topology from hwloc (with the part this
process may use), ISA flags, memory, the Python/torch runtime and the GPUs through NVML. The facts are
frozen dataclasses that round-trip through JSON, and every later stage reads only them, so a search can
be replayed on a recorded machine::

    >>> from autotune.probes import probe, summary
    >>> facts = probe(runtime=False, gpus=False)
    >>> facts.cpu.allowed.threads >= 1
    True
    >>> "Fingerprint" in summary(facts)
    True

``probe(root="DIR")`` reads a recorded tree (``record("host.tar.gz")``, unpacked) instead of ``/``.
Nothing is probed at import time. ``process_cpus()``, ``pinned_threads()`` and ``memory_policy()`` read
what this process runs with (``/proc/self``); ``format_cpulist``/``parse_cpulist`` convert CPU sets to and
from the kernel's list syntax ("0-3,8").
"""
from __future__ import annotations

from ._child import CHILD_S
from ._cpulist import format_cpulist, parse_cpulist
from ._facts import (
    SCHEMA_VERSION,
    AllowedCpus,
    Core,
    CpuTopology,
    CudaView,
    Facts,
    Gpu,
    Memory,
    MigDevice,
    NumaNode,
    Runtime,
)
from ._fingerprint import VERSION as FINGERPRINT_VERSION
from ._fingerprint import fingerprint_version, outdated_fingerprint
from ._limits import Limits, limits
from ._measured import KernelSpeed, Measured, measured
from ._probe import probe
from ._process import memory_policy, pinned_threads, process_cpus
from ._record import record
from ._runtime import preloadable
from ._summary import summary

__all__ = [
    "CHILD_S",
    "FINGERPRINT_VERSION",
    "SCHEMA_VERSION",
    "AllowedCpus",
    "Core",
    "CpuTopology",
    "CudaView",
    "Facts",
    "Gpu",
    "KernelSpeed",
    "Limits",
    "Measured",
    "Memory",
    "MigDevice",
    "NumaNode",
    "Runtime",
    "fingerprint_version",
    "format_cpulist",
    "limits",
    "measured",
    "memory_policy",
    "outdated_fingerprint",
    "parse_cpulist",
    "pinned_threads",
    "preloadable",
    "probe",
    "process_cpus",
    "record",
    "summary",
]
