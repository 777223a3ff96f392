"""The statistics behind a speedup's interval: what each method is, and that it covers the truth about as often
as it says (simulated draws of known truth; the real A/A coverage is ``benchmarks/aa_independence.py``'s)."""
from __future__ import annotations

import math
import random

import pytest

from autotune.measure import stats
from autotune.measure.live.candidate import combine, round_factor
from autotune.measure.protocol import ArmStatus
from autotune.study.choice import rounds_said


def test_a_combined_interval_is_one_welch_satterthwaite_t_interval_on_the_log_scale() -> None:
    """Factor (a t interval over 3 process pairs) x in-process median (16 window pairs): the log estimates and
    their variances add, and one t quantile at the Welch-Satterthwaite degrees of freedom sets the width. It is
    labelled with the confidence asked and counted in the fewer units, the process pairs."""
    factors, ratios = [0.82, 0.8, 0.77], [1.5 + 0.01 * (2 * i % 5 - 2) for i in range(16)]  # no drift
    logs = [math.log(f) for f in factors]
    mean = sum(logs) / 3
    v_factor = sum((x - mean) ** 2 for x in logs) / 2 / 3
    in_logs = sorted(math.log(r) for r in ratios)
    centre_in = (in_logs[7] + in_logs[8]) / 2
    mad = sorted(abs(x - centre_in) for x in in_logs)
    sigma = 1.4826 * (mad[7] + mad[8]) / 2
    v_in = math.pi / 2 * sigma**2 / 16
    df_in = 0.37 * 15
    df = (v_factor + v_in) ** 2 / (v_factor**2 / 2 + v_in**2 / df_in)
    half = stats.t_quantile(0.975, df) * math.sqrt(v_factor + v_in)

    both = combine(stats.log_mean_interval(factors), ratios)
    assert both.median == pytest.approx(math.exp(mean + centre_in))
    assert (both.low, both.high) == (pytest.approx(math.exp(mean + centre_in - half)),
                                     pytest.approx(math.exp(mean + centre_in + half)))
    assert both.confidence == 0.95 and both.count == 3
    assert combine(stats.log_mean_interval(factors), ratios, 0.99).width > both.width
    # the in-process median is the one the window pairs report (statistics.median, 1.5 of 1 and 2), not the
    # median of the logs (sqrt 2): the speedup printed is the factor times the median printed beside it
    assert combine(stats.log_mean_interval(factors), [1.0, 2.0, 1.0, 2.0]).median == pytest.approx(
        math.exp(mean) * 1.5)


@pytest.mark.parametrize(("factor_sigma", "inner_sigma"), [(0.05, 0.02), (0.02, 0.05), (0.0001, 0.05)])
def test_the_combined_interval_covers_the_truth_about_as_often_as_it_says(factor_sigma: float,
                                                                          inner_sigma: float) -> None:
    """800 simulated candidates of true speedup 1.0 (3 process pairs, 16 window pairs, log-normal): the 95%
    interval holds 1.0 in 92-98.5% of them, whichever part dominates (800 draws: +-1.5% is two standard errors)."""
    rng = random.Random(7)
    held = 0
    for _ in range(800):
        factor = stats.log_mean_interval([math.exp(rng.gauss(0, factor_sigma)) for _ in range(3)])
        iv = combine(factor, [math.exp(rng.gauss(0, inner_sigma)) for _ in range(16)])
        held += iv.low <= 1.0 <= iv.high
    assert 0.92 <= held / 800 <= 0.985, held


@pytest.mark.parametrize(("pairs", "spread", "least"), [(2, 3.0, 0.88), (3, 3.0, 0.92), (3, 1.0, 0.93)])
def test_a_pooled_spread_is_lent_only_where_the_recipes_own_agrees(pairs: int, spread: float, least: float) -> None:
    """Script mode's interval of a recipe's few process pairs borrows the spread of the A/A's and earlier recipes'
    pairs (``stats.pooled_log_mean_interval``). Where the recipe's processes truly vary 3x as much (input-bound),
    pooling always covered 81% from 2 pairs and 86% from 3; borrowed only where its own spread agrees, 91% and
    95% (1,500 seeded draws each; the bound is 4 binomial standard errors under that). Where all vary alike, it
    still covers (96-97%)."""
    rng, covered, draws = random.Random(pairs * 10 + int(spread)), 0, 1500
    for _ in range(draws):
        own = [math.exp(rng.gauss(0.0, 0.05 * spread)) for _ in range(pairs)]
        others = [[math.exp(rng.gauss(0.0, 0.05)) for _ in range(3)] for _ in range(3)]
        covered += stats.pooled_log_mean_interval(own, others).contains(1.0)
    assert covered / draws >= least, covered


@pytest.mark.parametrize(("rho", "pairs", "least", "widened"), [(0.6, 16, 0.89, 1.0), (0.0, 16, 0.97, 0.1),
                                                              (0.0, 8, 0.97, 0.1)])
def test_window_pairs_that_drift_together_get_a_wider_interval(rho: float, pairs: int, least: float,
                                                                widened: float) -> None:
    """A worker's window pairs one after another (``stats.compare``): where their ratios drift (AR(1), lag-1
    ``rho`` on the log scale), the order-statistic interval of 16 pairs covered the true median 81% of the time at
    rho = 0.6; widened by the effective sample size, 93%. Independent pairs still cover and are widened in about 5%
    of draws (8 pairs, the race's first look, or 16), not in half of them as a correction noisy at 8 pairs did.
    1,500 seeded draws each; the bounds about 4 binomial standard errors away."""
    rng, covered, wider, draws = random.Random(int(rho * 10) + pairs), 0, 0, 1500
    for _ in range(draws):
        x, ratios = rng.gauss(0.0, 1.0), []
        for _ in range(pairs):
            x = rho * x + math.sqrt(1 - rho * rho) * rng.gauss(0.0, 1.0)
            ratios.append(math.exp(0.05 * x))
        said = stats.serial_median_interval(ratios)
        covered += said.contains(1.0)
        wider += said != stats.median_interval(ratios)
    assert covered / draws >= least, covered
    assert wider / draws <= widened, wider


def test_t_quantiles_of_whole_and_fractional_degrees_of_freedom() -> None:
    assert stats.t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-4)
    assert stats.t_quantile(0.9999, 1) == pytest.approx(3183.0988, abs=1e-3)
    assert stats.t_quantile(0.975, 1e6) == pytest.approx(1.95996, abs=1e-4)
    assert stats.t_quantile(0.975, 2) > stats.t_quantile(0.975, 2.5) > stats.t_quantile(0.975, 3)


def test_a_confirmation_is_a_t_interval_over_its_rounds_counted_in_rounds() -> None:
    """Each round is fresh processes with its own pairs: the rounds are the units. Not the wider of that and the
    rounds' own bounds, and not 18 "fresh pairs" where 3 processes disagree."""
    rounds = [stats.Interval(m, 0.95 * m, 1.05 * m, 0.97, 6) for m in (1.56, 1.75, 2.02)]
    iv = stats.rounds_interval(rounds)
    assert iv == stats.log_mean_interval([1.56, 1.75, 2.02]) and iv.count == 3
    close = [stats.Interval(m, 0.8 * m, 1.2 * m, 0.97, 6) for m in (1.49, 1.5, 1.51)]
    assert stats.rounds_interval(close).high < 1.2 * 1.5  # agreeing rounds: narrower than any one round's
    # ... but not narrower than their own errors allow: three rounds of [1.09-1.41] that agree to 1.24 by chance
    same = [stats.Interval(1.24 * f, 1.09, 1.41, 0.95, 12) for f in (0.999, 1.0, 1.001)]
    iv = stats.rounds_interval(same)
    assert stats.log_mean_interval([r.median for r in same]).high < 1.25  # the t-interval alone
    assert 1.12 < iv.low < 1.18 and 1.30 < iv.high < 1.37, iv
    # A round's own error is read at its own degrees of freedom: an environment's round (its one fresh process
    # pair, the spread of the search's two: 1 df) is a wide t-interval of a modest error, sd 0.1 on the log scale.
    # Two such rounds' mean: variance 2 x 0.01 / 4, Welch's 2 df: [0.92-1.70] (read as normal intervals: [0.51-3.08]).
    own = [stats.part_interval(stats.Part(math.log(m), 0.01, 1.0)) for m in (1.259, 1.246)]
    assert own[0].count == 2 and own[0].low < 0.36  # one round alone: t at 1 df, 12.7 sd at 95%
    iv = stats.rounds_interval(own)
    half = stats.t_quantile(0.5 + stats.CONFIDENCE / 2, 2.0) * math.sqrt(0.005)
    assert (iv.low, iv.high) == pytest.approx((iv.median * math.exp(-half), iv.median * math.exp(half))), iv
    assert stats.rounds_interval(rounds[:1]) == rounds[0]
    assert "that round's interval alone" in rounds_said(1, 6) and "Student-t" in rounds_said(3, 18)


def test_a_confirmation_rounds_factor_is_its_own_process_pair() -> None:
    """The search's pairs chose the candidate: they lend the round only the spread of one pair's ratio."""
    searched = [1.31, 1.25, 1.28]
    own = round_factor(1.10, searched, None)
    assert own.median == pytest.approx(1.10) and own.count == 3
    one_pair = stats.mean_part(searched)
    half = stats.t_quantile(0.975, 2) * math.sqrt(one_pair.variance * 3)
    assert (own.low, own.high) == (pytest.approx(1.10 * math.exp(-half)), pytest.approx(1.10 * math.exp(half)))
    resumed = round_factor(1.10, [], stats.log_mean_interval(searched))  # a resumed search knows the interval
    assert (resumed.low, resumed.high) == (pytest.approx(own.low), pytest.approx(own.high))
    unknown = round_factor(1.10, [1.3], None)
    assert unknown.median == pytest.approx(1.10) and unknown.high == math.inf


def test_compile_time_is_amortised_over_the_same_samples_for_every_arm() -> None:
    """A compiled candidate at 4x the defaults' batch pays its 10 s over ``train_steps`` x the defaults' batch
    (100 x 32 samples), not over 100 of its own 128-sample steps; the eager defaults pay nothing."""
    from autotune.measure.protocol import PairRecord, WindowRecord

    base = ArmStatus("defaults", "ok", step_samples=32, compile_s=0.0)
    cand = ArmStatus("cand", "ok", step_samples=128, compile_s=10.0)
    pairs = [PairRecord("defaults", WindowRecord("defaults", 320.0, 10, 320, 1.0),
                        WindowRecord("cand", 640.0, 5, 640, 1.0))] * 6
    planned = 100 * 32
    expected = (planned / (10.0 + planned / 640.0)) / 320.0
    assert stats.amortised_ratios(pairs, base, cand, train_steps=100) == [pytest.approx(expected)] * 6
    result = stats.compare(pairs, base, cand, train_steps=100)
    assert result.ratio.median == pytest.approx(2.0) and result.amortised.median == pytest.approx(expected)


def test_the_noise_line_says_each_noise_as_measured() -> None:
    """Within one process: the A/A's largest pair difference, not half its range; between fresh processes: the
    process pairs' spread, or that it was not measured; the smallest gain told apart: from an interval the
    search reached, not the margin."""
    from autotune.measure import Noise
    from autotune.measure.measurer import told_apart

    base = dict(window_s=0.3, pairs=8, half_width=0.03, margin=0.02, spread=0.08, aa=(1.0, 0.97, 1.03))
    calibrated = Noise(**base, within=0.05, aa_pairs=8)  # ratios 0.97 .. 1.05: half the range is 4%, the most 5%
    assert calibrated.note() == (
        "identical arms in one process differed by up to 5.0% a window pair (8 A/A pairs); between fresh processes "
        "not measured (no other environment was measured); the smallest gain this search tells apart 4 times in 5 "
        f"is {told_apart(0.02, 0.97, 1.03):.1%} (the A/A's interval)")
    searched = Noise(**base, within=0.05, aa_pairs=8, between=0.062, between_pairs=6,
                     told_apart=told_apart(0.02, 1.10, 1.20), told_by="trial 3's confirmed interval")
    assert searched.note().endswith("between fresh processes a process pair's ratio varied by 6.2% (standard "
                                    "deviation, 6 pairs); the smallest gain this search tells apart 4 times in 5 is "
                                    "8.5% (trial 3's confirmed interval)")
    # 80% power, not the interval's half width (50%): z(0.975) + z(0.8) standard errors above the bar
    assert told_apart(0.02, 1.10, 1.20) == pytest.approx(1.02 * math.exp(math.log(1.2 / 1.1) / 2 * (1 + 0.8416 / 1.96))
                                                         - 1, rel=1e-4)
    assert told_apart(0.02, 1.10, 1.20, power=0.5) == pytest.approx(1.02 * math.sqrt(1.2 / 1.1) - 1)


@pytest.mark.parametrize("pairs", [3, 6, 10])
def test_the_gain_told_apart_is_detected_four_times_in_five(pairs: int) -> None:
    """A design of ``pairs`` process pairs whose log ratios spread by 0.1: the gain ``told_apart`` states for its
    interval's expected width clears the bar (its t interval's low bound above 1 + margin) in about 80% of 2,000
    seeded draws at that gain (the t approximation with a known spread: 76.9-80.3% here), never the half it would
    be at the interval's half width."""
    from autotune.measure.measurer import told_apart

    half = stats.t_quantile(0.975, pairs - 1) * 0.1 / math.sqrt(pairs)
    gain = 1 + told_apart(0.02, math.exp(-half), math.exp(half), df=pairs - 1)
    rng = random.Random(pairs)
    hits = sum(stats.log_mean_interval([gain * math.exp(rng.gauss(0, 0.1)) for _ in range(pairs)]).low > 1.02
               for _ in range(2000))
    assert 0.72 * 2000 <= hits <= 0.86 * 2000, hits


def test_a_calibration_too_wide_to_rank_on_is_taken_again_once_then_ends_the_search(facts) -> None:
    """Identical arms that read [0.93-1.70] (a busy machine) are calibrated once more; twice so, the measurer
    raises with the reason (the search then ends on it within its budget) instead of ranking recipes on it."""
    from types import SimpleNamespace

    from autotune.measure import LiveMeasurer
    from autotune.measure.live.paired_worker import WorkerError
    from autotune.trial import TrialSettings

    reads = [stats.Interval(1.1, 0.93, 1.70, 0.95, 6), stats.Interval(1.0, 0.99, 1.01, 0.95, 6)]
    calls: list[int] = []

    class Worker:
        def calibrate(self, *args, seed: int = 0, **kwargs):
            calls.append(seed)
            aa = reads[min(len(calls), len(reads)) - 1]
            return SimpleNamespace(window_s=0.1, pairs=6, half_width=0.03, margin=0.02, spread=0.1, step_s=0.01,
                                   aa=SimpleNamespace(amortised=aa, ratios=(0.95, 1.05)))

    def measurer() -> LiveMeasurer:
        m = LiveMeasurer("tiny", {"device": "cpu"}, facts, TrialSettings(), window_s=0.1, profile_s=0)  # no profile
        m.pool.defaults_worker = lambda *a, **k: Worker()  # type: ignore[method-assign]
        m.pool.add = lambda *a, **k: ArmStatus("defaults", "ok", step_s=0.01, first_step_s=0.01)  # type: ignore[method-assign]
        return m

    noise = measurer().calibrate(60)
    assert len(calls) == 2 and calls[0] != calls[1] and noise.aa == (1.0, 0.99, 1.01)  # once more, another seed
    reads.pop()
    calls.clear()
    with pytest.raises(WorkerError, match=r"too busy to calibrate: identical arms read 1\.10x \[0\.93-1\.70\] twice"):
        measurer().calibrate(60)
    assert len(calls) == 2


def test_the_calibration_fits_its_share_of_a_short_budget(facts) -> None:
    """Start, A/A and profile take at most 15% of the time given (issue 58): in a minute, 9 s, so 7 pairs of 0.5 s
    windows beside a 1.5 s profile, where a sixth of it for the A/A alone asked 10 pairs and a 2 s profile."""
    from types import SimpleNamespace

    from autotune.measure import LiveMeasurer
    from autotune.trial import TrialSettings

    asked: list[tuple[int, float]] = []
    profiled: list[float] = []

    class Worker:
        def calibrate(self, *args, pairs: int, window_s: float, **kwargs):
            asked.append((pairs, window_s))
            aa = stats.Interval(1.0, 0.99, 1.01, 0.95, pairs)
            return SimpleNamespace(window_s=window_s, pairs=6, half_width=0.03, margin=0.02, spread=0.1,
                                   step_s=0.01, aa=SimpleNamespace(amortised=aa, ratios=(0.99, 1.01)))

        def profile(self, arm: str, seconds: float, step_s: float):
            profiled.append(seconds)
            return SimpleNamespace(operators={})

    m = LiveMeasurer("tiny", {"device": "cpu"}, facts, TrialSettings(), window_s=0.5, profile_s=2.0)
    m.pool.defaults_worker = lambda *a, **k: Worker()  # type: ignore[method-assign]
    m.pool.add = lambda *a, **k: ArmStatus("defaults", "ok", step_s=0.01, first_step_s=0.01)  # type: ignore[method-assign]
    m.calibrate(60.0)
    assert asked == [(7, 0.5)] and profiled == [pytest.approx(1.5)]
    assert sum(2 * n * w for n, w in asked) + sum(profiled) <= 0.15 * 60
