"""A candidate as the live measurer holds it while the race measures it (``Candidate``), and the rules every path
of it shares: which environment is the defaults', how two ratios combine, a failed arm's state as a status."""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ..trial.spec import Status, TrialResult
from . import stats
from .environment import DEFAULTS, ENVIRONMENT_KEYS
from .paired_worker import PairedWorker
from .protocol import ArmStatus, PairRecord

FRESH_PAIRS = 3  # fresh-process pairs a multi-process candidate needs at least (its first call to ``more``)
NOTHING = stats.Interval(0.0, 0.0, 0.0, 0.0, 0)  # no pair yet (or an arm failed before one): slower than anything


def same_environment(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in ENVIRONMENT_KEYS)


def combine(first: stats.Interval, second: stats.Interval) -> stats.Interval:
    """The product of two independent ratios, each with its interval: log distances add in quadrature.

    >>> iv = combine(stats.Interval(1.0, 0.9, 1.1, 0.95, 3), stats.Interval(2.0, 2.0, 2.0, 0.95, 16))
    >>> round(iv.median, 3), round(iv.low, 3), round(iv.high, 3)
    (2.0, 1.8, 2.2)
    """
    centre = math.log(first.median) + math.log(second.median)

    def spread(a: stats.Interval, b: stats.Interval, side: Literal["low", "high"]) -> float:
        return math.hypot(*(abs(math.log(getattr(iv, side)) - math.log(iv.median)) if getattr(iv, side) > 0
                            else math.inf for iv in (a, b)))

    low, high = spread(first, second, "low"), spread(first, second, "high")
    return stats.Interval(math.exp(centre), math.exp(centre - low), math.exp(centre + high),
                          min(first.confidence, second.confidence), min(first.count, second.count))


def status_of(state: str) -> Status:
    """A failed arm's state as a trial's status (``no-room``, which is not a failure of the recipe, and
    any state this version does not know, read as a crash)."""
    try:
        return Status(state)
    except ValueError:
        return Status.CRASH


@dataclass
class Candidate:
    """One candidate being measured: where its arm lives and what it has cost so far."""

    params: dict[str, Any]
    name: str
    seed: int
    started: float
    worker: PairedWorker | None = None  # None: fresh process pairs (``processes`` > 1) or the baseline
    base: str = DEFAULTS  # the arm it is paired with in ``worker``
    in_process: bool = True  # False: the candidate IS its environment's defaults arm (only the factor counts)
    factor: stats.Interval | None = None  # its environment / the defaults, from process pairs
    factor_key: str | None = None  # its environment (``environment_key``) when it is not the defaults'
    rounds: int = 0  # calls to ``more`` so far: the race's rounds
    baseline: bool = False  # the defaults themselves: the calibration is their measurement
    records: list[PairRecord] = field(default_factory=list)
    base_status: ArmStatus | None = None
    cand_status: ArmStatus | None = None
    fresh: list[tuple[TrialResult, TrialResult]] = field(default_factory=list)  # (defaults, candidate) runs
    failed: TrialResult | None = None
    startup_s: float = 0.0
    warmup_s: float = 0.0
    timed_s: float = 0.0
    warnings: list[str] = field(default_factory=list)
    interval: stats.Interval | None = None

    def fresh_result(self, interval: stats.Interval) -> TrialResult:
        """The result of a candidate measured in fresh process pairs: its first run's, with the pairs' interval."""
        runs = [c for _, c in self.fresh]
        if not runs:
            return TrialResult(Status.CRASH, error="no fresh process pair ran", wall_s=time.monotonic() - self.started)
        return replace(runs[0], objective=interval.median, speedup_low=interval.low, speedup_high=interval.high,
                       method="fresh process pairs", pairs=interval.count,
                       samples_per_s=statistics.median(r.samples_per_s or 0.0 for r in runs),
                       startup_s=self.startup_s, warmup_s=self.warmup_s, timed_s=self.timed_s,
                       wall_s=time.monotonic() - self.started, warnings=self.warnings)
