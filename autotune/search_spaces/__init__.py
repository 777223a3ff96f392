"""The search space: one module per knob family.

Each family is a ``KnobFamily`` (``_family.py``): for its recipe keys (``KEYS``) the define-by-run
``space(trial, facts, ctx)`` conditional on the probed facts, PyTorch's ``defaults(facts, ctx)``, the
``heuristic`` seed (``torch.backends.xeon.run_cpu``'s choices), ``promising`` single changes to measure
first, the ``environment`` variables that must be set before torch starts (declared in ``ENV_VARS``;
``OVERRIDES`` names those of other families it replaces), ``apply_process``/``check_environment`` inside
the process and ``prepare_model``/``prepare`` for the model. Each family also owns its keys' facts (their
``SCHEMA``, and which decide a process, change memory or change in place), folded here as ``schema``,
``environment_keys``, ``memory_keys`` and ``in_place``. The functions here loop over ``FAMILIES`` (read when
called: ``_families``); the trial runner, the exported env file and ``autotune.apply()`` all go through them, so
what was measured is what is applied. Adding a knob is its module, one line in ``FAMILIES`` and its section in
``docs/knobs.md`` (``tests/search_spaces/test_knob_contract.py`` checks the rest); a knob a running process can
change (``IN_PLACE``) also needs its switch in ``Tuned.switch``.

Example::

    >>> import optuna
    >>> from autotune.search_spaces import suggest, SpaceContext
    >>> params = suggest(optuna.trial.FixedTrial({"threads": 1, ...}), facts, SpaceContext())  # doctest: +SKIP
"""
from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Final

from . import _amp as amp
from . import _batch as batch
from . import _compile as compilation
from . import _cuda as cuda
from . import _data as data
from . import _ddp as ddp
from . import _families, _schema
from . import _ipex as ipex
from . import _matmul as matmul
from . import _preload as preload
from . import _processes as processes
from . import _run as run
from . import _sparsity as sparsity
from . import _threads as threads
from ._allowed import AllowedValues, allowed_values, as_trial, outside, suggested
from ._context import SpaceContext, conv_layers
from ._effect import membind_off, not_in_effect
from ._families import FAMILIES, environment_keys, in_place, memory_keys, merge_params, schema, suggest
from ._family import KnobFamily, Params, Prepared, SuggestingTrial

if TYPE_CHECKING:
    from ..probes import Facts

# The seeds' roles (``seeds``), as the study records them (``study.records``: one spelling).
BASELINE: Final = "baseline"  # PyTorch's defaults: what every trial is compared with
HEURISTIC: Final = "heuristic"  # what torch.backends.xeon.run_cpu would set (``heuristic``)
SEED: Final = "seed"  # a family's promising single change (``promising``), or the heuristic's allocator alone

__all__ = [
    "AllowedValues",
    "BASELINE",
    "FAMILIES",
    "KnobFamily",
    "Params",
    "Prepared",
    "HEURISTIC",
    "RUN_KEYS",
    "SEED",
    "SpaceContext",
    "conv_layers",
    "allowed_values",
    "amp",
    "as_trial",
    "batch",
    "check_environment",
    "compilation",
    "controlled_variables",
    "cuda",
    "cpus_for",
    "data",
    "ddp",
    "defaults",
    "beyond",
    "env_forms",
    "environment",
    "environment_keys",
    "heuristic",
    "in_place",
    "interactions",
    "ipex",
    "matmul",
    "apply_process",
    "as_run",
    "memory_keys",
    "memory_nodes",
    "membind_off",
    "not_in_effect",
    "outside",
    "preload",
    "processes",
    "recipe_problems",
    "refused",
    "schema",
    "seeds",
    "sparsity",
    "suggest",
    "SuggestingTrial",
    "suggested",
    "threads",
    "worker_cpus",
]

RUN_KEYS = run.KEYS  # stored with every recipe, never searched (``_run``)
recipe_problems = _schema.problems  # what in a recipe's params no search writes (``_schema``)


def defaults(facts: Facts, ctx: SpaceContext) -> Params:
    """PyTorch's defaults: the baseline every recipe is compared with (trial 0)."""
    return merge_params([family.defaults(facts, ctx) for family in _families.FAMILIES])


def heuristic(facts: Facts, ctx: SpaceContext) -> Params:
    """The fixed recipe ``torch.backends.xeon.run_cpu`` / ipexrun would apply."""
    return merge_params([family.heuristic(facts, ctx) for family in _families.FAMILIES])


def controlled_variables() -> tuple[str, ...]:
    """Every environment variable some knob sets: the trial runner clears them for a clean baseline."""
    return tuple(sorted({var for family in _families.FAMILIES for var in family.ENV_VARS}))


def seeds(facts: Facts, ctx: SpaceContext) -> list[tuple[str, Params]]:
    """The trials to measure before sampling: the baseline, the heuristic, then single promising
    changes of the defaults offered by the families (``promising(facts, ctx)``)."""
    base = defaults(facts, ctx)
    out = [(BASELINE, base), (HEURISTIC, {**base, **heuristic(facts, ctx)})]
    for family in _families.FAMILIES:
        for change in family.promising(facts, ctx):
            out.append((SEED, {**base, **change}))
    return out


def interactions(facts: Facts, ctx: SpaceContext) -> list[Params]:
    """Changes the families say may pay only beside another family's gain (``interactions(facts, ctx)``): the
    search tries them with its best in-process recipe once its seeds are measured."""
    return [change for family in _families.FAMILIES for change in family.interactions(facts, ctx)]


def environment(params: Params, facts: Facts) -> dict[str, str]:
    """Environment variables to set before torch starts (never read from os.environ). A variable two
    families set takes the value of the one that declares it in ``OVERRIDES``, whatever their order."""
    env: dict[str, str] = {}
    for family in _families.FAMILIES:
        for key, value in family.environment(params, facts).items():
            if key not in env or key in family.OVERRIDES:
                env[key] = value
    return env


def beyond(params: Params, facts: Facts) -> list[str]:
    """The knobs of ``params`` above what this machine offers (a recipe of a larger machine, or one edited by
    hand): warnings where it is launched here. Values no machine is offered are ``recipe_problems``."""
    gpus = len(facts.gpus) if params.get("device") == "cuda" else 0
    most = {"threads": (threads.max_threads(facts), "the CPUs this process may use"),
            "num_workers": (data.most_workers(facts), "its cores, at most 8"),
            "processes": (gpus or int(facts.cpu.allowed.cores or 1), "its GPUs" if gpus else "its cores")}
    return [f"{key}={params[key]} is more than this machine offers ({limit}: {what})"
            for key, (limit, what) in most.items() if type(params.get(key)) is int and params[key] > limit]


def refused(params: Params, facts: Facts) -> list[str]:
    """Why a search on this machine does not measure ``params`` (a shared study's trial, one enqueued by another
    hand): what no search writes (``recipe_problems``), else knobs above what this machine offers (``beyond``),
    which its space never asks; ``[]`` for params it could have asked."""
    return recipe_problems(params) or beyond(params, facts)


def env_forms(params: Params) -> dict[str, re.Pattern[str]]:
    """Every variable some family may set for ``params`` on any machine, with the form of its value (what an env
    file may hold for the recipe: ``autotune.recipe_file``)."""
    forms: dict[str, str] = {}
    for family in _families.FAMILIES:
        forms.update(family.env_forms(params))
    return {key: re.compile(form) for key, form in forms.items()}


def _overriders_last() -> list[KnobFamily]:
    """``FAMILIES`` with those that override other families' variables after the rest, so their
    in-process settings win too (``processes`` sets a rank's share of the threads family's threads)."""
    return sorted(_families.FAMILIES, key=lambda family: bool(family.OVERRIDES))


def _replaced(params: Params, facts: Facts) -> list[KnobFamily]:
    """The families some other family overrides for these params (it sets one of their variables)."""
    out = []
    for family in _families.FAMILIES:
        taken = set(family.OVERRIDES) & set(family.environment(params, facts))
        out += [other for other in _families.FAMILIES if other is not family and taken & set(other.ENV_VARS)]
    return out


def cpus_for(params: Params, facts: Facts) -> list[int] | None:
    """CPUs to pin the process to before torch starts, or None to keep the inherited affinity."""
    if processes.count(params) > 1:  # the ranks' CPUs: each rank narrows it to its own slice
        return processes.cpus_for(params, facts)
    compute, workers = threads.cpus_for(params, facts), worker_cpus(params, facts)
    if compute is None or workers is None:
        return compute
    return sorted(set(compute) | set(workers))  # apply() pins the compute threads, worker_init_fn the workers


def worker_cpus(params: Params, facts: Facts) -> list[int] | None:
    """CPUs for the DataLoader workers apart from the compute threads', or None (see ``data.worker_cpus``)."""
    return None if processes.count(params) > 1 else data.worker_cpus(params, facts)


def memory_nodes(params: Params, facts: Facts) -> tuple[int, ...] | None:
    """NUMA nodes to bind the process's memory to (``numactl --membind``), or None for no binding
    (also when the recipe was measured unbound: ``membind`` False)."""
    if params.get("membind") is False:
        return None
    return threads.memory_nodes(cpus_for(params, facts), facts)


def as_run(params: Params, facts: Facts) -> Params:
    """``params`` as a process of them runs here: ``membind`` False where the memory binding their pinning implies
    (``memory_nodes``) cannot happen (numactl missing or refused: the launcher starts them unbound), as a trial's
    record says once it ran (``membind_off``). A search asks its trials so: the record's environment is then the
    one its worker and factor were keyed by."""
    nodes = memory_nodes(params, facts)
    numactl = getattr(facts.runtime, "numactl_path", None)  # as the launcher reads it (``trial.launch``)
    if nodes and (numactl is None or threads.membind_refused(numactl, nodes) is not None):
        return {**params, "membind": False}
    return params


def apply_process(params: Params, facts: Facts | None = None) -> list[str]:
    """Apply the in-process settings of every family; returns warnings. With ``facts``, also pins the
    compute threads apart from the DataLoader workers' CPUs (``data.pin_compute_threads``)."""
    problems: list[str] = processes.pin_rank(params)  # first: before any family starts torch's thread pools
    for family in _overriders_last():
        problems += family.apply_process(params, facts)
    if facts is not None and processes.count(params) == 1:
        problems += data.pin_compute_threads(params, facts)
    return problems


def check_environment(params: Params, facts: Facts) -> list[str]:
    """Environment-level knobs of the recipe that are not in effect in this process. A family another one
    overrides here is checked by that one (with several processes each rank checks its own CPU slice
    instead of the process-wide affinity)."""
    problems = []
    for key, value in environment(params, facts).items():
        # LD_PRELOAD may hold the user's own libraries too: preload checks what is actually mapped.
        if key != "LD_PRELOAD" and os.environ.get(key) != value:
            problems.append(f"{key}={value} (is {os.environ.get(key)!r})")
    replaced = _replaced(params, facts)
    for family in _families.FAMILIES:
        if family not in replaced:
            problems += family.check_environment(params, facts)
    return problems + threads.check_memory_binding(memory_nodes(params, facts), facts)
