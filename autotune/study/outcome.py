"""What a search returns: its study, the recipe, the records it chose from, and how its time went."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..recipe import Recipe
from .confirmation import Confirmation
from .records import TrialRecord


@dataclass(frozen=True)
class SearchOutcome:
    study: str
    recipe: Recipe
    baseline: TrialRecord
    best: TrialRecord
    records: list[TrialRecord]
    stopped: str
    elapsed_s: float
    confirmation: Confirmation | None = None
    noise: dict[str, Any] | None = None  # the calibration (``autotune.measure.Noise`` as a dict)
    spent: dict[str, float] = field(default_factory=dict)  # where the trials' time went (``report.time_spent``)


__all__ = ["SearchOutcome"]
