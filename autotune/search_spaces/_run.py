"""The run settings: stored with every recipe and never searched, they decide how its knobs are applied.

Their facts are declared as a family declares its own (``SCHEMA``, ``ENVIRONMENT_KEYS``, ``MEMORY_KEYS``), and
folded with the families' (``_families``). ``membind`` (False only) is stored when a trial ran without the memory
binding its pinning implies (``membind_off``).
"""
from __future__ import annotations

from . import _batch as batch
from ._rules import Rule, one_of, optional_integer

KEYS = ("device", "global_batch", "lr_scaling", "reference_batch", "membind")
SCHEMA: dict[str, Rule] = {
    "device": one_of(("cpu", "cuda")), "global_batch": optional_integer(1, batch.MOST),
    "lr_scaling": one_of(batch.LR_RULES), "reference_batch": optional_integer(1, batch.MOST),
    "membind": one_of((None, False, True)),
}
ENVIRONMENT_KEYS = ("device", "membind")  # the process's device and its memory policy: one each a process
MEMORY_KEYS = ("device",)  # where a batch is held
