"""``ipex``: ``intel_extension_for_pytorch.optimize`` of the model and optimizer (CPU training).

Offered only when the probe found IPEX installed *and* built for this torch (``Runtime.ipex_version``,
``Runtime.ipex_compatible``): an IPEX built for another torch fails at import or, worse, at run time.
In-process only, in ``Tuned.prepare(model, optimizer)``: ``ipex.optimize`` needs both for training (it
re-lays out weights and may swap the optimizer's update for a fused one), with the recipe's autocast
dtype (``bfloat16``/``float16``; none for float32). It works in place on the module under
``torch.compile``, so a model from ``Tuned.prepare_model`` stays valid.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ._context import SpaceContext
from ._family import Params, Prepared, SuggestingTrial
from ._rules import BOOLEAN, Rule

if TYPE_CHECKING:
    import torch

    from ..probes import Facts

KEYS = ("ipex",)
ENV_VARS: tuple[str, ...] = ()
OVERRIDES: tuple[str, ...] = ()
SCHEMA: dict[str, Rule] = {"ipex": BOOLEAN}


def available(facts: Facts, ctx: SpaceContext) -> bool:
    runtime = facts.runtime
    return (
        ctx.device == "cpu"
        and runtime is not None
        and bool(runtime.ipex_version)
        and runtime.ipex_compatible is True
    )


def space(trial: SuggestingTrial, facts: Facts, ctx: SpaceContext) -> Params:
    if not available(facts, ctx):
        return defaults(facts, ctx)
    return {"ipex": trial.suggest_categorical("ipex", (False, True))}


def defaults(facts: Facts, ctx: SpaceContext) -> Params:
    return {"ipex": False}


def heuristic(facts: Facts, ctx: SpaceContext) -> Params:
    return defaults(facts, ctx)  # ipexrun is a launcher: it does not call ipex.optimize


# Hooks this family has nothing to do at (search_spaces._family).


def prepare(params: Params, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Prepared:
    """``ipex.optimize(model, optimizer=…, dtype=…)`` when the recipe says so; returns the model, the
    optimizer, what is in effect and problems worth a warning."""
    if not params.get("ipex"):
        return Prepared(model, optimizer=optimizer)
    import torch

    try:
        import intel_extension_for_pytorch as ipex
    except ImportError as e:
        return Prepared(model, optimizer=optimizer, problems=(
            f"ipex=True not applied: intel_extension_for_pytorch cannot be imported ({e}); install the release "
            f"built for torch {torch.__version__}",
        ))
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(params.get("amp_dtype", "float32"))
    inner = getattr(model, "_orig_mod", model)  # under torch.compile: optimize the module it wraps, in place
    optimized, optimizer = ipex.optimize(inner, dtype=dtype, optimizer=optimizer, inplace=True)
    model = optimized if model is inner else model
    done = {"ipex": getattr(ipex, "__version__", "?"), "ipex_dtype": str(dtype)}
    return Prepared(model, done, optimizer=optimizer)
