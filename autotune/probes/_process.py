"""What this process runs with, read from ``/proc/self`` (Linux): its threads' CPUs and its memory policy.

The probe reads the machine; these read the process a recipe was applied to, so a trial can report what
was really in effect (``autotune.trial.child``) and ``autotune.apply()`` can check the affinity it was started
with. Every thread's ``Cpus_allowed_list`` is read, not ``sched_getaffinity(0)`` alone: that is the calling
thread's (proc(5), /proc/pid/task/tid/status).
"""
from __future__ import annotations

import os
from pathlib import Path

from ._cpulist import parse_cpulist


def process_cpus() -> list[int]:
    """The CPUs any thread of this process may run on.

    Not ``sched_getaffinity(0)`` alone: with ``KMP_AFFINITY`` libiomp5 narrows the main thread to one
    CPU at the first parallel region.

    >>> set(os.sched_getaffinity(0)) <= set(process_cpus())
    True
    """
    cpus: set[int] = set(os.sched_getaffinity(0))
    for status in _thread_status():
        cpus |= parse_cpulist(status.get("Cpus_allowed_list", ""))
    return sorted(cpus)


def pinned_threads() -> int:
    """How many threads of this process are bound to a single CPU (libiomp5's ``KMP_AFFINITY`` does that)."""
    return sum(len(parse_cpulist(status.get("Cpus_allowed_list", ""))) == 1 for status in _thread_status())


def memory_policy() -> str | None:
    """This process's memory policy as /proc/PID/numa_maps writes it ("default", "bind:0-1"), or None."""
    try:
        with open("/proc/self/numa_maps") as f:
            first = f.readline().split()
    except OSError:
        return None
    return first[1] if len(first) > 1 else None


def _thread_status() -> list[dict[str, str]]:
    """The fields of ``/proc/self/task/*/status``, one dict per thread still running."""
    out = []
    for status in Path("/proc/self/task").glob("*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue  # the thread ended
        out.append({key: value.strip() for key, sep, value in (line.partition(":") for line in text.splitlines())
                    if sep})
    return out
