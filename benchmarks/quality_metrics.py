"""The search benchmark's scores (issue 58, item 2): figures a search can fail, on the log scale.

``truth`` maps a grid cell to its speedup T over the defaults; ``best`` is T*, the highest. The truth is held out
where a grid is verified (item 1, ``verify_grid.py``); elsewhere it is the grid's own measurement of each cell (every
recorded pair), which the replay's draws come from: say which beside any figure.

- gain captured G = log T(returned) / log T*: 0 for the defaults, negative for a recipe slower than them, 1 for
  the best (``gain``);
- normalised against random search at equal charged budget, as Bayesmark scores: (G - G_random) / (1 - G_random)
  (``normalised``);
- near-optimal: T >= T* / (1 + max(3%, the half-width of T*'s interval)), ties within the best's own uncertainty
  counted as found (``near_optimal``);
- anytime G(t): the gain of the recipe the search would hold at t seconds of charged time, its fastest feasible
  measurement so far by its own reading (``anytime``);
- medians and their intervals over replay seeds by the percentile bootstrap (``bootstrap``), and a paired one for
  the median difference of two strategies on the same seeds (``paired_low``).

    >>> round(gain(1.2, 1.44), 3), gain(1.0, 1.44), round(gain(0.9, 1.44), 3)
    (0.5, 0.0, -0.289)
    >>> near_optimal(1.72, 1.75, 0.02), near_optimal(1.60, 1.75, 0.02)
    (True, False)
"""
from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence

ANYTIME_S = (30.0, 60.0, 120.0, 300.0)
NEAR = 0.03  # a recipe within 3% of the best (or its interval's half-width, if wider) is near-optimal


def gain(t: float, best: float) -> float:
    """The share of the best's log gain that ``t`` captures; NaN where the best is no gain (T* <= 1)."""
    if best <= 1.0 or t <= 0:
        return math.nan
    return math.log(t) / math.log(best)


def normalised(g: float, g_random: float) -> float:
    """G against random search's G_random at the same charged budget: 0 is random search, 1 the best; NaN where
    random search already found the best."""
    return (g - g_random) / (1.0 - g_random) if g_random < 1.0 else math.nan


def near_optimal(t: float, best: float, best_half_width: float) -> bool:
    """Whether ``t`` lies within the best's tie band: T* / (1 + max(3%, its interval's half-width))."""
    return t >= best / (1.0 + max(NEAR, best_half_width))


def half_width(low: float, high: float) -> float:
    """An interval's half-width as a share, on the log scale: sqrt(high / low) - 1."""
    return math.sqrt(high / low) - 1.0 if low > 0 else math.inf


def anytime(trace: Sequence[tuple[float, float, float | None]], at: Sequence[float] = ANYTIME_S) -> list[float]:
    """``trace``: (charged seconds at a trial's end, its truth T, its own reading or None where it failed or was
    infeasible), in order. At each time of ``at``, the truth of the trial read fastest by then (1.0 before any:
    the defaults)."""
    out = []
    for t in at:
        seen = [(reading, truth) for s, truth, reading in trace if s <= t and reading is not None]
        out.append(max(seen)[1] if seen else 1.0)
    return out


def bootstrap(values: Sequence[float], stat: str = "median", level: float = 0.90, draws: int = 2000,
              seed: int = 0) -> tuple[float, float, float]:
    """``stat`` (median or mean) of ``values`` with its percentile-bootstrap interval at ``level``."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return math.nan, math.nan, math.nan
    f = statistics.median if stat == "median" else statistics.fmean
    rng = random.Random(seed)
    stats_ = sorted(f(rng.choices(finite, k=len(finite))) for _ in range(draws))
    tail = (1.0 - level) / 2
    return f(finite), stats_[int(tail * draws)], stats_[min(draws - 1, int((1 - tail) * draws))]


def paired_low(ours: Sequence[float], theirs: Sequence[float], level: float = 0.90, draws: int = 2000,
               seed: int = 0) -> float:
    """The one-sided bootstrap ``level`` lower bound of the median of ``ours - theirs`` over the same seeds (a
    median: G has no floor, 0.9x against a 1.10x best is -1.1, and one such seed would rule a mean)."""
    diffs = [a - b for a, b in zip(ours, theirs, strict=True) if math.isfinite(a) and math.isfinite(b)]
    if not diffs:
        return math.nan
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(diffs, k=len(diffs))) for _ in range(draws))
    return medians[int((1.0 - level) * draws)]
