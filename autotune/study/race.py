"""When a candidate's race ends: the rule ``SearchLoop`` applies after each round of pairs.

The race looks at a candidate's interval after every round, and may stop it at any look; each look is one more
chance of a wrong stop. So its intervals are taken at ``looks_confidence``: with at most ``looks`` rounds, each
look's error is at most ``(1 - CONFIDENCE) / looks``, and by Bonferroni's inequality the chance that any look
stops it wrongly (as slower when it is not, or below an incumbent it is not below) is at most ``1 - CONFIDENCE``.
A look stops a race only on an interval that reached its look's confidence: an order-statistic interval of few
pairs covers less than asked (4 pairs, min to max: 87.5% where a look asks 99.2%), and such a look only decides
whether more pairs come (the trial's time, the cap). The trial's recorded interval is the plain one
(``CONFIDENCE``); the recipe's is the confirmation's, made of measurements the race did not see.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..measure import CONFIDENCE, Interval, Noise, first_pairs

SLOWER = "slower than the defaults with confidence"
# a look that measured nothing more (its time ran out, as a script's copy keeps its loss copy's, or its measurer ran
# all it runs): more looks would repeat the same interval
NO_PAIRS = "its last look added no pairs"


def looks_confidence(looks: int, confidence: float = CONFIDENCE) -> float:
    """Each look's confidence for an error of at most ``1 - confidence`` over ``looks`` looks (Bonferroni).

    >>> round(looks_confidence(6), 4)
    0.9917
    """
    return 1 - (1 - confidence) / max(1, looks)


@dataclass(frozen=True)
class Race:
    """A candidate's race against ``incumbent`` (the best feasible (median, low, high) so far, or None): a first
    look of ``first_pairs`` of the calibration's pairs, then looks of as many up to ``cap``, each at ``confidence``
    (``looks_confidence`` of the most looks there can be)."""

    noise: Noise
    incumbent: tuple[float, float, float] | None

    @property
    def first(self) -> int:
        return first_pairs(self.noise.pairs)

    @property
    def cap(self) -> int:
        return 3 * self.noise.pairs

    @property
    def confidence(self) -> float:
        return looks_confidence(math.ceil(self.cap / self.first))

    def pairs(self, used: int) -> int:
        """The window pairs of the next look, after ``used``."""
        return self.first if used == 0 else min(self.first, self.cap - used)

    def stop(self, interval: Interval, used: int) -> str | None:
        """Why the race ends at this look (``race_stop``), or None: another look."""
        return race_stop(interval, self.noise, self.incumbent, used, self.cap, asked=self.confidence)


def race_stop(interval: Interval, noise: Noise, incumbent: tuple[float, float, float] | None, used: int,
              cap: int, *, asked: float = CONFIDENCE) -> str | None:
    """Why a candidate's race ends after ``used`` pairs (or None: another round). ``incumbent``: the best
    feasible (median, low, high) so far. A candidate whose interval lies above the incumbent's and above
    ``1 + margin`` is the best so far with confidence: more pairs would only narrow an interval the recipe does
    not keep (its interval is the confirmation's), so its race ends and the budget goes to other candidates.
    An interval below the confidence ``asked`` (too few pairs for it) stops nothing but at the cap.

    >>> noise = Noise(0.3, 16, 0.03, 0.02, 0.08, (1.0, 0.98, 1.02))
    >>> race_stop(Interval(0.7, 0.6, 0.8, 0.95, 8), noise, (1.0, 0.98, 1.02), 8, 48)
    'slower than the defaults with confidence'
    >>> race_stop(Interval(1.2, 1.0, 1.4, 0.95, 8), noise, (1.1, 1.05, 1.15), 8, 48) is None
    True
    >>> race_stop(Interval(0.7, 0.6, 0.8, 0.875, 4), noise, None, 4, 48, asked=0.99) is None
    True
    """
    if interval.count == 0:
        return "failed"
    reached = interval.confidence >= asked - 1e-12  # exact coverages: 1 - 2/2**n against 1 - 0.05/looks
    said = _interval_says(interval, noise, incumbent) if reached else None
    if said is None and used >= cap:
        return f"{used} pairs, the most a candidate gets"
    return said


def _interval_says(interval: Interval, noise: Noise, incumbent: tuple[float, float, float] | None) -> str | None:
    """Why ``interval`` (at the confidence its look asked) ends the race, or None."""
    if interval.high < 1 - noise.margin:
        return SLOWER
    if incumbent is not None and interval.high < incumbent[1]:
        return f"below the incumbent's interval (its low {incumbent[1]:.2f}x)"
    if incumbent is not None and interval.high <= incumbent[0]:
        return f"cannot beat the incumbent's {incumbent[0]:.2f}x"
    if incumbent is not None and interval.low > max(incumbent[2], 1 + noise.margin):
        return f"above the incumbent's interval (its high {incumbent[2]:.2f}x)"
    if (interval.high - interval.low) / 2 <= noise.half_width * interval.median:
        return f"interval within +-{noise.half_width:.0%}"
    return None


__all__ = ["NO_PAIRS", "SLOWER", "Race", "looks_confidence", "race_stop"]
