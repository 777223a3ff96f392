"""What a recipe's params may hold: every key some family or run setting declares, each with the values the
search space could offer on some machine (each family's ``SCHEMA``, from its own constants: one source of truth
with the space).
A recipe read from a file, the ``AUTOTUNE_RECIPE`` variable or a shared store is checked here before anything
applies it: one machine's recipe sets the environment and the training of every machine that fetches it.

>>> problems({"threads": "1; touch /tmp/x", "allocator": "/tmp/evil.so", "num_workers": -3})[0]
"threads='1; touch /tmp/x': not allowed (an integer from 1 to 4096)"
"""
from __future__ import annotations

from typing import Any

from . import _batch as batch
from ._context import SpaceContext
from ._families import schema


def problems(params: Any) -> list[str]:
    """Each param that no search could have written: an unknown key, a value of another type, out of range or
    not offered, a batch above the largest the batch family offers; ``[]`` for a recipe it could have."""
    if not isinstance(params, dict):
        return [f"params is {type(params).__name__}, not an object of knobs"]
    out = []
    rules = schema()
    for key, value in params.items():
        if key not in rules:
            out.append(f"{key!r}={value!r}: not a knob autotune knows")
            continue
        check, allowed = rules[key]
        if not check(value):
            out.append(f"{key}={value!r}: not allowed ({allowed})")
    size, reference = params.get("batch_per_rank"), params.get("reference_batch")
    if not out and isinstance(size, int) and isinstance(reference, int):
        ctx = SpaceContext(device="cuda", default_batch_size=reference, global_batch=params.get("global_batch"))
        largest = max(batch.sizes(ctx))
        if size > largest:
            out.append(f"batch_per_rank={size}: not allowed (at most {largest}, the largest the search offers for a "
                       f"default batch of {reference})")
    return out
