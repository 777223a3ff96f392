"""Statistics of paired A/B measurement: the median of per-pair speed ratios, its confidence interval, a verdict
(``compare``: pairs of windows in, a ``Comparison`` out).

A comparison's per-pair ratios (candidate rate / baseline rate, one per pair of back-to-back windows) are
summarised by their **median** with an **exact distribution-free interval from order statistics**: for n
independent ratios from any continuous distribution, the number of ratios below the true median is
Binomial(n, 1/2), so ``[r_(k), r_(n+1-k)]`` (sorted ratios, 1-based) covers the true median with
probability ``1 - 2 * P(Binomial(n, 1/2) < k)``. The largest ``k`` whose coverage is still at least the
confidence asked is used, and the coverage achieved is reported (it is at or above the one asked).

Why this and not a bootstrap of the median: with the 8-30 pairs a search can afford, the bootstrap
distribution of a median takes only a handful of distinct values and under-covers (its nominal 95% is
often 88-92% at n = 10-16), it needs a random generator and thousands of resamples per comparison, and
its result depends on the resampling seed. The order-statistic interval is exact at every n, needs no
assumption about the ratios' distribution (skewed, heavy-tailed: a window hit by another tenant's burst),
costs a sort, and is the same every time. Its price: it cannot be narrower than the ratios' spacing, and
below 6 ratios no 95% interval exists (the widest, min to max, then covers less, and says so).

Verdict: ``faster`` when the interval's low end is above ``1 + margin``, ``slower`` when its high end is
below ``1 - margin``, else ``same``. The margin is the smallest gain the machine's A/A calibration can tell
apart from a systematic in-process difference (at least ``MIN_MARGIN``).

    >>> iv = median_interval([0.97, 1.01, 0.99, 1.02, 1.00, 0.98, 1.03, 1.01])
    >>> iv.median, iv.low, iv.high, round(iv.confidence, 3)
    (1.005, 0.97, 1.03, 0.992)
    >>> verdict(iv, margin=0.02)
    'same'
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .protocol import ArmStatus, PairRecord, WindowRecord

Verdict = Literal["faster", "slower", "same"]

MIN_MARGIN = 0.02  # a gain under 2% is not told apart: windows in one process agree to ~1-2% here (A/A)
CONFIDENCE = 0.95
# A normal sample's median has a standard error of sqrt(pi/2) * sigma / sqrt(n) (asymptotic efficiency 2/pi).
_MEDIAN_SE = math.sqrt(math.pi / 2)
_MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution x this = its sigma: a scale that one outlier cannot inflate


@dataclass(frozen=True)
class Interval:
    """The median of some values and a distribution-free interval that covers the true median with
    probability ``confidence`` (exact, at least the one asked where the count of values allows it)."""

    median: float
    low: float
    high: float
    confidence: float
    count: int

    @property
    def width(self) -> float:
        return self.high - self.low

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def to_dict(self) -> dict[str, float | int]:
        return {"median": self.median, "low": self.low, "high": self.high, "confidence": self.confidence,
                "count": self.count}


def _binomial_cdf_half(n: int, k: int) -> float:
    """P(Binomial(n, 1/2) <= k)."""
    return sum(math.comb(n, i) for i in range(0, k + 1)) / 2**n if k >= 0 else 0.0


def order_rank(n: int, confidence: float = CONFIDENCE) -> tuple[int, float]:
    """``(k, coverage)``: the interval ``[x_(k), x_(n+1-k)]`` (1-based) of n sorted values covers the
    median with probability ``coverage``; k is the largest with coverage >= ``confidence``, or 1 (min to
    max, with the lower coverage it has) when no k reaches it.

    >>> order_rank(16)[0], round(order_rank(16)[1], 4), order_rank(5)
    (4, 0.9787, (1, 0.9375))
    """
    if n < 1:
        raise ValueError("an interval needs at least one value")
    k = 1
    while k + 1 <= (n + 1) // 2 and 1 - 2 * _binomial_cdf_half(n, k) >= confidence:
        k += 1
    return k, 1 - 2 * _binomial_cdf_half(n, k - 1)


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """The median of ``values`` with its exact order-statistic interval (see the module's docstring)."""
    ordered = sorted(values)
    k, coverage = order_rank(len(ordered), confidence)
    return Interval(statistics.median(ordered), ordered[k - 1], ordered[len(ordered) - k], coverage, len(ordered))


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (``p`` > 1/2) of Student's t with ``df`` degrees of freedom: the CDF integrated
    numerically (Simpson's rule) and inverted by bisection; no SciPy needed for a handful of values.

    >>> round(t_quantile(0.975, 2), 3), round(t_quantile(0.995, 4), 3), round(t_quantile(0.975, 30), 3)
    (4.303, 4.604, 2.042)
    """
    scale = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(x: float, steps: int = 2000) -> float:  # P(T <= x) for x >= 0
        h = x / steps
        f = [scale * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(steps + 1)]
        return 0.5 + h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))

    low, high = 0.0, 1.0
    while cdf(high) < p:
        high *= 2
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < p else (low, mid)
    return (low + high) / 2


def log_mean_interval(ratios: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """The geometric mean of ``ratios`` with a Student-t interval on their logarithms: for a few independent
    units each carrying its own factor (a process pair's median ratio), where an order-statistic interval
    needs six or more. Its ``median`` field holds the geometric mean; one ratio gives an unbounded interval.

    >>> iv = log_mean_interval([0.9, 1.0, 1.1])
    >>> round(iv.median, 3), round(iv.low, 3), round(iv.high, 3)
    (0.997, 0.777, 1.279)
    """
    logs = [math.log(r) for r in ratios]
    centre = statistics.fmean(logs)
    if len(logs) < 2:
        return Interval(math.exp(centre), 0.0, math.inf, confidence, len(logs))
    half = t_quantile(1 - (1 - confidence) / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return Interval(math.exp(centre), math.exp(centre - half), math.exp(centre + half), confidence, len(logs))


def across_processes_interval(intervals: Sequence[Interval], confidence: float = CONFIDENCE) -> Interval:
    """One speedup from several processes' intervals (a confirmation's rounds, each in fresh workers): the
    geometric mean of their medians, and the wider of two intervals: the geometric means of their bounds
    (each process's own uncertainty) and a Student-t interval of their medians' logarithms (what differs
    between processes: an in-process speedup varies from one process to the next).
    One interval is itself.

    >>> rounds = [Interval(m, 0.95 * m, 1.05 * m, 0.97, 6) for m in (1.56, 1.75, 2.02)]
    >>> iv = across_processes_interval(rounds)
    >>> round(iv.median, 2), round(iv.low, 2), round(iv.high, 2), iv.count
    (1.77, 1.28, 2.44, 18)
    """
    if not intervals:
        raise ValueError("no interval to combine")
    if len(intervals) == 1:
        return intervals[0]

    def gmean(values: Sequence[float]) -> float:
        return math.exp(statistics.fmean(math.log(v) for v in values)) if min(values) > 0 else 0.0

    between = log_mean_interval([iv.median for iv in intervals], confidence)
    return Interval(between.median, min(between.low, gmean([iv.low for iv in intervals])),
                    max(between.high, gmean([iv.high for iv in intervals])),
                    min(iv.confidence for iv in intervals), sum(iv.count for iv in intervals))


def verdict(interval: Interval, margin: float = MIN_MARGIN) -> Verdict:
    """``faster`` / ``slower`` when the whole interval is beyond ``margin`` on one side of 1, else ``same``."""
    if interval.low > 1 + margin:
        return "faster"
    if interval.high < 1 - margin:
        return "slower"
    return "same"


def amortised_rate(rate: float, compile_s: float, planned_samples: float) -> float:
    """Samples/s over a planned run that pays ``compile_s`` once (today's trial objective).

    >>> amortised_rate(100.0, 10.0, 1000.0)
    50.0
    """
    return planned_samples / (max(0.0, compile_s) + planned_samples / rate)


def robust_sigma(values: Sequence[float]) -> float:
    """The spread of ``values`` as a normal sigma, from their median absolute deviation."""
    centre = statistics.median(values)
    return _MAD_TO_SIGMA * statistics.median(abs(v - centre) for v in values)


def pairs_for_width(ratios: Sequence[float], half_width: float, *, least: int = 8, most: int = 64) -> int:
    """Pairs needed for a median interval about ``±half_width`` wide, given A/A ``ratios`` measured here:
    the median's standard error is ``sqrt(pi/2) * sigma / sqrt(n)``, and a 95% interval spans about 1.96
    of them each side. At least ``least`` (below 6 pairs no 95% interval exists), at most ``most``.

    >>> pairs_for_width([0.96, 1.0, 1.04, 0.98, 1.02, 1.0], 0.02)
    14
    """
    sigma = robust_sigma(ratios)
    needed = math.ceil((1.96 * _MEDIAN_SE * sigma / half_width) ** 2) if half_width > 0 else most
    return max(least, min(most, needed))


def margin_from_calibration(aa: Interval) -> float:
    """The verdicts' margin from an A/A comparison (identical arms): its median's distance from 1 is a
    difference the interval does not account for (e.g. which model instance sits where in memory), so
    gains up to it are not told apart; at least ``MIN_MARGIN``."""
    return max(MIN_MARGIN, abs(aa.median - 1.0))


@dataclass(frozen=True)
class Comparison:
    """A paired comparison's score: the candidate's speed relative to the baseline's."""

    ratio: Interval  # median per-pair ratio (cand / base) with its interval
    amortised: Interval  # the same with each arm's compile time amortised over train_steps
    verdict: Verdict  # from ``amortised``: what a training run of train_steps would see
    margin: float


def compare(records: Sequence[PairRecord], base: ArmStatus, cand: ArmStatus, *, train_steps: int,
            margin: float = MIN_MARGIN, confidence: float = CONFIDENCE) -> Comparison:
    """The median ratio of ``records`` with its interval, amortised as today's objective, and a verdict."""
    if not records:
        raise ValueError(f"no pairs to compare ({base.arm}: {base.state}, {cand.arm}: {cand.state})")

    ratio = median_interval([r.ratio for r in records], confidence)
    paid = median_interval(amortised_ratios(records, base, cand, train_steps=train_steps), confidence)
    return Comparison(ratio, paid, verdict(paid, margin), margin)


def amortised_ratios(records: Sequence[PairRecord], base: ArmStatus, cand: ArmStatus, *,
                     train_steps: int) -> list[float]:
    """Each pair's ratio with each arm's compile time amortised over ``train_steps`` of its steps (what
    ``compare`` summarises; a recorded grid keeps them one by one)."""
    def amortised(window: WindowRecord, arm: ArmStatus) -> float:
        return amortised_rate(window.rate, arm.compile_s or 0.0, train_steps * arm.step_samples)

    return [amortised(r.cand, cand) / amortised(r.base, base) for r in records]
