"""``compile_mode``: ``torch.compile`` of the model.

In-process only. Offered on CPU only where the probe found a C++ compiler for inductor. Compile time
is measured separately by the trial runner and amortised over the planned run (``--train-steps``),
so a mode whose gain never pays back its compile time is not chosen.

What counts as compile time (``compile_cost``): the first step's excess over a steady step (dynamo and
inductor compile there); with CUDA graphs (``reduce-overhead``, ``max-autotune`` on CUDA) also steps 2
and 3, where cudagraph trees warm up and record the graph
(https://pytorch.org/docs/stable/torch.compiler_cudagraph_trees.html). An eager run compiles nothing:
its first step's lazy CUDA, cuBLAS and cuDNN initialisation is not charged to it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, cast

from ._context import SpaceContext
from ._family import Params, Prepared, SuggestingTrial
from ._rules import Rule, one_of

if TYPE_CHECKING:
    import torch

    from ..probes import Facts

KEYS = ("compile_mode",)
ENV_VARS: tuple[str, ...] = ()
OVERRIDES: tuple[str, ...] = ()

CPU_MODES = ("none", "default", "reduce-overhead", "max-autotune-no-cudagraphs")
CUDA_MODES = CPU_MODES + ("max-autotune",)
SCHEMA: dict[str, Rule] = {"compile_mode": one_of(CUDA_MODES)}
MEMORY_KEYS = KEYS  # autotuning and CUDA graphs hold buffers of their own
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # inductor captures CUDA graphs on CUDA
CUDA_GRAPH_STEPS = 3  # compile in step 1; cudagraph trees warm up in step 2 and record in step 3


def compiled(params: Params) -> bool:
    """Whether the recipe compiles its model (an older recipe without the key does not)."""
    return (params.get("compile_mode") or "none") != "none"


def charged_steps(mode: str | None, device: str) -> int:
    """How many first steps hold compile work: 0 eager, 3 with CUDA graphs on CUDA, else 1.

    >>> charged_steps("none", "cuda"), charged_steps("default", "cuda"), charged_steps("reduce-overhead", "cuda")
    (0, 1, 3)
    >>> charged_steps("reduce-overhead", "cpu")  # no CUDA graphs on the CPU
    1
    """
    if mode in (None, "none"):
        return 0
    return CUDA_GRAPH_STEPS if device == "cuda" and mode in CUDA_GRAPH_MODES else 1


def compile_cost(first_steps_s: list[float], steady_step_s: float, mode: str | None, device: str) -> float:
    """Seconds of compilation (and CUDA-graph capture) in the first steps: each charged step's excess over
    a steady step (``charged_steps``). Steps beyond those timed one by one are not charged.

    >>> round(compile_cost([30.0, 2.0, 1.5, 0.1], 0.1, "reduce-overhead", "cuda"), 6)  # 29.9 + 1.9 + 1.4
    33.2
    >>> compile_cost([30.0, 2.0, 1.5], 0.1, "default", "cuda"), compile_cost([5.0], 0.1, "none", "cuda")
    (29.9, 0.0)
    """
    charged = first_steps_s[:charged_steps(mode, device)]
    return sum((max(0.0, step - steady_step_s) for step in charged), 0.0)


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


def prepare_model(params: Params, model: torch.nn.Module, device: str) -> Prepared:
    """``torch.compile(model, mode=compile_mode)``; done is empty: compile time is measured, not recorded here."""
    import torch

    mode = params.get("compile_mode", "none")
    if mode == "none":
        return Prepared(model)
    return Prepared(cast("torch.nn.Module", torch.compile(model, mode=mode)))
