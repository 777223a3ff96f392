"""What a run of yours gets: the recipe against the defaults in pairs of fresh processes, each started as ``autotune
run`` starts your training (the recipe's environment, ``apply()`` inside it, one model, the heap as your process
has it) and run alone, the two one after the other as you would run your script twice (``sequential``). A pair
gives one ratio (the recipe's samples/s over the defaults'); a process's speed is a factor that lasts its life and
the machine's moves between runs, so the pairs are the units: on the log scale their mean has a Student-t interval,
and one more pair, a run of yours against a plain one, falls in the prediction interval ``mean +- t * s * sqrt(1 +
1/n)`` (both exact for log-normal pairs, approximate otherwise: ``tests/measure/test_runs.py`` draws processes
that run at two speeds).

    >>> runs = Runs((1.10, 1.25, 1.18, 1.05, 1.30, 1.15), run_s=2.0)
    >>> iv = runs.mean()
    >>> round(iv.median, 3), round(iv.low, 3), round(iv.high, 3), iv.count
    (1.169, 1.075, 1.27, 6)
    >>> [round(x, 3) for x in runs.one_run()]
    [0.984, 1.388]
"""
from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..trial.spec import Status, TrialSettings
from . import stats

if TYPE_CHECKING:
    from ..probes import Facts

CLAIM_PAIRS = 6  # process pairs behind a claim about your runs where the budget allows (5 minutes or more)
LEAST_PAIRS = 3  # the fewest that give an interval (two: a t quantile of 12.7 at 95%)
RUN_CONFIDENCE = 0.9  # the prediction interval for one run
WINDOW_PAIRS = 4  # timed windows of each script copy: a process's own factor, not its windows, decides the spread


def trial_run_s(start_s: float, step_s: float, settings: TrialSettings, batch: int, settle_steps: int = 0) -> float:
    """What one fresh trial process of the defaults takes, start to exit, as a pair of your runs starts it in
    workload mode (``trial.runner.run_trial``): its start, warm-up, timed steps (the extra windows of a spread
    too wide are not counted) and the held-out loss (a forward pass is about a third of a step). A price from
    windows alone took a fifth of a slow transformer process's 50 s of steps. ``start_s``: a worker's start with
    its first arm, less that arm's ``settle_steps`` (``arms.SETTLE_S``), which a process of yours does not train: a
    GRU's pair was priced 7.3 s and took 5.2 s, and the claim's time kept left two confirmation rounds out.

    >>> from autotune.trial.spec import TrialSettings
    >>> round(trial_run_s(4.0, 0.1, TrialSettings(), batch=64), 2)  # 4 + 24 steps, 512 samples' loss
    7.07
    >>> round(trial_run_s(5.0, 0.1, TrialSettings(), batch=64, settle_steps=10), 2)  # the same, 10 steps settled
    7.07
    """
    steps = settings.warmup_steps + settings.measure_steps + settings.eval_samples / max(1, batch) / 3
    return max(0.0, start_s - settle_steps * step_s) + steps * step_s


class PairFailed(RuntimeError):
    """A process pair of a claim about your runs did not give a ratio: the message says why, ``side`` whose process
    failed (``base``: the defaults', ``cand``: the recipe's; None: neither, no time was left)."""

    def __init__(self, message: str, side: str | None = None) -> None:
        super().__init__(message)
        self.side = side


@dataclass(frozen=True)
class RunPair:
    """One pair of your runs: the recipe's process over the defaults' (``ratio``), the timed training of each
    process (``run_s``), the pair's wall time, and each process's samples/s."""

    ratio: float
    run_s: float
    wall_s: float
    samples_per_s: float | None = None
    baseline_samples_per_s: float | None = None


def sequential(seed: int, run: Callable[[str], tuple[float, float]]) -> RunPair:
    """A pair of your runs: ``run(side)`` runs one fresh process alone (``base``: the defaults', ``cand``: the
    recipe's) and gives its samples/s and its seconds timed, or raises ``PairFailed``; the two one after the other,
    in an order drawn from ``seed``."""
    started, rates, timed = time.monotonic(), {}, 0.0
    for side in random.Random(seed).sample(["base", "cand"], 2):
        rates[side], seconds = run(side)
        timed = max(timed, seconds)
    return RunPair(rates["cand"] / rates["base"], timed, time.monotonic() - started, rates["cand"], rates["base"])


def trial_pair(workload: str, defaults: dict[str, Any], params: dict[str, Any], facts: Facts,
               settings: TrialSettings, seed: int, timeout_s: float) -> RunPair:
    """A pair of your runs in workload mode: a fresh trial process of the defaults and one of the recipe ``params``,
    each alone as ``autotune run`` starts your training (``trial.runner.run_trial``: the recipe's environment,
    ``apply()`` inside, one model, the heap as a plain process has it), one after the other in an order drawn from
    ``seed`` (``sequential``), within ``timeout_s``."""
    from ..trial.runner import run_trial

    deadline = time.monotonic() + timeout_s

    def alone(side: str) -> tuple[float, float]:
        left, whose = deadline - time.monotonic(), "the defaults'" if side == "base" else "the recipe's"
        if left <= 0.0:
            raise PairFailed(f"no time left for {whose} run")
        run = run_trial(workload, defaults if side == "base" else params, facts, settings, timeout_s=left)
        if run.status != Status.OK or not run.samples_per_s:
            raise PairFailed(f"{whose} run: {run.status}: {run.error}", side)
        return run.samples_per_s, run.timed_s or 0.0
    return sequential(seed, alone)


def prediction_interval(ratios: Sequence[float], confidence: float = RUN_CONFIDENCE,
                        spread: tuple[float, int] | None = None) -> tuple[float, float]:
    """Where one more ratio of the kind of ``ratios`` falls, at ``confidence``: on the log scale, their mean
    +- t(n - 1) x their standard deviation x sqrt(1 + 1/n); ``(0, inf)`` from fewer than two. ``spread``: a log
    standard deviation and its degrees of freedom in place of the ratios' own (the one their mean's interval
    borrowed, ``stats.lent_spread``).

    >>> [round(x, 3) for x in prediction_interval([0.9, 1.0, 1.1], 0.9)]
    [0.71, 1.398]
    """
    if len(ratios) < 2:
        return 0.0, math.inf
    logs = [math.log(r) for r in ratios]
    centre, n = statistics.fmean(logs), len(logs)
    sd, df = spread or (statistics.stdev(logs), n - 1)
    half = stats.t_quantile(1 - (1 - confidence) / 2, df) * sd * math.sqrt(1 + 1 / n)
    return math.exp(centre - half), math.exp(centre + half)


@dataclass(frozen=True)
class Runs:
    """The process pairs of a claim about your runs: one ratio each, the timed training of each process, and the
    median samples/s of the recipe's processes and of the defaults' (None: not told)."""

    ratios: tuple[float, ...]
    run_s: float
    samples_per_s: float | None = None
    baseline_samples_per_s: float | None = None
    wall_s: float = 0.0  # the pairs' wall time in all
    # each side's slowest and fastest process (samples/s), where every pair told both
    spans: tuple[tuple[float, float], tuple[float, float]] | None = None

    @classmethod
    def of(cls, pairs: Sequence[RunPair]) -> Runs:
        """The runs of ``pairs`` (none: no ratio, 0 s)."""
        cand = [p.samples_per_s for p in pairs if p.samples_per_s]
        base = [p.baseline_samples_per_s for p in pairs if p.baseline_samples_per_s]
        spans = (((min(cand), max(cand)), (min(base), max(base)))
                 if len(pairs) >= 2 and len(cand) == len(base) == len(pairs) else None)
        return cls(tuple(p.ratio for p in pairs), statistics.median(p.run_s for p in pairs) if pairs else 0.0,
                   statistics.median(cand) if cand else None, statistics.median(base) if base else None,
                   sum(p.wall_s for p in pairs), spans)

    def spans_text(self) -> str | None:
        """How far apart each side's processes ran: where the defaults' vary far more than the recipe's (a plain
        heap that faults in some processes), a run of yours gains most over a plain run that fell slow.

        >>> Runs.of([RunPair(2.5, 1.0, 5.0, 4500.0, 1800.0), RunPair(3.4, 1.0, 5.0, 4400.0, 1300.0)]).spans_text()
        "the defaults' processes ran at 1,300-1,800 samples/s (1.38x apart), the recipe's at 4,400-4,500 (1.02x)"
        """
        if self.spans is None:
            return None
        (c_low, c_high), (b_low, b_high) = self.spans
        return (f"the defaults' processes ran at {b_low:,.0f}-{b_high:,.0f} samples/s ({b_high / b_low:.2f}x apart), "
                f"the recipe's at {c_low:,.0f}-{c_high:,.0f} ({c_high / c_low:.2f}x)")

    def mean(self, confidence: float = stats.CONFIDENCE, lent: Sequence[Sequence[float]] = ()) -> stats.Interval:
        """The geometric mean of the pairs' ratios with its Student-t interval (``stats.log_mean_interval``); with
        ``lent`` (other process pairs' ratios by group: the search's environments'), their spread pooled with the
        pairs' own where that is at even odds no larger (``stats.pooled_log_mean_interval``): six pairs whose plain
        processes all ran fast, where one in five runs slow, are not a spread to state alone."""
        return stats.pooled_log_mean_interval(self.ratios, lent, confidence)

    def borrowed(self, lent: Sequence[Sequence[float]]) -> tuple[float, int] | None:
        """The log spread ``mean`` takes from ``lent`` with the pairs' own, and its degrees of freedom; None: the
        pairs' own (``stats.lent_spread``)."""
        return stats.lent_spread(self.ratios, lent)

    def one_run(self, confidence: float = RUN_CONFIDENCE, lent: Sequence[Sequence[float]] = ()) -> tuple[float, float]:
        """Where a run of yours against a plain one falls, ``confidence`` of the time (``prediction_interval``), at the
        spread ``mean`` states with (``borrowed``): where the pairs' own is too small to state alone, so is it for
        one run."""
        return prediction_interval(self.ratios, confidence, self.borrowed(lent))


__all__ = ["CLAIM_PAIRS", "LEAST_PAIRS", "RUN_CONFIDENCE", "WINDOW_PAIRS", "PairFailed", "RunPair", "Runs",
           "prediction_interval", "sequential", "trial_pair"]
