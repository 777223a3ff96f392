"""Which knobs decide a process: those must be in effect before torch starts, or decide the process itself, so
one worker holds one set of their values, and a candidate that differs in any is measured across processes."""
from __future__ import annotations

import json
from typing import Any

from .. import search_spaces as spaces

DEFAULTS = "defaults"  # each worker's arm of its environment's in-process defaults, in every kind of worker

# Knobs that must be in effect before torch starts, or that decide the process itself: one worker, one set
# of values (``search_spaces``: threads and preload families, processes; the run settings device and membind).
ENVIRONMENT_KEYS: tuple[str, ...] = (*spaces.threads.KEYS, *spaces.preload.KEYS, *spaces.processes.KEYS,
                                     *spaces.cuda.ENVIRONMENT_KEYS, "device", "membind")


class EnvironmentMismatch(ValueError):
    """An arm whose environment-level knobs differ from its worker's."""


def environment_key(params: dict[str, Any]) -> str:
    """One string per environment configuration (threads, affinity, OpenMP, allocator, processes, device)."""
    return json.dumps({k: params.get(k) for k in ENVIRONMENT_KEYS}, sort_keys=True, default=str)


def environment_differences(worker: dict[str, Any], params: dict[str, Any]) -> list[str]:
    """``KEY=VALUE (worker: VALUE)`` for each environment-level knob ``params`` sets otherwise.

    >>> environment_differences({"threads": 2, "batch_size": 64}, {"threads": 1, "batch_size": 16})
    ['threads=1 (worker: 2)']
    """
    return [f"{k}={params.get(k)!r} (worker: {worker.get(k)!r})" for k in ENVIRONMENT_KEYS
            if params.get(k) != worker.get(k)]
