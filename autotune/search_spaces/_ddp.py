"""``DistributedDataParallel``'s settings, for recipes that train in several processes (``processes``).

Searched where more than one process is offered; a one-process recipe holds PyTorch's (no DDP there: ``suggest``):

| recipe key | values | PyTorch's | what it changes |
| --- | --- | --- | --- |
| ``gradient_as_bucket_view`` | false, true | false | gradients are views into the buckets: one copy less a step |
| ``bucket_cap_mb`` | 5, 25, 100 | 25 | all-reduce size: more overlap with backward (small), fewer calls (large) |
| ``static_graph`` | false, true (no ``--global-batch``) | false | the used parameters never change: DDP checks less |

Detected, not searched (the same in every trial of a study, and in the recipe):

- ``find_unused_parameters``: whether some parameter gets no gradient from the loss. DDP without it hangs
  or fails at the next step ("Expected to have finished reduction in the prior iteration") when one does,
  and with it walks the autograd graph every step. The search looks once, with one forward and backward
  of two samples on the CPU from the model's outputs (``unused_parameters``,
  ``SpaceContext.unused_parameters``), and sets it where needed: https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html
- ``broadcast_buffers`` (not a recipe key: read from the model by ``ddp_options``): DDP broadcasts rank
  0's buffers before every forward by default, which BatchNorm's running statistics need. Buffers that
  never change (2:4 masks: ``constant_buffers`` on the module) need no broadcast: off when every buffer
  of the model is such a constant.

Gradient accumulation (``--global-batch``) all-reduces only on the micro-batch that steps the optimizer:
``Tuned`` sets ``require_backward_grad_sync`` (what ``DistributedDataParallel.no_sync()`` sets) before
each forward (``autotune.apply``). A static graph does not survive that: DDP asserts, or stops all-reducing
after the first step, when ``require_backward_grad_sync`` is off before a static graph's first forward
(pytorch/pytorch#143580, open; its fix, #187732, is not merged). So ``static_graph`` is searched only
without ``--global-batch``, and ``ddp_options`` leaves it off whenever a recipe accumulates.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..workloads import output_tensors
from . import _batch as batch
from . import _processes as processes
from ._context import SpaceContext
from ._family import Params, SuggestingTrial
from ._rules import BOOLEAN, Rule, one_of

if TYPE_CHECKING:
    import torch

    from ..probes import Facts

KEYS = ("gradient_as_bucket_view", "bucket_cap_mb", "static_graph", "find_unused_parameters")
ENV_VARS: tuple[str, ...] = ()
OVERRIDES: tuple[str, ...] = ()
BUCKET_CAP_MB = (5, 25, 100)
SCHEMA: dict[str, Rule] = {"gradient_as_bucket_view": BOOLEAN, "bucket_cap_mb": one_of(BUCKET_CAP_MB),
                           "static_graph": BOOLEAN, "find_unused_parameters": BOOLEAN}
CONSTANT_BUFFERS = "constant_buffers"  # a module attribute: names of its buffers that never change


def defaults(facts: Facts, ctx: SpaceContext) -> Params:
    """PyTorch's defaults, and whether the model needs ``find_unused_parameters`` (detected)."""
    return {"gradient_as_bucket_view": False, "bucket_cap_mb": 25, "static_graph": False,
            "find_unused_parameters": ctx.unused_parameters}


heuristic = defaults  # run_cpu starts no DDP

# Hooks this family has nothing to do at (search_spaces._family): DDP is built by ``Tuned.prepare_model``
# with ``ddp_options``, where the process group is known.


def space(trial: SuggestingTrial, facts: Facts, ctx: SpaceContext) -> Params:
    out = defaults(facts, ctx)
    if len(processes.choices(facts, ctx)) == 1:
        return out  # one process only: no DDP to tune
    out["gradient_as_bucket_view"] = trial.suggest_categorical("gradient_as_bucket_view", (False, True))
    out["bucket_cap_mb"] = trial.suggest_categorical("bucket_cap_mb", BUCKET_CAP_MB)
    if not ctx.global_batch:  # accumulation and a static graph break DDP (the module docstring)
        out["static_graph"] = trial.suggest_categorical("static_graph", (False, True))
    return out


def constant_buffers(model: torch.nn.Module) -> bool:
    """Whether every buffer of ``model`` is declared constant by its module (``CONSTANT_BUFFERS``); a model
    without buffers has nothing to broadcast either."""
    return all(name in getattr(module, CONSTANT_BUFFERS, ())
               for module in model.modules() for name, _ in module.named_buffers(recurse=False))


def ddp_options(params: Params, model: torch.nn.Module) -> dict[str, Any]:
    """``DistributedDataParallel``'s keyword arguments for this recipe and model (absent keys: PyTorch's
    defaults, as in a recipe of an older autotune).

    >>> import torch
    >>> ddp_options({"bucket_cap_mb": 100}, torch.nn.Linear(2, 2))["bucket_cap_mb"]
    100
    """
    return {
        "gradient_as_bucket_view": bool(params.get("gradient_as_bucket_view", False)),
        "bucket_cap_mb": int(params.get("bucket_cap_mb") or 25),
        "static_graph": bool(params.get("static_graph", False)) and batch.accumulation(params) == 1,
        "find_unused_parameters": bool(params.get("find_unused_parameters", False)),
        "broadcast_buffers": not constant_buffers(model),
    }


def unused_parameters(model: torch.nn.Module, inputs: tuple[Any, ...]) -> list[str]:
    """The names of ``model``'s trainable parameters that no output of ``model(*inputs)`` depends on: one
    forward and a backward from every output, on a copy of the model (the caller's keeps no gradients).
    From the outputs, as DDP's own search goes (``prepare_for_backward(outputs)``), and without the user's
    loss, which the search process never calls.

    >>> import torch
    >>> class Net(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.used, self.spare = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)
    ...     def forward(self, x):
    ...         return self.used(x)
    >>> unused_parameters(Net(), (torch.zeros(2, 4),))
    ['spare.weight', 'spare.bias']
    """
    import copy

    import torch

    probe = copy.deepcopy(model)
    probe.train()
    outputs = [t for t in output_tensors(probe(*inputs)) if t.requires_grad]
    if not outputs:
        return []  # nothing to follow back: unknown, not "all unused"
    torch.stack([t.float().sum() for t in outputs]).sum().backward()
    return [name for name, p in probe.named_parameters() if p.requires_grad and p.grad is None]
