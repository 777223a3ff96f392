"""The search benchmark's scores (issue 58, item 2): each can fail, on the log scale."""
from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import quality_metrics as qm  # noqa: E402 - the benchmark's scores under test


def test_a_search_that_keeps_the_defaults_captures_nothing_where_the_old_score_gave_it_most() -> None:
    """The old score, T(returned) / T*, gave the AVX2 grid's defaults 0.821 of its best (1.218x); on the log scale
    they capture none of the gain, a slower recipe less than none, and the best all of it."""
    assert 1.0 / 1.218 == pytest.approx(0.821, abs=1e-3)
    assert qm.gain(1.0, 1.218) == 0.0 and qm.gain(0.95, 1.218) < 0 and qm.gain(1.218, 1.218) == pytest.approx(1.0)
    assert math.isnan(qm.gain(1.1, 1.0))  # no gain to capture: no score, not a perfect one


def test_normalised_puts_random_search_at_zero_and_the_best_at_one() -> None:
    assert qm.normalised(0.5, 0.5) == 0.0 and qm.normalised(1.0, 0.5) == 1.0 and qm.normalised(0.25, 0.5) == -0.5
    assert math.isnan(qm.normalised(1.0, 1.0))


def test_near_optimal_ties_within_the_best_s_own_uncertainty() -> None:
    assert qm.near_optimal(1.70, 1.75, 0.02) and not qm.near_optimal(1.69, 1.75, 0.02)  # 3% floor: 1.699
    assert qm.near_optimal(1.60, 1.75, 0.10)  # a best read +-10%: within it is a tie
    assert qm.half_width(1.0, 1.21) == pytest.approx(0.1)


def test_anytime_holds_the_fastest_reading_so_far_and_scores_its_truth() -> None:
    """The recipe held at t is the one read fastest by then, scored by its truth: a lucky reading of a slow cell
    costs the anytime score, as it would cost the user."""
    trace = [(10.0, 1.0, 1.0), (40.0, 1.1, 1.30), (70.0, 1.5, 1.20), (100.0, 2.0, None), (200.0, 1.6, 1.5)]
    assert qm.anytime(trace, (5.0, 30.0, 60.0, 120.0, 300.0)) == [1.0, 1.0, 1.1, 1.1, 1.6]


def test_the_bootstrap_interval_covers_a_known_median_and_the_paired_bound_fails_a_worse_search() -> None:
    rng = random.Random(1)
    covered = 0
    for i in range(200):
        draws = [rng.gauss(0.5, 0.2) for _ in range(30)]
        _, low, high = qm.bootstrap(draws, seed=i, draws=400)
        covered += low <= 0.5 <= high
    assert 0.83 <= covered / 200 <= 0.96  # a 90% interval: binomial bounds at 200 draws
    ours, theirs = [0.6 + rng.gauss(0, 0.1) for _ in range(30)], [0.8 + rng.gauss(0, 0.1) for _ in range(30)]
    assert qm.paired_low(ours, theirs) < -0.05 < qm.paired_low(theirs, ours)
