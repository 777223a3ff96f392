"""The contract between the search and the measuring engine: ``PairedMeasurer``, the base class of every measurer
the search loop drives, and ``Noise``, what the calibration found."""
from __future__ import annotations

import abc
import math
from dataclasses import dataclass, fields
from statistics import NormalDist
from typing import TYPE_CHECKING, Any, ClassVar

from ..trial.spec import TrialResult
from .environment import paired_method
from .runs import RunPair
from .stats import CONFIDENCE, Interval, pooled_log_sd, t_quantile

if TYPE_CHECKING:
    from .protocol import ArmStatus


def first_pairs(pairs: int) -> int:
    """The window pairs of a candidate's first round and of each process pair of an environment factor: half the
    calibration's ``pairs`` (``Noise.pairs``), at least 4."""
    return max(4, pairs // 2)


@dataclass(frozen=True)
class Noise:
    """This machine's noise, from the A/A calibration at the start of a search (the defaults against
    themselves), and what the search does with it."""

    window_s: float  # each window's length, long enough to be timed well
    pairs: int  # window pairs for an interval of about +-half_width: a candidate's first round
    half_width: float
    margin: float  # a speedup counts when its interval clears 1 by this much (and "slower" likewise)
    spread: float  # max - min of the A/A per-pair ratios
    aa: tuple[float, float, float]  # the A/A median ratio and its interval (low, high)
    timed_s: float = 0.0  # time spent in timed windows by the calibration
    wall_s: float = 0.0  # the calibration's wall time (worker start, warm-up, windows)
    within: float | None = None  # the A/A's largest |pair ratio - 1|: identical arms' windows in one process
    aa_pairs: int | None = None
    # The search's, once it has them (``SearchOutcome.noise``): a process pair's ratio's spread between fresh
    # processes (the standard deviation of its log over ``between_pairs`` pairs, pooled by environment), and the
    # smallest gain the intervals it reached could tell apart (``told_apart``).
    between: float | None = None
    between_pairs: int | None = None
    told_apart: float | None = None
    told_by: str | None = None  # whose interval ``told_apart`` comes from
    within_what: str | None = None  # what ``within`` compared, where not identical arms in one process (script mode)
    # Window pairs of a confirmation round, where the measurer sizes its rounds from the spreads it measured
    # (script mode: ``measure.sizing``, process pairs times the window pairs each); else the calibration's pairs
    # decide.
    round_pairs: int | None = None
    # The calibration's worker start until its defaults' arm was built and settled: what a fresh worker of the
    # defaults costs before its first window (the rest of ``wall_s`` less ``timed_s`` is the A/A's and the profile's);
    # script mode's: a copy's share of the time an A/A process pair took outside windows, less the A/A's ``once_s``.
    start_s: float | None = None
    # One fresh process of the defaults as a pair of your runs starts it, start to exit, where the measurer knows
    # its shape (``runs.trial_run_s``; script mode's ``Spread.alone_s``); else priced from ``start_s`` and windows.
    run_s: float | None = None

    @classmethod
    def stored(cls, data: Any) -> Noise | None:
        """The noise a study stored (``StudyAttr.NOISE``), or None where it is not this version's, or a field holds
        what its type does not (text where a figure goes reaches a report's HTML as it is)."""
        try:
            noise = cls(**{**data, "aa": tuple(data["aa"])})
        except (TypeError, KeyError, ValueError):
            return None

        def number(value: Any, whole: bool = False) -> bool:
            if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
                return False
            return math.isfinite(value)

        for field in fields(cls):
            value, kind = getattr(noise, field.name), str(field.type)
            if field.name == "aa":
                ok = len(value) == 3 and all(map(number, value))
            elif kind.startswith("str"):
                ok = value is None or isinstance(value, str)
            else:
                ok = number(value, kind.startswith("int")) or (value is None and "None" in kind)
            if not ok:
                return None
        return noise

    @classmethod
    def from_calibration(cls, cal: Any, wall_s: float = 0.0, start_s: float | None = None,
                         run_s: float | None = None) -> Noise:
        """A worker's ``paired_worker.Calibration`` as the search's noise."""
        aa = cal.aa.amortised
        return cls(cal.window_s, cal.pairs, cal.half_width, cal.margin, cal.spread, (aa.median, aa.low, aa.high),
                   timed_s=2 * aa.count * cal.window_s, wall_s=wall_s, within=max(abs(r - 1) for r in cal.aa.ratios),
                   aa_pairs=aa.count, start_s=start_s, run_s=run_s)

    def note(self) -> str:
        """What the user reads of the noise the search worked with, each figure as measured."""
        if self.within is not None:
            within = (f"{self.within_what or 'identical arms in one process'} differed by up to {self.within:.1%} "
                      "a window pair "
                      f"({self.aa_pairs} A/A pairs)")
        else:  # a study calibrated before ``within`` was kept: the range is all there is
            within = f"identical arms in one process spread over {self.spread:.1%} (A/A, max - min)"
        between = (f"between fresh processes a process pair's ratio varied by {self.between:.1%} (standard "
                   f"deviation, {self.between_pairs} pairs)" if self.between is not None else
                   "between fresh processes not measured (no other environment was measured)")
        told = self.told_apart if self.told_apart is not None else told_apart(self.margin, self.aa[1], self.aa[2])
        by = self.told_by or "the A/A's interval"
        return (f"{within}; {between}; the smallest gain this search tells apart 4 times in 5 is {told:.1%} "
                f"({by})")


BUSY = 1.5  # an A/A interval whose high is this many times its low: identical arms cannot be told from a 50% gain


def too_busy(aa: Interval, limit: float = BUSY) -> str | None:
    """Why an A/A interval is too wide to rank recipes on, its high ``limit`` times its low (None: it is not).

    >>> too_busy(Interval(1.1, 0.93, 1.70, 0.95, 6))
    'the machine was too busy to calibrate: identical arms read 1.10x [0.93-1.70]'
    """
    if aa.low > 0 and aa.high / aa.low < limit:
        return None
    return f"the machine was too busy to calibrate: identical arms read {aa.median:.2f}x [{aa.low:.2f}-{aa.high:.2f}]"


POWER = 0.8  # the chance of telling a gain apart at which the noise line states it


def told_apart(margin: float, low: float, high: float, df: float = math.inf, confidence: float = CONFIDENCE,
               power: float = POWER) -> float:
    """The smallest gain a design whose interval is as wide as ``[low, high]`` (at ``confidence``, ``df`` degrees of
    freedom) tells apart with chance ``power``: its low bound must clear ``1 + margin``. On the log scale the
    interval is ``+-t * se`` about the estimate, so a true gain g clears the bar with chance ``power`` once
    ``log g >= log(1 + margin) + (t + t_power) * se``. At half that chance it would be ``(1 + margin) * sqrt(high /
    low) - 1``, the interval's own half width: a gain of that size is missed every other time.

    >>> round(told_apart(0.02, 0.97, 1.03), 4), round(told_apart(0.02, 0.97, 1.03, power=0.5), 4)
    (0.0647, 0.0511)
    """
    if low <= 0 or not math.isfinite(high):
        return math.inf
    if math.isinf(df):
        quantile = NormalDist().inv_cdf
        t, t_power = quantile(1 - (1 - confidence) / 2), quantile(power)
    else:
        t, t_power = t_quantile(1 - (1 - confidence) / 2, df), (t_quantile(power, df) if power > 0.5 else 0.0)
    half = math.log(high / low) / 2
    return (1 + margin) * math.exp(half * (1 + t_power / t)) - 1


@dataclass(frozen=True)
class LossReading:
    """A loss the measurer took for the quality guard's second look (``PairedMeasurer.losses``): its ``arm``,
    ``state`` "ok" or how it failed, the loss at ``loss_samples``, and over the wide held-out set where asked
    (``held_out``: the samples of the held-out and the wide set)."""

    arm: str
    state: str
    error: str | None = None
    loss: float | None = None
    loss_samples: int | None = None
    wide_loss: float | None = None
    held_out: tuple[int, int] | None = None

    @classmethod
    def of(cls, status: ArmStatus) -> LossReading:
        """A worker's arm as the reading the search sees."""
        return cls(status.arm, status.state, status.error, status.loss, status.loss_samples, status.wide_loss,
                   status.held_out)


class PairedMeasurer(abc.ABC):
    """Measures recipes as speedups over the defaults, in pairs of windows. The search loop
    drives it: ``calibrate`` once, then per candidate ``begin``, ``more`` as often as the race wants
    (each call adds ``n`` pairs and returns the interval over all of the candidate's pairs so far at
    ``confidence``, amortised, and combined with its environment's factor from process pairs), then ``end``, which
    returns the trial's result (``objective`` = the speedup's median, ``speedup_low``/``speedup_high``,
    ``method``, ``pairs``, the loss at the study's sample count, timings) and drops the candidate.
    Live: ``LiveMeasurer`` (``autotune.measure.live.measurer``); script mode: ``ScriptMeasurer``; replayed: a
    recorded grid (``autotune.testing.replay``). A failure (crash, OOM, NaN) is a ``TrialResult`` from ``begin`` or
    ``end``, never an exception; KeyboardInterrupt propagates once every process is stopped.

    What a measurer may also do has a default here, which a measurer that can do more overrides (the search asks
    nothing else of it): its facts (``fresh_processes``, ``machine_speeds``, ``machine_limits``, ``second_look``,
    ``keeps_factors``), its state (``defaults``, ``noise``, ``factors``, ``factor_ratios``, read as
    ``between``), a confirmation round (``reseed``, then ``confirm``), and ``warm``, ``loss``, ``skip_loss``,
    ``in_effect``, ``losses`` and ``method``. What a round costs is read from its result (``costs``)."""

    fresh_processes: bool = False  # every trial starts processes of its own: none is cheaper (set per measurer)
    in_place_only: bool = False  # a trial starts no process only where it changes ``spaces.in_place`` knobs alone
    machine_speeds: ClassVar[bool] = True  # this machine's kernel speeds apply to what it measures (seeding)
    machine_limits: ClassVar[bool] = True  # a share of this machine's peaks can be told of what it measures
    second_look: ClassVar[bool] = False  # it takes losses at other training seeds (``losses``)
    keeps_factors: ClassVar[bool] = False  # its ``factors`` last the search: a continued study hands it its recorded
    user_processes: ClassVar[bool] = False  # it runs a recipe and the defaults as your training runs (``user_pair``)

    def __init__(self, defaults: dict[str, Any]) -> None:
        self.defaults = defaults  # every knob and run setting of the defaults, as the search passes them
        self.noise: Noise | None = None  # the calibration's, and later what the measurer's trials changed of it
        self.factors: dict[str, Interval] = {}  # environment key -> its factor, where it measures across processes
        self.factor_ratios: dict[str, list[float]] = {}  # one ratio per process pair, by whose pairs they are

    @abc.abstractmethod
    def calibrate(self, timeout_s: float) -> Noise:
        """The defaults against themselves: this machine's noise."""

    @abc.abstractmethod
    def begin(self, params: dict[str, Any], timeout_s: float) -> object | TrialResult:
        """A handle of the candidate ``params``, or its failed result."""

    @abc.abstractmethod
    def more(self, handle: object, n: int, timeout_s: float, confidence: float = CONFIDENCE) -> Interval:
        """``n`` pairs more; the interval over all of the candidate's so far."""

    @abc.abstractmethod
    def end(self, handle: object) -> TrialResult:
        """The candidate's result; it is dropped."""

    @abc.abstractmethod
    def close(self) -> None:
        """Every process it started ends."""

    def between(self) -> tuple[float, int] | None:
        """How a process pair's ratio varied between fresh processes: the standard deviation of its log over the
        pairs of ``factor_ratios``, pooled by whose they are (``stats.pooled_log_sd``), and the pairs; None without."""
        return pooled_log_sd(list(self.factor_ratios.values()))

    def confirm(self, handle: object, pairs: int, timeout_s: float) -> TrialResult:
        """A confirmation round of the candidate ``begin`` gave: ``pairs`` pairs at once (fresh since ``reseed``),
        no race; its result."""
        self.more(handle, pairs, timeout_s)
        return self.end(handle)

    def reseed(self, seed: int) -> None:  # noqa: B027 - a capability with nothing to do by default
        """A confirmation round begins: its pairs are fresh (``seed``: the round's). Nothing to renew by default."""

    def method(self, handle: object, params: dict[str, Any]) -> str:
        """How the candidate ``begin`` gave (``params``) is measured so far, in ``TrialResult.method``'s words where
        they price its confirmation (``costs.round_parts``) while it is raced: by default an arm of the defaults'
        worker or of its environment's, or its environment's process pairs alone."""
        return paired_method(params, self.defaults)

    def so_far(self, handle: object) -> TrialResult | None:
        """The candidate's time so far as its result will tell it (wall, windows, window pairs, ``once_s``: script
        mode's training to the loss's samples, which its rounds do not repeat), where the measurer keeps it apart
        from the search's nominal figures; None: the search counts it (``reserve.racing_reserve_s``)."""
        return None

    def warm(self, params: dict[str, Any]) -> bool | None:
        """Whether a candidate of ``params`` would start no process; None where the measurer says nothing of its
        processes (the search then takes only the defaults' environment as warm)."""
        return None

    def loss(self, handle: object) -> float | None:
        """The candidate's quality-guard loss once taken (the race stops a candidate the guard will reject); None
        before, or where the measurer takes it only at ``end``."""
        return None

    def loss_source(self, handle: object) -> str | None:
        """What ``loss`` is where not the workload's held-out loss (``TrialResult.loss_source``); None: it is."""
        return None

    def skip_loss(self, handle: object) -> None:  # noqa: B027 - a capability with nothing to do by default
        """The candidate cannot be the recipe: ``end`` need not train it to the quality guard's sample count."""

    def in_effect(self, handle: object) -> dict[str, Any] | None:
        """The knobs the candidate's process reports in effect, once known; None where not told."""
        return None

    def losses(self, arms: list[tuple[dict[str, Any], int]], timeout_s: float, *,
               wide: bool = False) -> list[LossReading]:
        """The losses of ``arms`` (params, training seed), for the quality guard's second look; only where
        ``second_look``."""
        raise NotImplementedError(f"{type(self).__name__} takes no losses at other seeds (second_look is False)")

    def user_pair(self, params: dict[str, Any], seed: int, timeout_s: float) -> RunPair:
        """One fresh process pair of ``params`` against the defaults, each process started as ``autotune run``
        starts your training (``measure.runs``); ``runs.PairFailed`` says why one failed. Only where
        ``user_processes``."""
        raise NotImplementedError(f"{type(self).__name__} runs no process of yours (user_processes is False)")
