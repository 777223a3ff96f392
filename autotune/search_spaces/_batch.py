"""``batch_per_rank`` and how it keeps trials comparable.

``batch_per_rank`` is the batch each process loads (recipe format 2): a recipe that trains in
``processes`` P ranks takes optimizer steps of ``batch_per_rank x P`` samples (``global_size``), and
the memory cap applies to one process, that is one GPU or MIG slice. A recipe of format 1 (before
``batch_per_rank``) has ``batch_size`` instead: the batch summed over the ranks, each loading
``batch_size // P`` (``per_rank``). Where a params dict holds ``batch_size`` it is read that way.

With ``--global-batch N`` every trial takes optimizer steps of N samples, by gradient accumulation
(``accumulation = N / (batch_per_rank x P)``; a step where ``batch_per_rank x P`` exceeds N takes that
many), and the learning rate is left alone. Otherwise the learning rate
follows a scaling rule relative to the workload's default batch size (``lr_scaling``):
``sqrt`` (default: lr * sqrt(b / b0), safe for adaptive optimizers), ``linear`` (Goyal et al. 2017,
lr * b / b0, for SGD), or ``none``.

The sizes offered stop at what one process's device memory should hold (``max_batch_size``: the
estimated peak within ``MEMORY_SHARE`` of a GPU, a MIG slice or the RAM, from one forward pass); a
trial that still runs out of memory is recorded infeasible, and the study then skips larger batches
with the same memory-relevant settings (``autotune.study.oom_limits``).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ._context import SpaceContext
from ._family import Params, SuggestingTrial
from ._rules import Rule, integer

if TYPE_CHECKING:
    import torch

    from ..probes import Facts

KEYS = ("batch_per_rank",)
ENV_VARS: tuple[str, ...] = ()
OVERRIDES: tuple[str, ...] = ()
LR_RULES = ("sqrt", "linear", "none")
MOST = 1 << 20  # the largest batch (per rank, reference or global) a recipe may hold
# batch_size: a format-1 recipe's global batch (``recipe``)
SCHEMA: dict[str, Rule] = {"batch_per_rank": integer(1, MOST), "batch_size": integer(1, MOST)}
IN_PLACE = KEYS  # read where the script builds its DataLoader again (``Tuned.switch``)
MEMORY_SHARE = 0.9  # of a device's memory a recipe's estimated (and measured) peak may take


def sizes(ctx: SpaceContext) -> tuple[int, ...]:
    """Per-rank batches: the workload's default halved twice and doubled twice, up to what one
    process's memory should hold. With ``--global-batch`` on a GPU, doubled on up to the global batch: a
    GPU often trains a larger batch in fewer accumulation steps faster, and every trial still takes
    optimizer steps of the global batch (without it, a batch many times the default is a few large steps
    at a scaled learning rate, which the quality guard rejects).

    >>> sizes(SpaceContext(device="cuda", default_batch_size=64, global_batch=2048, max_batch_size=1500))
    (16, 32, 64, 128, 256, 512, 1024)
    >>> sizes(SpaceContext(device="cpu", default_batch_size=64, global_batch=2048))
    (16, 32, 64, 128, 256)
    """
    base = max(1, ctx.default_batch_size)
    offered = {max(1, base // 4), max(1, base // 2), base, base * 2, base * 4}
    if ctx.global_batch and ctx.device == "cuda":
        offered |= {base << k for k in range(3, 64) if base << k <= ctx.global_batch}
    candidates = sorted(offered)
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
    The peak may take ``MEMORY_SHARE`` (90%) of the memory; the rest is the allocator's, the framework's
    and the data's. An estimate that keeps the search away from sizes bound to fail, not a promise (an
    out-of-memory trial is still recorded, and a trial's measured peak is checked against the same share).

    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(1000, 1000), torch.nn.ReLU())  # 4 MB of weights
    >>> max_batch_size(64 * 2**20, net, (torch.zeros(2, 1000),), 2)  # (57.6 MiB - 16 MB) / 20 KB a sample
    2219
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
    usable = MEMORY_SHARE * memory_bytes - 4 * weights
    if per_sample <= 0:
        return None
    return max(1, int(usable // per_sample))


def memory_warning(peak_bytes: int | None, device_bytes: int | None) -> str | None:
    """The warning for a recipe whose measured peak takes more than ``MEMORY_SHARE`` of its device, or None.

    >>> memory_warning(75 * 2**30, 80 * 2**30)[:65]
    "peak memory 75.0 GiB is 94% of the device's 80.0 GiB (above 90%):"
    >>> memory_warning(10 * 2**30, 80 * 2**30), memory_warning(None, 80 * 2**30)
    (None, None)
    """
    if not peak_bytes or not device_bytes or peak_bytes <= MEMORY_SHARE * device_bytes:
        return None
    return (f"peak memory {peak_bytes / 2**30:.1f} GiB is {peak_bytes / device_bytes:.0%} of the device's "
            f"{device_bytes / 2**30:.1f} GiB (above {MEMORY_SHARE:.0%}): a longer run, another input shape or "
            "fragmentation may run out of memory")


def space(trial: SuggestingTrial, facts: Facts, ctx: SpaceContext) -> Params:
    return {"batch_per_rank": trial.suggest_categorical("batch_per_rank", sizes(ctx))}


def defaults(facts: Facts, ctx: SpaceContext) -> Params:
    choices = sizes(ctx)
    base = ctx.default_batch_size if ctx.default_batch_size in choices else choices[len(choices) // 2]
    return {"batch_per_rank": base}


heuristic = defaults  # run_cpu leaves the batch alone

# Hooks this family has nothing to do at (search_spaces._family).


def per_rank(params: dict[str, Any]) -> int:
    """The batch one process loads: ``batch_per_rank``, or a format-1 ``batch_size`` shared by the ranks.

    >>> per_rank({"batch_per_rank": 64, "processes": 8}), per_rank({"batch_size": 64, "processes": 8})
    (64, 8)
    """
    processes = max(1, int(params.get("processes") or 1))
    if "batch_size" in params:  # format 1: the batch summed over the ranks
        return max(1, int(params["batch_size"]) // processes)
    return int(params["batch_per_rank"])


def upgraded(params: dict[str, Any]) -> dict[str, Any]:
    """Format-1 params in today's form: ``batch_size`` (global) as the ``batch_per_rank`` it meant.

    >>> upgraded({"batch_size": 64, "processes": 8, "threads": 2})
    {'processes': 8, 'threads': 2, 'batch_per_rank': 8}
    """
    if "batch_size" not in params:
        return dict(params)
    return {**{k: v for k, v in params.items() if k != "batch_size"}, "batch_per_rank": per_rank(params)}


def global_size(params: dict[str, Any]) -> int:
    """The samples of one forward/backward over all ranks (before gradient accumulation).

    >>> global_size({"batch_per_rank": 64, "processes": 8}), global_size({"batch_size": 64, "processes": 8})
    (512, 64)
    """
    return per_rank(params) * max(1, int(params.get("processes") or 1))


def accumulation(params: dict[str, Any]) -> int:
    global_batch = params.get("global_batch")
    if not global_batch:
        return 1
    return max(1, int(global_batch) // global_size(params))


def lr_scale(params: dict[str, Any], reference_batch: int) -> float:
    """The factor the workload's learning rate is multiplied by for this batch size."""
    if params.get("global_batch"):
        return 1.0
    rule = params.get("lr_scaling", "sqrt")
    ratio = global_size(params) / max(1, reference_batch)
    if rule == "linear":
        return ratio
    if rule == "sqrt":
        return math.sqrt(ratio)
    return 1.0
