"""Student's t and Snedecor's F from the incomplete beta function: the few quantiles and probabilities the
intervals need, without SciPy."""
from __future__ import annotations

import functools
import math


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (Lentz's method)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1) < 1e-14:
            break
    return result


def incomplete_beta(a: float, b: float, z: float) -> float:
    """The regularized incomplete beta function ``I_z(a, b)``, 0 <= z <= 1."""
    if z <= 0:
        return 0.0
    if z >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(z) + b * math.log1p(-z))
    if z < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, z) / a
    return 1 - front * _beta_fraction(b, a, 1 - z) / b


def _t_cdf(x: float, df: float) -> float:
    """P(T <= x) for Student's t with ``df`` degrees of freedom, x >= 0: ``1 - I_{df/(df+x^2)}(df/2, 1/2) / 2``."""
    return 1 - incomplete_beta(df / 2, 0.5, df / (df + x * x)) / 2


def f_cdf(x: float, d1: float, d2: float) -> float:
    """P(F <= x) for Snedecor's F with ``d1`` and ``d2`` degrees of freedom: ``I_{d1 x / (d1 x + d2)}(d1/2, d2/2)``.

    >>> round(f_cdf(5.987, 1, 6), 3), round(f_cdf(1.0, 4, 4), 3)
    (0.95, 0.5)
    """
    return incomplete_beta(d1 / 2, d2 / 2, d1 * x / (d1 * x + d2)) if x > 0 else 0.0


@functools.lru_cache(maxsize=256)  # a search asks the same few (whole degrees of freedom) again and again
def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (``p`` > 1/2) of Student's t with ``df`` (> 0, not only whole) degrees of freedom: the
    CDF from the incomplete beta function, inverted by bisection; no SciPy needed for a handful of values.

    >>> round(t_quantile(0.975, 2), 3), round(t_quantile(0.995, 4), 3), round(t_quantile(0.975, 30), 3)
    (4.303, 4.604, 2.042)
    """
    low, high = 0.0, 1.0
    while _t_cdf(high, df) < p:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if _t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2
