"""The search space (installed as ``autotune.search_spaces``): one module per knob family.

Each family defines, for its recipe keys, the define-by-run space ``suggest(trial, facts, ctx)``
conditional on the probed facts and PyTorch's ``defaults(facts, ctx)``; where it has them, also the
``heuristic`` seed (``torch.backends.xeon.run_cpu``'s choices; else its defaults), ``promising`` single
changes to measure first, the ``environment`` variables that must be set before torch starts (listed
in ``ENV_VARS``), and ``apply_process`` for what is set inside the process. The trial runner, the
exported env file and ``autotune.apply()`` all go through these functions, so what was measured is
what is applied.

Example::

    >>> import optuna
    >>> from autotune.search_spaces import suggest, SpaceContext
    >>> params = suggest(optuna.trial.FixedTrial({"threads": 1, ...}), facts, SpaceContext())
"""
from __future__ import annotations

from typing import Any

from . import _amp as amp
from . import _batch as batch
from . import _compile as compilation
from . import _data as data
from . import _ipex as ipex
from . import _processes as processes
from . import _preload as preload
from . import _sparsity as sparsity
from . import _threads as threads
from ._allowed import Allowed, allowed_values, outside, suggested
from ._context import SpaceContext
from ._effect import membind_off, not_in_effect

__all__ = [
    "Allowed",
    "FAMILIES",
    "RUN_KEYS",
    "SpaceContext",
    "allowed_values",
    "amp",
    "batch",
    "check_environment",
    "compilation",
    "controlled_variables",
    "cpus_for",
    "data",
    "defaults",
    "environment",
    "heuristic",
    "ipex",
    "apply_process",
    "memory_nodes",
    "membind_off",
    "not_in_effect",
    "outside",
    "preload",
    "processes",
    "seeds",
    "sparsity",
    "suggest",
    "suggested",
    "threads",
    "worker_cpus",
]

# processes comes after threads: its environment and apply_process give each rank its share of the threads.
FAMILIES = (threads, preload, batch, data, amp, compilation, processes, sparsity, ipex)

# Run settings stored with every recipe (not searched): they decide how the knobs are applied. ``membind``
# (False only) is stored when a trial ran without the memory binding its pinning implies (``membind_off``).
RUN_KEYS = ("device", "global_batch", "lr_scaling", "reference_batch", "membind")


def _merge(method: str, *args: Any) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for family in FAMILIES:
        params.update(getattr(family, method, family.defaults)(*args))  # no heuristic: PyTorch's defaults
    return params


def suggest(trial: Any, facts: Any, ctx: SpaceContext) -> dict[str, Any]:
    """Sample every knob that matters on this hardware; returns the recipe's params."""
    return _merge("suggest", trial, facts, ctx)


def defaults(facts: Any, ctx: SpaceContext) -> dict[str, Any]:
    """PyTorch's defaults: the baseline every recipe is compared with (trial 0)."""
    return _merge("defaults", facts, ctx)


def heuristic(facts: Any, ctx: SpaceContext) -> dict[str, Any]:
    """The fixed recipe ``torch.backends.xeon.run_cpu`` / ipexrun would apply."""
    return _merge("heuristic", facts, ctx)


def controlled_variables() -> tuple[str, ...]:
    """Every environment variable some knob sets: the trial runner clears them for a clean baseline."""
    return tuple(sorted({var for family in FAMILIES for var in getattr(family, "ENV_VARS", ())}))


def seeds(facts: Any, ctx: SpaceContext) -> list[tuple[str, dict[str, Any]]]:
    """The trials to measure before sampling: the baseline, the heuristic, then single promising
    changes of the defaults offered by the families (``promising(facts, ctx)``)."""
    base = defaults(facts, ctx)
    out = [("baseline", base), ("heuristic", {**base, **heuristic(facts, ctx)})]
    for family in FAMILIES:
        for change in getattr(family, "promising", lambda f, c: [])(facts, ctx):
            out.append(("seed", {**base, **change}))
    return out


def environment(params: dict[str, Any], facts: Any) -> dict[str, str]:
    """Environment variables to set before torch starts (never read from os.environ)."""
    env: dict[str, str] = {}
    for family in FAMILIES:
        if hasattr(family, "environment"):
            env.update(family.environment(params, facts))
    return env


def cpus_for(params: dict[str, Any], facts: Any) -> list[int] | None:
    """CPUs to pin the process to before torch starts, or None to keep the inherited affinity."""
    if processes.count(params) > 1:  # the ranks' CPUs: each rank narrows it to its own slice
        return processes.cpus_for(params, facts)
    compute, workers = threads.cpus_for(params, facts), worker_cpus(params, facts)
    if compute is None or workers is None:
        return compute
    return sorted(set(compute) | set(workers))  # apply() pins the compute threads, worker_init_fn the workers


def worker_cpus(params: dict[str, Any], facts: Any) -> list[int] | None:
    """CPUs for the DataLoader workers apart from the compute threads', or None (see ``data.worker_cpus``)."""
    return None if processes.count(params) > 1 else data.worker_cpus(params, facts)


def memory_nodes(params: dict[str, Any], facts: Any) -> tuple[int, ...] | None:
    """NUMA nodes to bind the process's memory to (``numactl --membind``), or None for no binding
    (also when the recipe was measured unbound: ``membind`` False)."""
    if params.get("membind") is False:
        return None
    return threads.memory_nodes(cpus_for(params, facts), facts)


def apply_process(params: dict[str, Any], facts: Any = None) -> list[str]:
    """Apply the in-process settings of every family; returns warnings. With ``facts``, also pins the
    compute threads apart from the DataLoader workers' CPUs (``data.pin_compute_threads``)."""
    problems: list[str] = processes.pin_rank(params)  # first: before any family starts torch's thread pools
    for family in FAMILIES:
        if hasattr(family, "apply_process"):
            problems += family.apply_process(params)
    if facts is not None and processes.count(params) == 1:
        problems += data.pin_compute_threads(params, facts)
    return problems


def check_environment(params: dict[str, Any], facts: Any) -> list[str]:
    """Environment-level knobs of the recipe that are not in effect in this process."""
    import os

    problems = []
    for key, value in environment(params, facts).items():
        # LD_PRELOAD may hold the user's own libraries too: preload checks what is actually mapped.
        if key != "LD_PRELOAD" and os.environ.get(key) != value:
            problems.append(f"{key}={value} (is {os.environ.get(key)!r})")
    # With several processes each rank checks its own slice instead of the process-wide affinity.
    per_process = processes.check_environment if processes.count(params) > 1 else threads.check_environment
    memory = threads.check_memory_binding(memory_nodes(params, facts), facts)
    return problems + per_process(params, facts) + memory + preload.check_environment(params, facts)
