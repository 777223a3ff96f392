"""Which environment a recipe is measured in: the knobs that must be in effect before torch starts, or decide the
process itself (``search_spaces.environment_keys``, each family's own), hold one set of values a worker, and a
candidate that differs in any is measured across processes; and how a one-process candidate's result names the
way it was measured (``paired_method``)."""
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


def same_environment(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in environment_keys())


def environment_defaults(params: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The defaults in ``params``' environment (a key neither sets, e.g. ``membind``, stays unset)."""
    return {**defaults, **{k: params.get(k) for k in environment_keys() if k in params or k in defaults}}


# How a one-process candidate was measured, as its result names it (``TrialResult.method``, ``paired_method``)
IN_PROCESS, ACROSS, FACTOR = "in-process pairs", "process pairs x in-process pairs", "process pairs"


def paired_method(params: dict[str, Any], defaults: dict[str, Any]) -> str:
    """How a one-process candidate of ``params`` is measured against ``defaults``, as its result names it: arms of
    the defaults' worker, its environment's process pairs alone (it IS its environment's defaults), or those
    times an arm in its environment's worker."""
    if same_environment(params, defaults):
        return IN_PROCESS
    return FACTOR if params == environment_defaults(params, defaults) else ACROSS
