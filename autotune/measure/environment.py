"""Which environment a recipe is measured in: the knobs that must be in effect before torch starts, or decide the
process itself (``search_spaces.environment_keys``, each family's own), hold one set of values a worker, and a
candidate that differs in any is measured across processes."""
from __future__ import annotations

import json
from typing import Any

from ..search_spaces import environment_keys  # the families' own: exported with what reads them

DEFAULTS = "defaults"  # each worker's arm of its environment's in-process defaults, in every kind of worker


class EnvironmentMismatch(ValueError):
    """An arm whose environment-level knobs differ from its worker's."""


def environment_key(params: dict[str, Any]) -> str:
    """One string per environment configuration (threads, affinity, OpenMP, allocator, processes, device)."""
    return json.dumps({k: params.get(k) for k in environment_keys()}, sort_keys=True, default=str)


def environment_differences(worker: dict[str, Any], params: dict[str, Any]) -> list[str]:
    """``KEY=VALUE (worker: VALUE)`` for each environment-level knob ``params`` sets otherwise.

    >>> environment_differences({"threads": 2, "batch_size": 64}, {"threads": 1, "batch_size": 16})
    ['threads=1 (worker: 2)']
    """
    return [f"{k}={params.get(k)!r} (worker: {worker.get(k)!r})" for k in environment_keys()
            if params.get(k) != worker.get(k)]
