"""Statistics of paired A/B measurement: the median of per-pair speed ratios, its confidence interval, a verdict
(``compare``: pairs of windows in, a ``Comparison`` out).

A comparison's per-pair ratios (candidate rate / baseline rate, one per pair of back-to-back windows) are
summarised by their **median** with an **exact distribution-free interval from order statistics**: for n
independent ratios from any continuous distribution, the number of ratios below the true median is
Binomial(n, 1/2), so ``[r_(k), r_(n+1-k)]`` (sorted ratios, 1-based) covers the true median with
probability ``1 - 2 * P(Binomial(n, 1/2) < k)``. The largest ``k`` whose coverage is still at least the
confidence asked is used, and the coverage achieved is reported (it is at or above the one asked).

Why this and not a bootstrap of the median: ``docs/measurement.md`` (paired windows in one process).

Window pairs taken one after another that drift together (their log ratios' lag-1 autocorrelation above what
independent pairs reach by chance) get that interval widened by the effective sample size
(``serial_median_interval``, what ``compare`` states): then approximate, no longer exact.

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
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from .distributions import f_cdf, t_quantile
from .serial import drift

if TYPE_CHECKING:
    from .protocol import ArmStatus, PairRecord, WindowRecord

Verdict = Literal["faster", "slower", "same"]

MIN_MARGIN = 0.02  # a gain under 2% is not told apart: windows in one process agree to ~1-2% here (A/A)
CONFIDENCE = 0.95
# A normal sample's median has a standard error of sqrt(pi/2) * sigma / sqrt(n) (asymptotic efficiency 2/pi).
_MEDIAN_SE = math.sqrt(math.pi / 2)
_MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution x this = its sigma: a scale that one outlier cannot inflate
_MAD_EFFICIENCY = 0.37  # a normal sample's MAD estimates sigma as well as the standard deviation of 37% as many


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


def serial_median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """``median_interval`` of values taken one after another (a worker's window pairs), widened on the log scale
    by ``sqrt((1 + r) / (1 - r))`` where they drift together (``drift``: r, their logs' lag-1 autocorrelation):
    n such pairs hold about ``n (1 - r) / (1 + r)`` independent ones, and the order statistics' coverage, exact
    for independent pairs, is then approximate. Simulated AR(1) series of 16 pairs (``tests/measure/
    test_stats.py``): at r = 0.6 the plain interval covered 81%, this 93%; independent pairs are widened in about 5%
    of series (8 or 16 pairs). Measured here, pairs' ratios in one worker had lag-1 -0.05 to +0.02 (the arms'
    shared drift cancels in the ratio); this is for machines where it does not."""
    interval = median_interval(values, confidence)
    if not values or min(values) <= 0:
        return interval
    r = drift([math.log(v) for v in values])
    if r <= 0 or not 0 < interval.low <= interval.median <= interval.high < math.inf:
        return interval
    factor, m = math.sqrt((1 + r) / (1 - r)), interval.median
    return replace(interval, low=m * (interval.low / m) ** factor, high=m * (interval.high / m) ** factor)


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


def pooled_log_mean_interval(ratios: Sequence[float], others: Sequence[Sequence[float]],
                             confidence: float = CONFIDENCE) -> Interval:
    """``log_mean_interval`` with the spread ``ratios`` borrows from ``others`` (groups of ratios of like units:
    other recipes' or environments' process pairs on the same machine and script) where it may (``lent_spread``):
    two process pairs alone give a t-interval 12.7 standard errors wide. Simulated with a recipe's spread 2-7x the
    others' (``tests/measure/test_stats.py``), 95% intervals cover 91-93% of the time from 2 pairs and 94-95% from
    3 (pooling always: 73-89%).

    >>> others = [[0.98, 1.0, 1.02], [1.2, 1.25, 1.22]]
    >>> iv = pooled_log_mean_interval([1.5, 1.53], others)
    >>> round(iv.median, 3), round(iv.low, 3), round(iv.high, 3), iv.count
    (1.515, 1.463, 1.569, 2)
    >>> iv = pooled_log_mean_interval([1.5, 1.6], others)  # spread 2x the others': its own (1 degree of freedom)
    >>> round(iv.low, 3), round(iv.high, 3)
    (1.028, 2.334)
    """
    lent, logs = lent_spread(ratios, others), [math.log(r) for r in ratios]
    if lent is None:
        return log_mean_interval(ratios, confidence) if logs else Interval(math.nan, 0.0, math.inf, confidence, 0)
    centre = statistics.fmean(logs)
    half = t_quantile(1 - (1 - confidence) / 2, lent[1]) * lent[0] / math.sqrt(len(logs))
    return Interval(math.exp(centre), math.exp(centre - half), math.exp(centre + half), confidence, len(logs))


def lent_spread(ratios: Sequence[float], others: Sequence[Sequence[float]]) -> tuple[float, int] | None:
    """The standard deviation of the logs ``ratios`` takes, pooled over them and ``others`` (``pooled_log_sd``), and
    its degrees of freedom, theirs in all; only where ``ratios``' own spread is at even odds no larger than the
    others' (its variance ratio below the F distribution's median: a recipe whose processes vary more, an
    input-bound one, is not given a spread it does not have), else None: its own, with its own degrees of freedom
    (so does half of those that vary alike)."""
    pooled, apart = pooled_log_sd([ratios, *others]), pooled_log_sd(others)
    if pooled is None or apart is None or len(ratios) < 2:
        return None
    own, df_apart = statistics.stdev([math.log(r) for r in ratios]), sum(len(g) - 1 for g in others if len(g) >= 2)
    if own > 0 and (apart[0] == 0 or f_cdf((own / apart[0]) ** 2, len(ratios) - 1, df_apart) > 0.5):
        return None
    return max(pooled[0], own), df_apart + len(ratios) - 1


@dataclass(frozen=True)
class Part:
    """One factor of a speedup on the log scale: its estimate, the variance of that estimate and the degrees of
    freedom of the variance (``welch_interval`` adds parts)."""

    log: float
    variance: float
    df: float


def mean_part(ratios: Sequence[float]) -> Part:
    """Independent ratios (process pairs, confirmation rounds) as a part: the mean of their logs, its variance
    ``s^2 / n`` with ``n - 1`` degrees of freedom; one ratio has no variance estimate (infinite)."""
    logs = [math.log(r) for r in ratios]
    if len(logs) < 2:
        return Part(logs[0] if logs else 0.0, math.inf, 1.0)
    return Part(statistics.fmean(logs), statistics.variance(logs) / len(logs), len(logs) - 1.0)


def median_part(ratios: Sequence[float]) -> Part:
    """Paired windows' ratios as a part: the log of their median (the median every other reading of the ratios
    reports; with an even count it is not the median of the logs), with the large-sample variance of a median
    (``pi/2 * sigma^2 / n``, sigma from the logs' median absolute deviation, so one burst does not inflate it).
    Its degrees of freedom are ``_MAD_EFFICIENCY`` of ``n - 1``: a MAD's sigma varies as one from that many
    values' standard deviation does."""
    logs = [math.log(r) for r in ratios]
    if len(logs) < 2:
        return Part(logs[0] if logs else 0.0, math.inf, 1.0)
    kept = (1 - (r := drift(logs))) / (1 + r)  # the share of pairs that count, where they drift together
    return Part(math.log(statistics.median(ratios)), (_MEDIAN_SE * robust_sigma(logs)) ** 2 / (len(logs) * kept),
                max(1.0, _MAD_EFFICIENCY * (len(logs) * kept - 1)))


def interval_part(interval: Interval) -> Part:
    """An interval made by ``part_interval`` or ``log_mean_interval`` (symmetric on the log scale, ``count - 1``
    degrees of freedom) back as its part."""
    df = max(1.0, interval.count - 1.0)
    if interval.count < 2 or interval.low <= 0 or not math.isfinite(interval.high) or interval.median <= 0:
        return Part(math.log(interval.median) if interval.median > 0 else 0.0, math.inf, df)
    half = math.log(interval.high / interval.median)
    return Part(math.log(interval.median), (half / t_quantile(1 - (1 - interval.confidence) / 2, df)) ** 2, df)


def part_interval(part: Part, confidence: float = CONFIDENCE) -> Interval:
    """A part as a Student-t interval (``count``: its degrees of freedom + 1, what ``interval_part`` reads)."""
    return welch_interval([part], confidence, count=round(part.df) + 1)


def at_confidence(interval: Interval, confidence: float) -> Interval:
    """A Student-t interval (``log_mean_interval``, ``part_interval``) taken again at ``confidence``; one with no
    variance estimate (fewer than two values, unbounded) stays as it is."""
    if interval.count < 2 or interval.confidence == confidence or interval.low <= 0 or not math.isfinite(
            interval.high):
        return interval
    return part_interval(interval_part(interval), confidence)


def welch_interval(parts: Sequence[Part], confidence: float = CONFIDENCE, *, count: int = 0) -> Interval:
    """The product of independent factors, each a ``Part``, as one interval: on the log scale their estimates
    and variances add, and the t quantile takes the Welch-Satterthwaite degrees of freedom
    ``(sum v)^2 / sum(v^2 / df)``. Approximate (its parts' logs taken as normal), at the confidence asked.

    >>> iv = welch_interval([mean_part([0.9, 1.0, 1.1]), Part(math.log(2.0), 0.0, 15.0)])
    >>> round(iv.median, 3), round(iv.low, 3), round(iv.high, 3)
    (1.993, 1.553, 2.558)
    """
    centre = sum(p.log for p in parts)
    variance = sum(p.variance for p in parts)
    if not math.isfinite(variance):
        return Interval(math.exp(centre), 0.0, math.inf, confidence, count)
    if variance <= 0:
        return Interval(math.exp(centre), math.exp(centre), math.exp(centre), confidence, count)
    df = variance**2 / sum(p.variance**2 / p.df for p in parts if p.variance > 0)
    half = t_quantile(1 - (1 - confidence) / 2, df) * math.sqrt(variance)
    return Interval(math.exp(centre), math.exp(centre - half), math.exp(centre + half), confidence, count)


def rounds_interval(rounds: Sequence[Interval], confidence: float = CONFIDENCE) -> Interval:
    """One speedup from a confirmation's rounds, each measured in fresh processes with pairs of its own: the
    rounds are the independent units, so a Student-t interval over their medians' logs (what differs from one
    process to the next is in their spread), never narrower than the rounds' own intervals allow for their mean
    (each read as a Student-t interval of its confidence and count; Welch-Satterthwaite degrees of freedom for
    the mean). ``count``: the rounds. One round is its own interval, which does not see the variation between
    processes (the recipe says so).

    >>> rounds = [Interval(m, 0.95 * m, 1.05 * m, 0.97, 6) for m in (1.56, 1.75, 2.02)]
    >>> iv = rounds_interval(rounds)
    >>> round(iv.median, 2), round(iv.low, 2), round(iv.high, 2), iv.count
    (1.77, 1.28, 2.44, 3)
    """
    if not rounds:
        raise ValueError("no round to combine")
    if len(rounds) == 1:
        return rounds[0]
    combined = log_mean_interval([iv.median for iv in rounds], confidence)
    # Never narrower than the rounds' own errors allow for their mean: three rounds of a script's recipe, each
    # [1.09-1.41], agreed to 1.24 by chance and read [1.24-1.24]; its user's script then measured 1.18x. Each
    # round's error is read at the t quantile of its own count (read at the normal's, an environment's round, whose
    # factor lends the spread of two process pairs, counted 6.5x its error at 95%).
    # The mean of the rounds' logs is the sum of each over n: its parts' variances over n^2 (``welch_interval``).
    n = len(rounds)
    parts = [Part(math.log(iv.median) / n, (math.log(iv.high / iv.low) / 2 / t_quantile(
        1 - (1 - iv.confidence) / 2, max(1.0, iv.count - 1.0)) / n) ** 2, max(1.0, iv.count - 1.0))
        for iv in rounds if 0 < iv.low <= iv.high < math.inf and 0 < iv.confidence < 1]
    if len(parts) < n:
        return combined
    floor = welch_interval(parts, confidence)
    return Interval(combined.median, min(combined.low, floor.low), max(combined.high, floor.high), confidence, n)


def pooled_log_sd(groups: Sequence[Sequence[float]]) -> tuple[float, int] | None:
    """The standard deviation of the logs of ratios about their own group's mean, pooled over groups of two or
    more (each group: one environment's process pairs), and the ratios it is from; None without such a group.

    >>> sd, n = pooled_log_sd([[1.0, 1.1], [0.5]])
    >>> round(sd, 4), n
    (0.0674, 2)
    """
    logs = [[math.log(r) for r in g] for g in groups if len(g) >= 2]
    if not logs:
        return None
    squares = sum(sum((x - statistics.fmean(g)) ** 2 for x in g) for g in logs)
    return math.sqrt(squares / sum(len(g) - 1 for g in logs)), sum(len(g) for g in logs)


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
    """The verdicts' margin from an A/A comparison (identical arms): a systematic difference between arms that a
    candidate's interval does not account for (which model instance sits where in memory) lies, at the A/A's
    confidence, within its interval, so gains up to the bound farther from 1 (on the log scale) are not told
    apart; at least ``MIN_MARGIN``. The median's own distance from 1, used before, is a point estimate of that
    difference, under it half the time.

    >>> margin_from_calibration(Interval(1.0, 0.99, 1.01, 0.95, 16)), margin_from_calibration(Interval(1.01, 0.96,
    ...     1.06, 0.95, 16))
    (0.02, 0.06)
    """
    if not 0 < aa.low <= aa.high < math.inf:  # too few pairs for a bounded interval: its median, as before
        return max(MIN_MARGIN, abs(aa.median - 1.0))
    return round(max(MIN_MARGIN, aa.high - 1.0, 1.0 / aa.low - 1.0), 6)


def span_margin(margin: float, workers: int) -> float:
    """The margin a verdict on an interval from ``workers`` fresh processes takes: the calibration's ``margin``
    for one worker's windows, whose interval cannot see how that worker's arms sit; ``MIN_MARGIN`` for an
    interval over two or more (confirmation rounds, process pairs), whose spread already carries each worker's
    arm difference (each worker's differs: docs/measurement.md).

    >>> span_margin(0.08, 1), span_margin(0.08, 3)
    (0.08, 0.02)
    """
    return MIN_MARGIN if workers >= 2 else margin


@dataclass(frozen=True)
class Comparison:
    """A paired comparison's score: the candidate's speed relative to the baseline's."""

    ratio: Interval  # median per-pair ratio (cand / base) with its interval
    amortised: Interval  # the same with each arm's compile time amortised over train_steps
    verdict: Verdict  # from ``amortised``: what a training run of train_steps would see
    margin: float
    ratios: tuple[float, ...] = ()  # the amortised per-pair ratios behind ``amortised``


def compare(records: Sequence[PairRecord], base: ArmStatus, cand: ArmStatus, *, train_steps: int,
            margin: float = MIN_MARGIN, confidence: float = CONFIDENCE) -> Comparison:
    """The median ratio of ``records`` with its interval, amortised as today's objective, and a verdict."""
    if not records:
        raise ValueError(f"no pairs to compare ({base.arm}: {base.state}, {cand.arm}: {cand.state})")

    ratio = serial_median_interval([r.ratio for r in records], confidence)
    ratios = amortised_ratios(records, base, cand, train_steps=train_steps)
    paid = serial_median_interval(ratios, confidence)
    return Comparison(ratio, paid, verdict(paid, margin), margin, tuple(ratios))


def amortised_ratios(records: Sequence[PairRecord], base: ArmStatus, cand: ArmStatus, *,
                     train_steps: int) -> list[float]:
    """Each pair's ratio with each arm's compile time amortised over the same planned samples, ``train_steps``
    steps of the baseline arm's (the defaults' batch), whatever the candidate's batch: an eager arm pays nothing,
    a compiled one its compile (what ``compare`` summarises; a recorded grid keeps them one by one)."""
    planned = train_steps * base.step_samples

    def amortised(window: WindowRecord, arm: ArmStatus) -> float:
        return amortised_rate(window.rate, arm.compile_s or 0.0, planned)

    return [amortised(r.cand, cand) / amortised(r.base, base) for r in records]
