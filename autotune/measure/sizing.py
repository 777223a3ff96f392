"""How many process pairs, of how many window pairs each, a script-mode round takes: sized from the A/A, then
from every candidate's process pairs as the search measures them (``Spread``).

A process pair's ratio varies twice over: between its windows (``within``, the standard deviation of a window
pair's log ratio about its process pair's) and between fresh processes (``between``, what lasts a process's life:
on a shared VM one process in three of an input-bound script drew a 1.4x slower speed for good). With ``m``
window pairs a process pair, a pair's log ratio varies by about ``between**2 + within**2 / m`` and costs
``pair_s + m * window_pair_s``. Where ``LEAST_PAIRS`` pairs of ``WINDOWS`` reach ``ROUND_SE``, that is the round,
as before sizing existed. Otherwise the windows a pair are the cost-optimal ``sqrt(pair_s * within**2 /
(window_pair_s * between**2))`` (two-stage sampling), and the pairs as many as reach ``ROUND_SE``, at most
``MOST_PAIRS``: a spread that lasts a process's life is averaged only by more processes.

Every measurer's sizes besides: the calibration's window length and pairs within its share of the time
(``calibration``), and the least time a race round of window pairs needs (``race_round_s``).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

CALIBRATION_SHARE = 0.15  # of the time given, the most the calibration's start, A/A and profile take together
WINDOWS = 6  # window pairs a process pair, unsized (a pair's median: window pairs of the CNN read up to 33% apart)
FEWEST_WINDOWS = 2  # a pair's median needs two windows at least
LEAST_PAIRS = 2  # process pairs a round at least (one sees no process's own factor)
MOST_PAIRS = 4  # process pairs a round at most: three rounds of them still leave a 3-minute search time to explore
ROUND_SE = 0.05  # the standard error of a round's mean log ratio the round is sized for (three rounds: about 3%)


@dataclass(frozen=True)
class RoundShape:
    """A round's shape: ``pairs`` process pairs of ``windows`` window pairs each, and the figures it is from."""

    windows: int
    pairs: int
    within: float
    between: float

    def note(self) -> str:
        return (f"a window pair's log ratio varied by {self.within:.3f} within a process pair, a process pair's by "
                f"{self.between:.3f} between fresh processes: rounds of {self.pairs} process pairs of "
                f"{self.windows} window pairs")


def rounds(within: float, between: float, pair_s: float, window_pair_s: float) -> RoundShape:
    """The round for these spreads (standard deviations of log ratios) and costs (seconds).

    Copies that agree between processes keep the unsized round; a 1.4x speed drawn by one process in three
    (``between`` about 0.2) takes the most pairs, each of the fewest windows its costs allow:

    >>> rounds(0.08, 0.02, 4.0, 1.0)
    RoundShape(windows=6, pairs=2, within=0.08, between=0.02)
    >>> rounds(0.08, 0.22, 4.0, 1.0)
    RoundShape(windows=2, pairs=4, within=0.08, between=0.22)
    >>> rounds(0.2, 0.12, 12.0, 0.5).windows  # a slow start and noisy windows: more windows a pair pay
    6
    """
    if (between ** 2 + within ** 2 / WINDOWS) / LEAST_PAIRS <= ROUND_SE ** 2:
        return RoundShape(WINDOWS, LEAST_PAIRS, within, between)
    best = math.sqrt(pair_s * within ** 2 / (window_pair_s * between ** 2)) if between > 0 else WINDOWS
    windows = min(WINDOWS, max(FEWEST_WINDOWS, round(best)))
    pairs = math.ceil((between ** 2 + within ** 2 / windows) / ROUND_SE ** 2)
    return RoundShape(windows, min(MOST_PAIRS, max(LEAST_PAIRS, pairs)), within, between)


def between_sd(groups: Sequence[tuple[Sequence[float], int, bool]], within: float) -> float:
    """The spread of a process pair's log ratio between fresh processes, from groups of process pairs, each: its
    pairs' ratios, the window pairs each had, and whether it is an A/A (its true ratio is 1: its spread is taken
    about 1, which three pairs that all read 1.15 show; a candidate's about its own mean, one degree of freedom
    fewer). Less what their windows alone explain (``within`` over each pair's window pairs), 0 where that is all.

    >>> [round(between_sd([(aa, 6, True)], 0.05), 3) for aa in ([1.0, 1.0, 1.0], [0.7, 1.0, 1.4])]
    [0.0, 0.282]
    >>> [round(between_sd([([1.16, 1.15, 1.2], 6, aa)], 0.06), 3) for aa in (True, False)]
    [0.156, 0.0]
    >>> round(between_sd([([1.0, 1.01, 0.99], 6, True), ([1.6, 1.25], 2, False)], 0.04), 3)
    0.085
    """
    squares = explained = 0.0
    df = 0
    for ratios, windows, aa in groups:
        logs = [math.log(r) for r in ratios]
        n = len(logs) if aa else len(logs) - 1
        if n <= 0:
            continue
        center = 0.0 if aa else sum(logs) / len(logs)
        squares += sum((x - center) ** 2 for x in logs)
        explained += n * within ** 2 / windows
        df += n
    return math.sqrt(max(0.0, (squares - explained) / df)) if df else 0.0


@dataclass
class Spread:
    """What sizes a script's rounds as its search goes: the A/A's window spread (``within``) and costs, and every
    group of process pairs measured so far (``between_sd``'s)."""

    within: float
    pair_s: float
    window_pair_s: float
    groups: list[tuple[list[float], int, bool]] = field(default_factory=list)

    def add(self, ratios: Sequence[float], windows: int, aa: bool = False) -> RoundShape:
        """A group's process pairs join the spread: the round for all of them.

        >>> spread = Spread(0.04, 3.0, 1.0)
        >>> spread.add([1.0, 1.01, 0.99], 6, aa=True).pairs  # an A/A whose copies agree: the unsized round
        2
        >>> shape = spread.add([1.6, 1.25], 6)  # a candidate whose processes differ
        >>> shape.windows, shape.pairs, round(shape.between, 3)
        (2, 4, 0.086)
        """
        self.groups.append((list(ratios), windows, aa))
        between = between_sd(self.groups, self.within)
        return rounds(self.within, between, self.pair_s, self.window_pair_s)

    def alone_s(self, windows: int) -> float:
        """A copy of your runs alone (``script.copies.alone``): its part of a process pair's time outside windows (its
        start and warm-up) and its ``windows`` windows (not priced as a workload's trial process, which trains for
        twice a pair's windows: that over-prices it).

        >>> Spread(0.04, 3.9, 1.0).alone_s(4)  # half of 3.9 s, and four windows of half a window pair each
        3.95
        """
        return self.pair_s / 2 + windows * self.window_pair_s / 2


def calibration(timeout_s: float, start_s: float, profile_s: float, pairs: int, natural_s: float, floor_s: float,
                window_s: float | None = None) -> tuple[float, int, float]:
    """The A/A's window and pairs and the profile's seconds, so that the calibration's start (``start_s``, spent), A/A
    and profile fit in ``CALIBRATION_SHARE`` of ``timeout_s`` where 6 pairs fit (a sixth for the A/A alone left the
    start and profile beyond it): ``pairs`` as asked, fewer where the share holds fewer, never under 6 (a 95%
    interval needs them); the window ``window_s`` where given, else the step's own (``natural_s``) cut to a
    seventy-second of a short budget and never under ``floor_s``: the share takes pairs, not window length, which
    the whole search's windows keep.

    >>> calibration(120.0, 5.0, 2.0, 16, 0.5, 0.05)   # 18 s: 5 s started, 2 s of profile, 11 of A/A
    (0.5, 11, 2.0)
    >>> calibration(1800.0, 5.0, 2.0, 16, 0.5, 0.05)  # a long budget: the pairs as asked
    (0.5, 16, 2.0)
    >>> calibration(60.0, 3.0, 2.0, 16, 0.8, 0.05)    # 9 s: 6 pairs of 0.8 s windows are 9.6 s: past the share
    (0.8, 6, 1.5)
    """
    share = CALIBRATION_SHARE * timeout_s
    profile = min(profile_s, share / 6)
    aa_s = max(0.0, share - start_s - profile)
    window = window_s or max(floor_s, min(natural_s, timeout_s / 6 / (2 * 6)))
    return window, max(6, min(pairs, int(aa_s / (2 * window)))), profile


def race_round_s(pairs: int, window_s: float) -> float:
    """The least time left for a race round of ``pairs`` window pairs: two windows a pair and the evaluation
    after (the loop admits a round by it; a factor's process pair grown before the round leaves it)."""
    return 3 * pairs * window_s
