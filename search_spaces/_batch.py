"""``batch_size`` and how it keeps trials comparable.

With ``--global-batch N`` every trial takes optimizer steps of N samples, by gradient accumulation
(``accumulation = N / batch_size``), and the learning rate is left alone. Otherwise the learning rate
follows a scaling rule relative to the workload's default batch size (``lr_scaling``):
``sqrt`` (default: lr * sqrt(b / b0), safe for adaptive optimizers), ``linear`` (Goyal et al. 2017,
lr * b / b0, for SGD), or ``none``.

The sizes offered stop at what the device's memory should hold (``max_batch_size``, estimated from
the probed memory and one forward pass); a trial that still runs out of memory is recorded
infeasible, and the study then skips every larger batch size.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ._context import SpaceContext
from ._family import NoOp, Params, SuggestingTrial

if TYPE_CHECKING:
    import torch

    from ..probes import Facts

KEYS = ("batch_size",)
ENV_VARS: tuple[str, ...] = ()
OVERRIDES: tuple[str, ...] = ()
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


def max_batch_size(memory_bytes: int | None, model: torch.nn.Module, inputs: tuple[Any, ...],
                   samples: int) -> int | None:
    """The largest batch that ``memory_bytes`` should hold for training ``model``, or None if unknown.

    Training keeps the weights, their gradients and up to two optimizer states (4x the parameters),
    and per sample the activations autograd saves for backward plus their gradients: about twice every
    module's output, measured here by one forward pass of ``samples`` samples (``inputs``, on the CPU).
    Half of the memory is left for the allocator, the framework and the data: an estimate that keeps
    the search away from sizes bound to fail, not a promise (an out-of-memory trial is still recorded).

    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(1000, 1000), torch.nn.ReLU())  # 4 MB of weights
    >>> max_batch_size(64 * 2**20, net, (torch.zeros(2, 1000),), 2)  # (32 MiB - 16 MB) / 20 KB a sample
    876
    """
    import torch

    if not memory_bytes or samples < 1:
        return None
    outputs = 0

    def count(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        nonlocal outputs
        for t in output if isinstance(output, (tuple, list)) else (output,):
            if isinstance(t, torch.Tensor):
                outputs += t.numel() * t.element_size()

    leaves = [m for m in model.modules() if not list(m.children())]
    hooks = [m.register_forward_hook(count) for m in leaves]
    was_training = model.training
    try:
        model.eval()  # BatchNorm would refuse a batch of one in training mode; the sizes are the same
        with torch.no_grad():
            model(*inputs)
    except Exception:  # noqa: BLE001 - an estimate: a model that cannot run here is simply not capped
        return None
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    input_bytes = sum(t.numel() * t.element_size() for t in inputs if isinstance(t, torch.Tensor))
    per_sample = (2 * outputs + input_bytes) / samples
    usable = memory_bytes / 2 - 4 * weights
    if per_sample <= 0:
        return None
    return max(1, int(usable // per_sample))


def space(trial: SuggestingTrial, facts: Facts, ctx: SpaceContext) -> Params:
    return {"batch_size": trial.suggest_categorical("batch_size", sizes(ctx))}


def defaults(facts: Facts, ctx: SpaceContext) -> Params:
    choices = sizes(ctx)
    base = ctx.default_batch_size if ctx.default_batch_size in choices else choices[len(choices) // 2]
    return {"batch_size": base}


heuristic = defaults  # run_cpu leaves the batch alone

# Hooks this family has nothing to do at (search_spaces._family).
promising = NoOp.promising
environment = NoOp.environment
apply_process = NoOp.apply_process
check_environment = NoOp.check_environment
prepare_model = NoOp.prepare_model
prepare = NoOp.prepare


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
