"""``compile_mode``: ``torch.compile`` of the model.

In-process only. Offered on CPU only where the probe found a C++ compiler for inductor. Compile time
is measured separately by the trial runner and amortised over the planned run (``--train-steps``),
so a mode whose gain never pays back its compile time is not chosen.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, cast

from ._context import SpaceContext
from ._family import NoOp, Params, Prepared, SuggestingTrial

if TYPE_CHECKING:
    import torch

    from ..probes import Facts

KEYS = ("compile_mode",)
ENV_VARS: tuple[str, ...] = ()
OVERRIDES: tuple[str, ...] = ()

CPU_MODES = ("none", "default", "reduce-overhead", "max-autotune-no-cudagraphs")
CUDA_MODES = CPU_MODES + ("max-autotune",)


def modes(facts: Facts, ctx: SpaceContext) -> tuple[str, ...]:
    if not ctx.allow_compile:
        return ("none",)
    if ctx.device == "cuda":
        return CUDA_MODES
    runtime = facts.runtime
    if runtime is None or runtime.compile_cpu_ok is False:
        return ("none",)
    return CPU_MODES


def space(trial: SuggestingTrial, facts: Facts, ctx: SpaceContext) -> Params:
    return {"compile_mode": trial.suggest_categorical("compile_mode", modes(facts, ctx))}


def defaults(facts: Facts, ctx: SpaceContext) -> Params:
    return {"compile_mode": "none"}


heuristic = defaults  # run_cpu does not compile

# Hooks this family has nothing to do at (search_spaces._family).
promising = NoOp.promising
environment = NoOp.environment
apply_process = NoOp.apply_process
check_environment = NoOp.check_environment
prepare = NoOp.prepare


def prepare_model(params: Params, model: torch.nn.Module, device: str) -> Prepared:
    """``torch.compile(model, mode=compile_mode)``; done is empty: compile time is measured, not recorded here."""
    import torch

    mode = params.get("compile_mode", "none")
    if mode == "none":
        return Prepared(model)
    return Prepared(cast("torch.nn.Module", torch.compile(model, mode=mode)))
