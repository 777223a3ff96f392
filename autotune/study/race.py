"""When a candidate's race ends: the rule ``SearchLoop`` applies after each round of pairs."""
from __future__ import annotations

from ..measure import Interval, Noise


def race_stop(interval: Interval, noise: Noise, incumbent: tuple[float, float] | None, used: int,
              cap: int) -> str | None:
    """Why a candidate's race ends after ``used`` pairs (or None: another round). ``incumbent``: the best
    feasible (median, low) so far.

    >>> noise = Noise(0.3, 16, 0.03, 0.02, 0.08, (1.0, 0.98, 1.02))
    >>> race_stop(Interval(0.7, 0.6, 0.8, 0.95, 8), noise, (1.0, 0.98), 8, 48)
    'slower than the defaults with confidence'
    >>> race_stop(Interval(1.2, 1.0, 1.4, 0.95, 8), noise, (1.1, 1.05), 8, 48) is None
    True
    """
    if interval.count == 0:
        return "failed"
    if interval.high < 1 - noise.margin:
        return "slower than the defaults with confidence"
    if incumbent is not None and interval.high < incumbent[1]:
        return f"below the incumbent's interval (its low {incumbent[1]:.2f}x)"
    if incumbent is not None and interval.high <= incumbent[0]:
        return f"cannot beat the incumbent's {incumbent[0]:.2f}x"
    if (interval.high - interval.low) / 2 <= noise.half_width * interval.median:
        return f"interval within +-{noise.half_width:.0%}"
    if used >= cap:
        return f"{used} pairs, the most a candidate gets"
    return None
