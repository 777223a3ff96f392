"""``compile_mode``: ``torch.compile`` of the model.

In-process only. Offered on CPU only where the probe found a C++ compiler for inductor. Compile time
is measured separately by the trial runner and amortised over the planned run (``--train-steps``),
so a mode whose gain never pays back its compile time is not chosen.
"""
from __future__ import annotations

from typing import Any

from ._context import SpaceContext

KEYS = ("compile_mode",)

CPU_MODES = ("none", "default", "reduce-overhead", "max-autotune-no-cudagraphs")
CUDA_MODES = CPU_MODES + ("max-autotune",)


def modes(facts: Any, ctx: SpaceContext) -> tuple[str, ...]:
    if not ctx.allow_compile:
        return ("none",)
    if ctx.device == "cuda":
        return CUDA_MODES
    runtime = facts.runtime
    if runtime is None or runtime.compile_cpu_ok is False:
        return ("none",)
    return CPU_MODES


def suggest(trial: Any, facts: Any, ctx: SpaceContext) -> dict[str, Any]:
    return {"compile_mode": trial.suggest_categorical("compile_mode", modes(facts, ctx))}


def defaults(facts: Any, ctx: SpaceContext) -> dict[str, Any]:
    return {"compile_mode": "none"}


def prepare_model(params: dict[str, Any], model: Any) -> Any:
    import torch

    mode = params.get("compile_mode", "none")
    if mode == "none":
        return model
    return torch.compile(model, mode=mode)
