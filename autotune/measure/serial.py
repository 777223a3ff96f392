"""Whether a worker's window pairs, taken one after another, drift together: the lag-1 autocorrelation of their
log ratios, bias-corrected, and the share of it above what independent pairs reach by chance
(``stats.serial_median_interval`` widens their interval by it)."""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def lag1_autocorrelation(values: Sequence[float]) -> float:
    """The lag-1 autocorrelation of a series, bias-corrected: the plain estimate of an AR(1) series' is about
    ``rho - (1 + 4 rho) / n`` (Marriott and Pope), so ``(n r + 1) / (n - 4)`` from 16 values on; under 16, where that
    doubles the estimate's own noise (at 8 values), ``r + 1 / n`` (an independent series' bias).

    >>> round(lag1_autocorrelation([0.1, -0.2, 0.05, 0.3, -0.1, 0.0, 0.2, -0.15]), 2)
    -0.26
    """
    n = len(values)
    if n < 3:
        return 0.0
    mean = statistics.fmean(values)
    d = [x - mean for x in values]
    den = sum(x * x for x in d)
    return corrected(sum(a * b for a, b in zip(d[:-1], d[1:], strict=False)) / den if den else 0.0, n)


def corrected(r: float, n: float) -> float:
    """A plain lag-1 estimate ``r`` of a series of ``n`` values, bias-corrected (``lag1_autocorrelation``)."""
    return max(-1.0, min(1.0, (n * r + 1) / (n - 4) if n >= 16 else r + 1 / max(1.0, n)))


def drift(logs: Sequence[float]) -> float:
    """The lag-1 autocorrelation of a worker's window pairs' log ratios where it is above what independent pairs
    reach by chance (``1.64 / sqrt(n)``, one-sided 95%), at most 0.9; else 0: the pairs are taken as independent."""
    if len(logs) < 5 or min(logs) == max(logs):
        return 0.0
    r = lag1_autocorrelation(logs)
    return min(0.9, r) if r > 1.64 / math.sqrt(len(logs)) else 0.0
