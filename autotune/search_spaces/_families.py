"""Every knob family, in the seeds' order, and the space they make together: ``suggest``.

A module of its own so that what replays the space (``_allowed``) imports it without importing the package.
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
from . import _sparsity as sparsity
from . import _threads as threads
from ._context import SpaceContext
from ._family import KnobFamily, Params, SuggestingTrial, as_family

if TYPE_CHECKING:
    from ..probes import Facts

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
