"""Sparsity that removes compute: ``sparsity_pattern`` and ``sparsity`` (the ratio).

- ``none``: the model as written (``sparsity`` 0).
- ``structured``: ``sparsity`` (0.1 … 0.8) of the output units of every safely prunable Linear/Conv
  layer are removed, with the matching inputs of the layer they feed (``transforms.prune``): smaller layers,
  fewer FLOPs on any hardware. Offered when the workload's model has such layers (``ctx.prunable``).
- ``2:4``: half of the weights of Linear layers in the 2:4 pattern the sparse tensor cores run
  (``transforms.semisparse``); ``sparsity`` is 0.5. Offered on CUDA with compute capability 8.x when the model
  has eligible Linear layers (``ctx.semi_structured``); not on 9.0, where it measured slower than dense.

In-process only, in ``Tuned.prepare_model``: before torch.compile and before the optimizer is created.
Sparsity costs accuracy (50%/80% pruning has cost a lot); the search's quality guard
(``--max-loss-increase``) rejects a ratio whose loss is too high. A zeroing mask that leaves dense
kernels as slow as before is never offered.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ._context import SpaceContext
from ._family import Params, Prepared, SuggestingTrial
from ._rules import Rule, number, one_of

if TYPE_CHECKING:
    import torch

    from ..probes import Facts

log = logging.getLogger(__name__)

KEYS = ("sparsity_pattern", "sparsity")
ENV_VARS: tuple[str, ...] = ()
OVERRIDES: tuple[str, ...] = ()
PATTERNS = ("none", "structured", "2:4")
MOST = 0.8  # the largest structured ratio searched
SCHEMA: dict[str, Rule] = {"sparsity_pattern": one_of(PATTERNS), "sparsity": number(0, MOST)}
MEMORY_KEYS = KEYS  # a pruned model's masks and what 2:4 kernels hold
# Sparse tensor cores exist from 8.0 on, but 2:4 training measured slower than dense on 9.0 (docs/measurement.md):
# offered on 8.x only (Ampere/Ada, where the published training speedups were measured) until it measures faster.
SEMI_STRUCTURED_CAPABILITIES = (8.0, 9.0)  # [low, high)


def _capability(facts: Facts) -> float:
    return min((float(g.compute_capability) for g in facts.gpus), default=0.0)


def patterns(facts: Facts, ctx: SpaceContext) -> tuple[str, ...]:
    """The sparsity patterns that make this workload faster on this hardware."""
    choices = ["none"]
    if ctx.prunable:
        choices.append("structured")
    low, high = SEMI_STRUCTURED_CAPABILITIES
    cuda_ok = ctx.device == "cuda" and low <= _capability(facts) < high
    if cuda_ok and ctx.semi_structured:
        choices.append("2:4")
    return tuple(choices)


def space(trial: SuggestingTrial, facts: Facts, ctx: SpaceContext) -> Params:
    choices = patterns(facts, ctx)
    if len(choices) == 1:
        return defaults(facts, ctx)
    pattern = trial.suggest_categorical("sparsity_pattern", choices)
    if pattern == "structured":
        return {"sparsity_pattern": pattern, "sparsity": trial.suggest_float("sparsity", 0.1, MOST, step=0.1)}
    return {"sparsity_pattern": pattern, "sparsity": 0.5 if pattern == "2:4" else 0.0}


def defaults(facts: Facts, ctx: SpaceContext) -> Params:
    return {"sparsity_pattern": "none", "sparsity": 0.0}


heuristic = defaults  # run_cpu keeps the model as written

# Hooks this family has nothing to do at (search_spaces._family).


def context(model: torch.nn.Module) -> dict[str, bool]:
    """What the space needs to know about the workload's model (``SpaceContext`` fields)."""
    from .transforms import prune, semisparse

    return {
        "prunable": bool(prune.find_pairs(model)),
        "semi_structured": any(semisparse.eligible(m) for m in model.modules()),
    }


def _pattern(params: dict[str, Any]) -> str:
    pattern = params.get("sparsity_pattern")
    if pattern is None:  # a hand-written recipe with a ratio only
        return "structured" if float(params.get("sparsity") or 0) > 0 else "none"
    if pattern not in PATTERNS:
        raise ValueError(f"sparsity_pattern={pattern!r}: use one of {', '.join(PATTERNS)}")
    return str(pattern)


def prepare_model(params: Params, model: torch.nn.Module, device: str) -> Prepared:
    """Prune ``model`` in place as the recipe says; returns it, what was done (for ``in_effect``) and
    problems worth a warning. Call before torch.compile and before creating the optimizer."""
    pattern = _pattern(params)
    ratio = float(params.get("sparsity") or 0)
    if pattern == "none" or (pattern == "structured" and ratio == 0):
        return Prepared(model)
    if pattern == "2:4":
        if device != "cuda":
            return Prepared(model, problems=(
                f"sparsity_pattern=2:4 not applied: it needs a CUDA GPU, the device is {device}",
            ))
        from .transforms import semisparse

        report = semisparse.sparsify(model)
        missing = () if report["layers"] else ("sparsity_pattern=2:4 not applied: no eligible Linear layer",)
        return Prepared(model, report, missing)
    from .transforms import prune

    pruned = prune.prune(model, ratio)
    if not pruned.layers:
        return Prepared(model, problems=(
            f"sparsity={ratio} not applied: no layer of this model can lose units safely "
            "(each must feed one Linear/Conv through activations or BatchNorm only)",
        ))
    log.info("pruned %d of %d units in %d layers", pruned.channels_removed, pruned.channels_total, pruned.layers)
    return Prepared(model, pruned.to_dict())
