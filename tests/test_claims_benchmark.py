"""``benchmarks/claims.py`` scores a claim against what a user's runs got: on draws where the claim is right, the
user's mean of 10 runs lies in the range such a mean has about it 95% of the time, while inside the stated interval
(of the mean of all runs) only about 90%; where the user's program gets 8% less than the claim's, it is seldom in."""
from __future__ import annotations

import math
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import claims  # noqa: E402 - the benchmark under test

from autotune.measure.stats import log_mean_interval  # noqa: E402


def _rows(user_truth: float, seed: int, runs: int = 400) -> list[dict[str, Any]]:
    """Runs whose claim is a 95% t interval of 6 process pairs (a log spread of 4%, truth 2.0x) and whose user
    got 10 pairs of ``user_truth``, the spread alike."""
    rng = random.Random(seed)
    rows = []
    for index in range(runs):
        claimed = log_mean_interval([2.0 * math.exp(rng.gauss(0.0, 0.04)) for _ in range(6)])
        ratios = [user_truth * math.exp(rng.gauss(0.0, 0.04)) for _ in range(10)]
        rows.append({"workload": "cnn", "run": index, "speedup": claimed.median, "low": claimed.low,
                     "high": claimed.high, "process_pairs": 6, "ratios": ratios})
    return rows


def test_a_right_claim_holds_the_users_mean_as_often_as_it_says_and_a_wrong_one_does_not() -> None:
    right = claims.summary(_rows(2.0, seed=1))["cnn"]
    assert right["offered"] == 400
    # 95% of 400: 380, its binomial 99.9% band 364-393; the stated interval alone about 90% (360)
    assert 364 <= right["mean_consistent"] <= 393, right
    assert right["mean_inside"] < right["mean_consistent"] - 8, right
    wrong = claims.summary(_rows(2.0 * 0.92, seed=2))["cnn"]
    assert wrong["mean_consistent"] < 80, wrong  # about 10% (seeded: 43), the stated interval's about 3%


def test_the_range_widens_the_stated_interval_by_the_users_own_spread() -> None:
    low, high = claims.mean_range(2.0, 1.8, 2.0 ** 2 / 1.8, 6, 10)
    assert low < 1.8 and high > 2.0 ** 2 / 1.8
    assert math.isclose(math.log(2.0 / low), math.log(2.0 / 1.8) * math.sqrt(1.6))  # 1 + 6/10
    assert math.isclose(math.log(high / 2.0), math.log(2.0 / low))  # symmetric on the log scale


def test_the_users_offset_from_the_claims_centre_is_zero_for_a_right_claim_and_a_disturbed_run_is_not_scored() -> None:
    """Across all recorded claims the misses were an offset by workload (CNN +0.45 standard errors on average,
    transformer -0.71), not a spread wider than stated: the summary says both. A right claim reads about 0 and 1
    (400 draws: the mean's standard error 0.05), one whose user gets 8% less reads far below; a run marked disturbed
    (other work beside it) is counted apart and not scored."""
    right = claims.summary(_rows(2.0, seed=1))["cnn"]
    assert abs(right["offset_z_mean"]) < 0.2 and 0.85 < right["offset_z_sd"] < 1.15, right
    assert claims.summary(_rows(2.0 * 0.92, seed=2))["cnn"]["offset_z_mean"] < -2.0
    rows = _rows(2.0, seed=3, runs=20)
    rows[0] = {**rows[0], "ratios": [x * 0.5 for x in rows[0]["ratios"]], "disturbed": "tests beside it"}
    scored = claims.summary(rows)["cnn"]
    assert (scored["offered"], scored["disturbed"], scored["user_below_stated_low"]) == (19, 1, 0), scored


def test_single_pairs_are_judged_by_runs_and_a_claim_stated_otherwise_is_not_scored_as_its_own() -> None:
    """A run's ten pairs share its one stated range: where ranges are off from run to run, the share inside varies
    by run, and an interval over 90 pairs as if independent is too narrow; the runs' resampled interval is wider.
    A study's stored pairs of a test that did not confirm its candidate, where the offer was stated from its rounds
    (no pairs of its own), are not that offer's own interval."""
    rng = random.Random(4)
    rows = _rows(2.0, seed=5, runs=9)
    for row in rows:
        off = rng.gauss(0.0, 0.05)  # the run's range off the truth by its own draw
        row["run_low"], row["run_high"] = 2.0 * math.exp(off - 0.07), 2.0 * math.exp(off + 0.07)
    scored = claims.summary(rows)["cnn"]
    low, high = scored["pairs_inside_ci"]
    binomial = claims.clopper_pearson(scored["pairs_inside_prediction"], scored["pairs"])
    assert low < binomial[0] - 0.03 and high >= binomial[1], (scored["pairs_inside_ci"], binomial)
    stated_otherwise = {**rows[0], "process_pairs": None, "claim_ratios": [2.0] * 6}
    assert claims.summary([stated_otherwise])["cnn"]["own_told"] == 0
    assert claims.summary([{**rows[0], "claim_ratios": [2.0] * 6}])["cnn"]["own_told"] == 1
