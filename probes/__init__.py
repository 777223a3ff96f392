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
Nothing is probed at import time.
"""
from __future__ import annotations

from ._facts import SCHEMA_VERSION, Allowed, Core, CpuTopology, Facts, Gpu, Memory, NumaNode, Runtime
from ._fingerprint import VERSION as FINGERPRINT_VERSION
from ._fingerprint import fingerprint_version, outdated_fingerprint
from ._probe import probe
from ._record import record
from ._summary import summary

__all__ = [
    "FINGERPRINT_VERSION",
    "SCHEMA_VERSION",
    "Allowed",
    "Core",
    "CpuTopology",
    "Facts",
    "Gpu",
    "Memory",
    "NumaNode",
    "Runtime",
    "fingerprint_version",
    "outdated_fingerprint",
    "probe",
    "record",
    "summary",
]
