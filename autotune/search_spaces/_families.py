"""Every knob family, in the seeds' order, the space they make together (``suggest``) and their keys' facts folded
with the run settings' (``schema``, ``environment_keys``, ``memory_keys``, ``in_place``).

A module of its own so that what replays the space (``_allowed``) imports it without importing the package. The
folds read ``FAMILIES`` when called: a family added to it is in every one.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from . import _amp as amp
from . import _batch as batch
from . import _compile as compilation
from . import _cuda as cuda
from . import _data as data
from . import _ddp as ddp
from . import _ipex as ipex
from . import _matmul as matmul
from . import _preload as preload
from . import _processes as processes
from . import _run as run
from . import _sparsity as sparsity
from . import _threads as threads
from ._context import SpaceContext
from ._family import KnobFamily, Params, SuggestingTrial, as_family

if TYPE_CHECKING:
    from ..probes import Facts
    from ._rules import Rule

# The order is the seeds' order (``promising``); which family's variable wins is declared (``OVERRIDES``), not
# taken from this order.
FAMILIES: tuple[KnobFamily, ...] = tuple(as_family(m) for m in (threads, preload, batch, data, amp, matmul, cuda,
                                                             compilation, processes, ddp, sparsity, ipex))


def merge_params(params: list[Params]) -> Params:
    """The families' params in one dict (no two families share a key: the contract test checks it)."""
    out: Params = {}
    for part in params:
        out.update(part)
    return out


def suggest(trial: SuggestingTrial, facts: Facts, ctx: SpaceContext) -> Params:
    """Sample every knob that matters on this hardware; returns the recipe's params.

    DDP's settings are sampled whenever several processes are offered, but one process starts no DDP: there
    the recipe holds PyTorch's, whatever the sampler drew: two recipes that differ only in them run the same."""
    params = merge_params([family.space(trial, facts, ctx) for family in FAMILIES])
    if processes.count(params) == 1:
        params.update(ddp.defaults(facts, ctx))
    return params


def schema() -> dict[str, Rule]:
    """What a recipe may hold under each key some family or run setting reads (``_schema.problems``)."""
    return {**run.SCHEMA, **{key: rule for family in FAMILIES for key, rule in family.SCHEMA.items()}}


def environment_keys() -> tuple[str, ...]:
    """The keys that must be in effect before torch starts or decide the process: one worker, one set of values."""
    return (*(key for family in FAMILIES for key in family.ENVIRONMENT_KEYS), *run.ENVIRONMENT_KEYS)


def memory_keys() -> tuple[str, ...]:
    """The keys that change what one process holds in memory for a given batch."""
    return (*run.MEMORY_KEYS, *(key for family in FAMILIES for key in family.MEMORY_KEYS))


def in_place() -> tuple[str, ...]:
    """The keys a running training process can change between two steps."""
    return tuple(key for family in FAMILIES for key in family.IN_PLACE)
