"""Which batch sizes an out-of-memory trial rules out: larger batches with the same memory-relevant settings.

A trial that runs out of memory at a batch of B per process says nothing about a recipe that holds less
per sample (bfloat16 instead of float32, no ``torch.compile`` autotuning, a pruned model) or spreads the
batch differently (another ``processes``). So the study keeps, per combination of the settings that decide
a process's memory (``search_spaces.memory_keys``, each family's own; and which batch key the recipe uses), the
smallest batch that ran out of memory, and skips only a later trial with the same combination and a batch at
least as large. Stored
as the study attribute ``StudyAttr.OOM_LIMITS`` (a dict: combination -> batch); the single cap of older
studies (``StudyAttr.OOM_BATCH_SIZE``, a global batch) is not read: a size it ruled out runs out of memory
again and is recorded, once.

>>> limits = record_oom({}, {"batch_per_rank": 128, "amp_dtype": "float32", "processes": 1})
>>> known_oom(limits, {"batch_per_rank": 256, "amp_dtype": "float32", "processes": 1}) is not None
True
>>> known_oom(limits, {"batch_per_rank": 256, "amp_dtype": "bfloat16", "processes": 1}) is None
True
"""
from __future__ import annotations

import json
from typing import Any

from ..search_spaces import memory_keys


def batch_key(params: dict[str, Any]) -> str:
    """The recipe's batch key: ``batch_per_rank``, or a format-1 recipe's global ``batch_size``."""
    return "batch_size" if "batch_size" in params else "batch_per_rank"


def memory_settings(params: dict[str, Any]) -> str:
    """The combination an out-of-memory batch is remembered under (one string, a stored dict's key)."""
    return json.dumps({"batch_key": batch_key(params), **{k: params.get(k) for k in memory_keys()}}, sort_keys=True)


def known_oom(limits: dict[str, int] | None, params: dict[str, Any]) -> str | None:
    """Why ``params`` is known to run out of memory (a batch at least as large as one that did, with the same
    memory-relevant settings), or None."""
    key = batch_key(params)
    limit = (limits or {}).get(memory_settings(params))
    if limit is None or int(params[key]) < int(limit):
        return None
    return f"{key} {params[key]} is at least {limit}, which ran out of memory with the same memory-relevant settings"


def record_oom(limits: dict[str, int] | None, params: dict[str, Any]) -> dict[str, int]:
    """``limits`` after ``params`` ran out of memory (a new dict: the caller stores it)."""
    out = dict(limits or {})
    key, size = memory_settings(params), int(params[batch_key(params)])
    out[key] = min(size, out.get(key, size))
    return out


__all__ = ["batch_key", "known_oom", "memory_settings", "record_oom"]
