"""The noise rule, stated once: when one set of throughput measurements beats another.

Run-to-run noise on a shared machine is estimated from the measurements themselves: half the larger
relative range (max - min over the median) of the two sides, at least ``MIN_NOISE``. A gain must be
above it. The confirmation (``autotune.study.confirm``) applies it to side-by-side runs, the report
(``autotune.study.choice``) to single trials' timed windows when there was no confirmation.
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence

MIN_NOISE = 0.03  # a gain under 3% is not told apart from run-to-run noise on a shared machine


def relative_range(runs: Sequence[float]) -> float:
    """``(max - min) / median`` of the runs; 0 for fewer than two."""
    return (max(runs) - min(runs)) / statistics.median(runs) if len(runs) > 1 else 0.0


def allowance(*spreads: float | None) -> float:
    """The noise of a comparison from each side's relative range: half the larger, at least MIN_NOISE.

    >>> allowance(0.1, None), allowance(0.01, 0.02)
    (0.05, 0.03)
    """
    return max(MIN_NOISE, *((spread or 0.0) / 2 for spread in spreads))


def noise(baseline: Sequence[float], candidate: Sequence[float]) -> float:
    """Relative run-to-run noise of a comparison of two sets of runs (``allowance`` of their ranges)."""
    return allowance(relative_range(baseline), relative_range(candidate))


def beats(baseline: Sequence[float], candidate: Sequence[float]) -> bool:
    """Whether ``candidate``'s runs beat ``baseline``'s beyond noise.

    >>> beats([100, 101, 99], [110, 112, 109])
    True
    >>> beats([100, 101, 99], [102, 103, 102.5])   # +2.5%: within noise
    False
    """
    if not baseline or not candidate:
        return False
    gain = statistics.median(candidate) / statistics.median(baseline) - 1
    separated = len(baseline) < 2 or len(candidate) < 2 or min(candidate) > max(baseline)
    return gain > noise(baseline, candidate) and separated


__all__ = ["MIN_NOISE", "allowance", "beats", "noise", "relative_range"]
