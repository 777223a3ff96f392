"""Progress of a search, as typed events: ``search(progress=...)`` receives them in this order:
``SearchStarted``, then ``TrialStarted`` and ``TrialFinished`` for every trial (confirmation runs
included), then ``SearchDone``. The CLI prints them (``autotune.cli.search``); autotune itself prints nothing.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..trial.spec import TrialResult
from .outcome import SearchOutcome

if TYPE_CHECKING:
    from ..probes import Facts
    from ..search_spaces import SpaceContext


@dataclass(frozen=True)
class SearchStarted:
    study: str
    facts: Facts
    context: SpaceContext
    budget_s: float | None
    resumed: bool  # the study held trials already: this search continues it
    defaults: dict[str, Any]  # PyTorch's defaults (the baseline's params) with the run settings


@dataclass(frozen=True)
class TrialStarted:
    number: int
    role: str
    params: dict[str, Any]


@dataclass(frozen=True)
class TrialFinished:
    number: int
    role: str
    params: dict[str, Any]
    result: TrialResult
    reason: str | None  # why it is infeasible, or its error


@dataclass(frozen=True)
class Phase:
    """What the search is doing now, for the live display: ``name`` is one of "calibrating noise",
    "starting", "compiling", "warm-up", "paired windows", "evaluating", "confirming"."""

    name: str
    trial: int | None = None
    detail: str = ""


@dataclass(frozen=True)
class SearchDone:
    outcome: SearchOutcome


Event = SearchStarted | TrialStarted | Phase | TrialFinished | SearchDone
Progress = Callable[[Event], None]


def ignore(event: Event) -> None:
    """The progress receiver of a search nobody watches."""


__all__ = ["Event", "Phase", "Progress", "SearchDone", "SearchStarted", "TrialFinished", "TrialStarted", "ignore"]
