"""``batch_size`` and how it keeps trials comparable.

With ``--global-batch N`` every trial takes optimizer steps of N samples, by gradient accumulation
(``accumulation = N / batch_size``), and the learning rate is left alone. Otherwise the learning rate
follows a scaling rule relative to the workload's default batch size (``lr_scaling``):
``sqrt`` (default: lr * sqrt(b / b0), safe for adaptive optimizers), ``linear`` (Goyal et al. 2017,
lr * b / b0, for SGD), or ``none``.

An out-of-memory trial is recorded infeasible; the study then skips every larger batch size.
"""
from __future__ import annotations

import math
from typing import Any

from ._context import SpaceContext

KEYS = ("batch_size",)
LR_RULES = ("sqrt", "linear", "none")


def sizes(ctx: SpaceContext) -> tuple[int, ...]:
    """Powers of two from a quarter to four times the workload's default (capped by memory)."""
    base = max(1, ctx.default_batch_size)
    candidates = sorted({max(1, base // 4), max(1, base // 2), base, base * 2, base * 4})
    if ctx.global_batch:
        candidates = [b for b in candidates if ctx.global_batch % b == 0] or [ctx.global_batch]
    if ctx.max_batch_size:
        candidates = [b for b in candidates if b <= ctx.max_batch_size] or [min(candidates)]
    return tuple(candidates)


def suggest(trial: Any, facts: Any, ctx: SpaceContext) -> dict[str, Any]:
    return {"batch_size": trial.suggest_categorical("batch_size", sizes(ctx))}


def defaults(facts: Any, ctx: SpaceContext) -> dict[str, Any]:
    choices = sizes(ctx)
    base = ctx.default_batch_size if ctx.default_batch_size in choices else choices[len(choices) // 2]
    return {"batch_size": base}


def accumulation(params: dict[str, Any]) -> int:
    global_batch = params.get("global_batch")
    if not global_batch:
        return 1
    return max(1, int(global_batch) // int(params["batch_size"]))


def lr_scale(params: dict[str, Any], reference_batch: int) -> float:
    """The factor the workload's learning rate is multiplied by for this batch size."""
    if params.get("global_batch"):
        return 1.0
    rule = params.get("lr_scaling", "sqrt")
    ratio = int(params["batch_size"]) / max(1, reference_batch)
    if rule == "linear":
        return ratio
    if rule == "sqrt":
        return math.sqrt(ratio)
    return 1.0
