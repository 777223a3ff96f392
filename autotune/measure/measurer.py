"""The contract between the search and the measuring engine: ``PairedMeasurer``, which the search loop drives,
and ``Noise``, what the calibration found."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..trial.spec import TrialResult
from .stats import Interval


@dataclass(frozen=True)
class Noise:
    """This machine's noise, from the A/A calibration at the start of a search (the defaults against
    themselves), and what the search does with it."""

    window_s: float  # each window's length, long enough to be timed well
    pairs: int  # window pairs for an interval of about +-half_width: a candidate's first round
    half_width: float
    margin: float  # a speedup counts when its interval clears 1 by this much (and "slower" likewise)
    spread: float  # max - min of the A/A per-pair ratios: "identical runs here differ by up to spread/2"
    aa: tuple[float, float, float]  # the A/A median ratio and its interval (low, high)
    timed_s: float = 0.0  # time spent in timed windows by the calibration
    wall_s: float = 0.0  # the calibration's wall time (worker start, warm-up, windows)

    def note(self) -> str:
        return (f"identical runs here differ by up to {self.spread / 2:.0%}; the smallest gain this budget can "
                f"tell apart is {self.margin:.0%}")


class PairedMeasurer(Protocol):
    """Measures recipes as speedups over the defaults, in pairs of windows. The search loop
    drives it: ``calibrate`` once, then per candidate ``begin``, ``more`` as often as the race wants
    (each call adds ``n`` pairs and returns the interval over all of the candidate's pairs so far,
    amortised, and combined with its environment's factor from process pairs), then ``end``, which
    returns the trial's result (``objective`` = the speedup's median, ``speedup_low``/``speedup_high``,
    ``method``, ``pairs``, the loss at the study's sample count, timings) and drops the candidate.
    Live: ``LiveMeasurer`` (``autotune.measure.live``); replayed: a recorded grid (``benchmarks/search_quality.py``).
    A failure (crash, OOM, NaN) is a ``TrialResult`` from ``begin`` or ``end``, never an exception;
    KeyboardInterrupt propagates once every process is stopped."""

    def calibrate(self, timeout_s: float) -> Noise:
        ...

    def begin(self, params: dict[str, Any], timeout_s: float) -> object | TrialResult:
        ...

    def more(self, handle: object, n: int, timeout_s: float) -> Interval:
        ...

    def end(self, handle: object) -> TrialResult:
        ...

    def close(self) -> None:
        ...
