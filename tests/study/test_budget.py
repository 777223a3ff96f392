from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from autotune.errors import UsageError
from autotune.study import Budget, parse_duration

from ..stubs import StubMeasurer


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("1h30m", 5400), ("2h", 7200), ("1h2m3s", 3723), ("45", 45), (" 10M ", 600),
     ("1.5m", 90)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "10x", "m30", "30m30m", "-5m", "0s", "1h 30m", "5 minutes"])
def test_bad_durations_say_how_to_write_one(text: str) -> None:
    with pytest.raises(UsageError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["-5m", "-90", "0s", "-1h30m"])
def test_a_duration_of_zero_or_less_says_so(text: str) -> None:
    with pytest.raises(UsageError, match="it must be more than zero"):
        parse_duration(text)


def test_a_candidate_is_estimated_from_candidates_or_else_from_the_calibration() -> None:
    """The baseline (the A/A calibration) is no model of a candidate's race: before any candidate, the estimate
    is a first round of pairs at the calibration's window, twice over; the confirmation's reserve is its pairs."""
    from dataclasses import asdict, replace

    import optuna

    from autotune.measure import Noise
    from autotune.study import SearchOptions
    from autotune.study.budget import estimate_s
    from autotune.study.reserve import reserve_s

    study = optuna.create_study(direction="maximize")
    assert estimate_s(study) is None
    noise = Noise(window_s=0.5, pairs=12, half_width=0.03, margin=0.02, spread=0.1, aa=(1.0, 0.97, 1.03))
    study.set_user_attr("noise", asdict(noise))
    study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs={
        "wall_s": 100.0, "startup_s": 5.0, "status": "ok", "role": "baseline", "params": {"batch_size": 32},
        "objective": 1.0}))
    assert estimate_s(study) == 2 * (2 * 6 * 0.5)
    study.add_trial(optuna.trial.create_trial(value=1.3, user_attrs={
        "wall_s": 20.0, "timed_s": 12.0, "status": "ok", "role": "seed", "params": {"batch_size": 64},
        "objective": 1.3}))
    assert estimate_s(study) == 1.2 * 20.0
    # Three rounds in fresh processes: each starts the defaults' worker (as the baseline's start, 5 s) and
    # measures the candidate's pairs (12 split over 3, but 6 at least) and its time outside windows again.
    options = SearchOptions(budget_s=120, confirm_top=3)
    # (10% over: ``reserve_s``)
    assert reserve_s(study, options, 24.0) == pytest.approx(1.1 * (3 * 5.0 + 3 * (2 * 6 * 0.5 * 1.1 + (20.0 - 12.0))))
    one = SearchOptions(budget_s=120, confirm_top=3, confirm_rounds=1)
    assert reserve_s(study, one, 24.0) == pytest.approx(1.1 * (5.0 + 2 * 12 * 0.5 * 1.1 + (20.0 - 12.0)))
    # A round starts a worker and builds its arms as the calibration did: 15 s of which 6 timed, past the 5 s start
    study.set_user_attr("noise", asdict(replace(noise, timed_s=6.0, wall_s=15.0)))
    assert reserve_s(study, one, 24.0) == pytest.approx(1.1 * (9.0 + 2 * 12 * 0.5 * 1.1 + (20.0 - 12.0)))


def test_a_round_is_priced_at_a_workers_start_and_the_candidates_arm_not_the_calibrations_extras() -> None:
    """A 2-minute CNN search on a Xeon: the calibration took 19.0 s, 9.6 of them in windows, its worker ready
    (started, the defaults' arm built and settled) after 4.2 s; channels_last's trial 23.2 s, 20.2 in windows,
    0.18 s building and warming up its arm. Its three confirmation rounds took 7.9-8.3 s each (a worker's start
    4.0-4.3 s and 6 window pairs of 0.3 s). Counted from the calibration's and the trial's time outside windows
    (the A/A's second arm, the profiles, the loss) the search kept 54 s for them and stopped exploring at 45 s
    of 120; a round is the worker's start, the arm and the windows."""
    from dataclasses import asdict, replace

    import optuna

    from autotune.measure import Noise
    from autotune.study import SearchOptions
    from autotune.study.reserve import claim_pair_s, kept_rounds, reserve_s, round_parts
    from autotune.trial.spec import Status, TrialResult

    noise = Noise(window_s=0.3, pairs=16, half_width=0.03, margin=0.02, spread=0.25, aa=(1.0, 0.96, 1.09),
                  timed_s=9.6, wall_s=19.0, start_s=4.2)
    study = optuna.create_study(direction="maximize")
    study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs={
        "wall_s": 19.0, "timed_s": 9.6, "startup_s": 2.9, "status": "ok", "role": "baseline",
        "method": "in-process pairs", "params": {"channels_last": False}, "objective": 1.0}))
    study.add_trial(optuna.trial.create_trial(value=1.11, user_attrs={
        "wall_s": 23.2, "timed_s": 20.2, "warmup_s": 0.18, "status": "ok", "role": "seed", "pairs": 32,
        "method": "in-process pairs", "params": {"channels_last": True}, "objective": 1.11, "speedup_low": 1.09,
        "speedup_high": 1.13}))
    options = SearchOptions(budget_s=120, confirm_top=3)
    windows = 2 * 6 * 0.3 * 1.1
    candidate = TrialResult(Status.OK, objective=1.11, method="in-process pairs", pairs=32, wall_s=23.2,
                            timed_s=20.2, warmup_s=0.18)
    assert round_parts(candidate, noise, options, 0) == pytest.approx((windows + 0.18, 4.2))
    study.set_user_attr("noise", asdict(noise))
    kept = reserve_s(study, options, 28.0)
    # and the claim's pairs of your runs: as many as 40% of the 2 minutes holds (3), each two fresh processes, started
    # as the calibration's worker and trained for twice 4 window pairs, 10% over as the rounds (``claim_s``)
    claim = 1.1 * 3 * 2 * (4.2 + 2 * 4 * 0.3)
    # the lone contender's two rounds (``DECIDING_ROUNDS``: your runs decide it after them)
    assert kept - claim == pytest.approx(1.1 * 2 * (4.2 + windows + 0.18)) and 16.0 < kept - claim < 20.0  # 18.3 s
    # where a process's own shape is known and longer (a trial process trains its steps however short the windows,
    # a slow defaults' 50 s where windows said 6 s): that is the price, and 40% of 2 minutes holds no 3 such pairs;
    # without a claim, its three rounds
    study.set_user_attr("noise", asdict(replace(noise, run_s=12.0)))
    assert reserve_s(study, options, 28.0) == pytest.approx(1.5 * (kept - claim))
    study.set_user_attr("noise", asdict(replace(noise, run_s=6.5)))
    assert reserve_s(study, options, 28.0) == pytest.approx(kept - claim + 1.1 * 3 * 2 * 6.5)
    # at 7.0 s the claim's time, 10% over its pairs, takes the reserve past 60% of the budget: two rounds are kept
    # (where your runs cannot decide the candidate, three pairs asked; else two are anyway)
    study.set_user_attr("noise", asdict(replace(noise, run_s=7.0)))
    three = replace(options, claim_pairs=3)
    assert kept_rounds(study, three) == 2 and kept_rounds(study, replace(three, budget_s=130)) == 3
    # and where it is shorter than twice the windows besides the start: still the process's shape (the windows'
    # price, 13.2 s a pair here, held 3 pairs where 4 fit)
    assert claim_pair_s(replace(noise, run_s=5.0)) == pytest.approx(10.0)
    study.set_user_attr("noise", asdict(replace(noise, run_s=5.0)))
    assert reserve_s(study, options, 28.0) == pytest.approx(kept - claim + 1.1 * 4 * 2 * 5.0)
    # a study calibrated before the worker's start was recorded: as before, from the whole time outside windows
    study.set_user_attr("noise", asdict(replace(noise, start_s=None)))
    assert reserve_s(study, options, 28.0) == pytest.approx(1.1 * 3 * ((19.0 - 9.6) + windows + (23.2 - 20.2)))


def test_a_candidate_that_starts_processes_is_estimated_at_its_first_process_pairs_before_any_ran() -> None:
    """Cheap arms measured first are no model of another environment's process pairs: each pair starts two
    workers (their arms built and settled as the calibration's: ``Noise.start_s``) and runs a factor's windows,
    ``PROCESS_PAIRS[0]`` of them. Once such a candidate ran, its wall time is the estimate."""
    from dataclasses import asdict, replace

    import optuna

    from autotune.measure import PROCESS_PAIRS, Noise
    from autotune.study.budget import started_estimate_s

    noise = Noise(window_s=0.3, pairs=16, half_width=0.03, margin=0.02, spread=0.25, aa=(1.0, 0.96, 1.09),
                  timed_s=9.6, wall_s=19.0, start_s=3.2)
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("noise", asdict(noise))
    for value, wall in ((1.0, 19.0), (1.02, 6.0), (1.05, 7.0), (0.97, 5.0)):  # the baseline and three cheap arms
        study.add_trial(optuna.trial.create_trial(value=value, user_attrs={
            "wall_s": wall, "timed_s": wall / 2, "startup_s": 0.0, "status": "ok",
            "role": "baseline" if value == 1.0 else "seed", "method": "in-process pairs", "params": {},
            "objective": value}))
    first = PROCESS_PAIRS[0] * (2 * 3.2 + 2 * 8 * 0.3)
    assert started_estimate_s(study) == pytest.approx(first) and first > 25.0  # the cheap arms': 1.2 x 6 s
    study.set_user_attr("noise", asdict(replace(noise, start_s=None)))  # calibrated before the start was kept
    assert started_estimate_s(study) == pytest.approx(1.2 * 6.0)
    study.set_user_attr("noise", asdict(noise))
    study.add_trial(optuna.trial.create_trial(value=1.09, user_attrs={
        "wall_s": 30.6, "timed_s": 9.6, "startup_s": 19.4, "status": "ok", "role": "heuristic",
        "method": "process pairs", "params": {"threads": 1}, "objective": 1.09}))
    assert started_estimate_s(study) == pytest.approx(1.2 * 30.6)


def _script_study() -> tuple[Any, Any]:
    """A script-mode study: its A/A (3 process pairs in 27 s) and bfloat16 over 4 process pairs in 35 s."""
    from dataclasses import asdict

    import optuna

    from autotune.measure import Noise

    study = optuna.create_study(direction="maximize")
    noise = Noise(window_s=0.5, pairs=6, half_width=0.03, margin=0.035, spread=0.3, aa=(1.0, 0.54, 1.97),
                  timed_s=18.3, wall_s=27.0)
    study.set_user_attr("noise", asdict(noise))
    study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs={
        "wall_s": 27.0, "startup_s": 8.2, "timed_s": 18.3, "status": "ok", "role": "baseline",
        "params": {"batch_size": 64}, "objective": 1.0, "method": "script process pairs (A/A)"}))
    study.add_trial(optuna.trial.create_trial(value=1.66, user_attrs={
        "wall_s": 35.0, "startup_s": 10.1, "timed_s": 24.4, "status": "ok", "role": "seed",
        "params": {"batch_size": 64, "amp_dtype": "bfloat16"}, "objective": 1.66, "speedup_low": 1.28,
        "speedup_high": 2.14, "method": "script process pairs (4)"}))
    return study, noise


def test_a_script_modes_rounds_are_its_process_pairs_alone() -> None:
    """A script-mode candidate of 4 process pairs in 35 s: a round is 2 such pairs (17.5 s), and the defaults'
    start (the baseline's 8.2 s) is not added: every pair starts both copies itself."""
    from dataclasses import asdict, replace

    import optuna

    from autotune.study import SearchOptions
    from autotune.study.reserve import reserve_s

    study, noise = _script_study()
    assert reserve_s(study, SearchOptions(budget_s=178), 42.0) == pytest.approx(1.1 * 3 * 35.0 / 4 * 2)
    # Copies that differ between processes: the calibration sized a round as 4 process pairs of 2 window pairs, and
    # a trial of 2 such pairs took 12 s: a round is 4 pairs of 6 s.
    study.set_user_attr("noise", asdict(replace(noise, pairs=2, round_pairs=8)))
    study.add_trial(optuna.trial.create_trial(value=1.9, user_attrs={
        "wall_s": 12.0, "timed_s": 4.0, "status": "ok", "role": "search", "pairs": 4,
        "params": {"batch_size": 64, "channels_last": True}, "objective": 1.9, "speedup_low": 1.0,
        "speedup_high": 2.3, "method": "script process pairs (2)"}))
    assert reserve_s(study, SearchOptions(budget_s=178, confirm_top=1), 42.0) == pytest.approx(1.1 * 3 * 4 * 6.0)


def test_the_reserve_keeps_fewer_rounds_where_all_would_take_most_of_the_budget() -> None:
    """A script-mode candidate whose round takes 17.5 s: three rounds (57.75 s with 10% over) fit 60% of 178 s and
    are kept; of 80 s two (38.5 s) are, of 50 s one (19.25 s). Three rounds of fresh process pairs and the claim
    had ended a 3-minute script-mode search after its first candidate, where one round then ran."""
    from autotune.study import SearchOptions
    from autotune.study.reserve import kept_rounds, reserve_s

    study, _ = _script_study()
    found = {budget: (kept_rounds(study, SearchOptions(budget_s=budget)),
                      reserve_s(study, SearchOptions(budget_s=budget), 42.0)) for budget in (178, 80, 50)}
    assert found == {178: (3, pytest.approx(57.75)), 80: (2, pytest.approx(38.5)), 50: (1, pytest.approx(19.25))}
    assert kept_rounds(study, SearchOptions(budget_s=None)) == 3


def test_after_a_lone_heuristic_a_3_minute_demos_bfloat16_look_still_fits() -> None:
    """A newcomer's 3-minute CNN demo on the Zen 4 (its study, as it stood after its first candidate): the bfloat16
    kernels read 1.3485x float32's (not ``promising``), so the heuristic went first and took 45 s (1.12x
    [0.85-1.49], the only contender); with 117 s left, three rounds of it and your runs' six pairs were kept (104 s)
    and bfloat16's in-process look (14.4 s) was refused by 1.4 s: the search confirmed the heuristic three times and
    kept the defaults, bfloat16 never measured (1.6-1.9x here). Two rounds (after which your runs decide it) and
    your runs (88 s) leave the look; from 5 minutes on, or where your runs cannot decide it, as before."""
    from dataclasses import replace

    import optuna

    from autotune.study import SearchOptions
    from autotune.study.budget import in_process_estimate_s
    from autotune.study.reserve import kept_rounds, reserve_s

    study = optuna.create_study(direction="maximize")
    study.set_user_attr("noise", {
        "window_s": 0.3, "pairs": 24, "half_width": 0.03, "margin": 0.0807, "spread": 0.4934,
        "aa": [0.9761, 0.9253, 1.0676], "timed_s": 9.6, "wall_s": 16.5486, "within": 0.3253, "aa_pairs": 16,
        "between": 0.1135, "between_pairs": 3, "start_s": 4.0279, "run_s": 4.1317})
    base = {"threads": 2, "interop_threads": 2, "affinity": "none", "openmp": "gnu", "kmp_blocktime": None,
            "allocator": "default", "batch_per_rank": 64, "amp_dtype": "float32", "device": "cpu"}
    study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs={
        "role": "baseline", "method": "in-process pairs", "wall_s": 16.5486, "timed_s": 9.6, "startup_s": 2.5877,
        "warmup_s": 0.0, "pairs": 16, "objective": 1.0, "speedup_low": 0.9253, "speedup_high": 1.0676,
        "status": "ok", "params": base}))
    study.add_trial(optuna.trial.create_trial(value=1.1205, user_attrs={
        "role": "heuristic", "method": "process pairs", "wall_s": 45.072, "timed_s": 23.2559, "startup_s": 20.9755,
        "warmup_s": 0.0, "pairs": 3, "objective": 1.1205, "speedup_low": 0.8453, "speedup_high": 1.4854,
        "status": "ok", "params": {**base, "interop_threads": 1, "affinity": "compact", "openmp": "intel",
                                   "kmp_blocktime": 1, "allocator": "tcmalloc"}}))
    options, left, look = SearchOptions(budget_s=180), 117.0, in_process_estimate_s(study)
    assert look == pytest.approx(14.4) and kept_rounds(study, options) == 2
    kept = reserve_s(study, options, look, left=left)
    assert kept == pytest.approx(87.6, abs=0.1) and left - kept >= look  # the loop admits it (``Turns._admitted``)
    assert [kept_rounds(study, replace(options, **o)) for o in ({"budget_s": 300}, {"claim_pairs": 4})] == [3, 3]


def test_the_reserve_keeps_no_round_the_time_left_cannot_hold() -> None:
    """Two script-mode contenders, bfloat16 (rounds of 17.5 s) and tcmalloc (20 s), two rounds each kept, 10% over:
    82.5 s. A round is judged as the confirmation judges it, at its estimate beside those above (``confirm.Rounds``):
    with 58 s left tcmalloc's first fits beside bfloat16's two (55 s) and all stay kept (the search stops there);
    with 54 s it cannot, and bfloat16's two rounds are kept; with 30 s, bfloat16's first alone, whatever is left.
    Beside the claim's six pairs of 10 s (66 s kept), with 90 s left tcmalloc's round cannot fit either. Kept for
    rounds that never run, the time went unused (a 3-minute CNN search stopped sampling with 111 s left, 118 s kept,
    and ended 26 s early); a trial may take what is left beside those that will run."""
    from dataclasses import asdict, replace

    import optuna

    from autotune.study import SearchOptions
    from autotune.study.limits import timeout_s
    from autotune.study.reserve import racing_reserve_s, reserve_s

    study, noise = _script_study()
    study.add_trial(optuna.trial.create_trial(value=1.5, user_attrs={
        "wall_s": 40.0, "startup_s": 12.0, "timed_s": 24.4, "status": "ok", "role": "heuristic",
        "params": {"batch_size": 64, "allocator": "tcmalloc"}, "objective": 1.5, "speedup_low": 1.2,
        "speedup_high": 1.9, "method": "script process pairs (4)"}))
    options = SearchOptions(budget_s=178)
    kept = {left: reserve_s(study, options, 42.0, left=left) for left in (None, 100.0, 58.0, 54.0, 30.0, 10.0)}
    assert kept == {None: pytest.approx(82.5), 100.0: pytest.approx(82.5), 58.0: pytest.approx(60.5),
                    54.0: pytest.approx(38.5), 30.0: pytest.approx(19.25), 10.0: pytest.approx(19.25)}
    assert timeout_s(study, options, {}, 54.0, 42.0) == pytest.approx(54.0 - 38.5)  # was 1 s: 54 - 82.5 kept
    study.set_user_attr("noise", asdict(replace(noise, start_s=4.0, run_s=5.0)))  # a pair of your runs: 10 s
    assert reserve_s(study, options, 42.0) == pytest.approx(1.1 * (17.5 + 20.0 + 6 * 10.0))  # one round each
    assert reserve_s(study, options, 42.0, left=90.0) == pytest.approx(1.1 * (17.5 + 6 * 10.0))
    # a candidate being raced (two process pairs in 12 s so far: a round of 12 s) keeps its round; tcmalloc's goes
    raced = {left: racing_reserve_s(study, options, {"batch_size": 64, "channels_last": True},
                                    "script process pairs (2)", wall_s=12.0, timed_s=4.0, left=left)
             for left in (None, 90.0)}
    assert raced == {None: pytest.approx(1.1 * (17.5 + 20.0 + 12.0 + 60.0)),
                     90.0: pytest.approx(1.1 * (17.5 + 12.0 + 60.0))}


def _script_loop(facts: Any, measurer: Any, options: Any, seconds: float) -> Any:
    """A SearchLoop of script mode over a measurer of noise alone, calibrated, ``seconds`` from its deadline."""

    import optuna

    from autotune.search_spaces import SpaceContext
    from autotune.study.loop import SearchLoop

    loop = SearchLoop(optuna.create_study(direction="maximize"), "script:train.py", facts,
                      SpaceContext(default_batch_size=64), {}, options, budget=Budget.start(seconds),
                      notify=lambda *a: None, measurer=measurer)
    loop.calibrate(60.0)
    return loop


def _ask(loop: Any, role: str, params: dict) -> Any:
    """A trial of ``loop``'s study as the loop starts one (``SearchLoop._next``)."""
    trial = loop.study.ask()
    trial.set_user_attr("role", role)
    trial.set_user_attr("params", params)
    return trial


def test_a_script_candidate_is_not_started_where_its_first_process_pairs_cannot_end(facts, caplog) -> None:
    """On an H100 machine a script's copies took 25 s a process pair to start and measure: its A/A took 76 s of a
    105-s study, and the first candidate, estimated from windows alone (8 s), started with 21 s left, ran out
    before its copies' first steps and was told as a fault of the defaults' copy. Before any candidate, a script's
    estimate is its first round: 2 process pairs started and measured as the A/A's were."""
    from autotune.measure import Noise
    from autotune.study import SearchOptions
    from autotune.study.budget import estimate_s
    from autotune.trial import TrialResult

    # 3 process pairs of 6 window pairs: 20 s in windows, 56 s starting copies and warming them up
    noise = Noise(window_s=0.5, pairs=6, half_width=0.03, margin=0.2, spread=0.4, aa=(1.0, 0.76, 1.33),
                  timed_s=20.0, wall_s=76.0, aa_pairs=18, round_pairs=24)

    class Calibrated(StubMeasurer):
        fresh_processes = True

        def calibrate(self, timeout_s: float) -> Noise:
            return noise

        def begin(self, params: dict, timeout_s: float) -> object:
            raise AssertionError("no candidate fits in 21 s")

    loop = _script_loop(facts, Calibrated(), SearchOptions(budget_s=105), 21)
    loop.record(_ask(loop, "baseline", loop.defaults), "baseline", loop.defaults, TrialResult(
        "ok", objective=1.0, loss=1.0, wall_s=76.0, timed_s=20.0, method="script process pairs (A/A)"))
    assert estimate_s(loop.study) == pytest.approx(2 * (56.0 / 3 + 6 * 20.0 / 18))
    with caplog.at_level("WARNING"):
        assert loop.run() == "budget"
    assert "before any candidate is measured: 21 s left; a candidate needs about 51 s here" in caplog.text


def test_no_trial_may_take_the_time_kept_for_the_confirmation() -> None:
    """A compile trial started with 62 s left, 30 of them kept to confirm the candidates found, gets 32 s:
    it timed out at 60 s in a 2-minute demo and left the best candidate unconfirmed."""
    from dataclasses import asdict

    import optuna

    from autotune.measure import Noise
    from autotune.study import SearchOptions
    from autotune.study.limits import timeout_s
    from autotune.study.reserve import reserve_s

    study = optuna.create_study(direction="maximize")
    noise = Noise(window_s=0.5, pairs=12, half_width=0.03, margin=0.02, spread=0.1, aa=(1.0, 0.97, 1.03))
    study.set_user_attr("noise", asdict(noise))
    study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs={
        "wall_s": 12.0, "status": "ok", "role": "baseline", "params": {}, "objective": 1.0}))
    for value in (1.5, 2.2):
        study.add_trial(optuna.trial.create_trial(value=value, user_attrs={
            "wall_s": 8.0, "timed_s": 6.0, "status": "ok", "role": "seed", "params": {"amp": value},
            "objective": value, "speedup_low": value - 0.05, "speedup_high": value + 0.05}))
    options = SearchOptions(budget_s=120, confirm_top=2)
    reserve = reserve_s(study, options, 9.6)
    assert reserve > 20
    compiled = timeout_s(study, options, {"compile_mode": "default"}, 62.0, 9.6)
    assert compiled == pytest.approx(62.0 - reserve)
    eager = timeout_s(study, options, {"compile_mode": "none"}, 62.0, 9.6)
    assert eager == pytest.approx(min(62.0 - reserve, 60.0))
    assert timeout_s(study, options, {}, 600.0, 9.6) == 60.0  # far from the end: 5x the estimate, 60 s at least


def test_a_recipe_of_another_environment_pays_a_fresh_process_pair_every_round() -> None:
    """Each round adds one fresh process pair to an environment's factor (pooled with the search's): it costs what
    the trial's pairs did, never less than a calibration's time outside windows and the pair's windows (a
    combination measured in the search with its factor cached spent 1.5 s outside windows); a factor the search
    cut short for time is completed in round 0, 3 pairs at least (the heuristic's search ran 1 pair in 16.1 s
    and its round 0 took 39 s, where 15 s had been kept)."""
    from autotune.measure import Noise
    from autotune.study import SearchOptions
    from autotune.study.reserve import confirm_s, round_s
    from autotune.trial.spec import Status, TrialResult

    noise = Noise(window_s=0.3, pairs=16, half_width=0.03, margin=0.02, spread=0.1, aa=(1.0, 0.97, 1.03))
    options = SearchOptions(budget_s=120, confirm_top=3)
    windows = 2 * 6 * 0.3 * 1.1
    # a recipe that is its environment (the heuristic) has no windows of its own: its process pair measures it
    heuristic = TrialResult(Status.OK, objective=1.16, method="process pairs", pairs=1, wall_s=16.1, timed_s=5.0)
    assert round_s(heuristic, noise, options, 0) == round_s(heuristic, noise, options, 2) == pytest.approx(11.1)
    assert confirm_s(heuristic, noise, options) == pytest.approx(3 * 11.1)
    five = TrialResult(Status.OK, objective=1.5, method="process pairs", pairs=5, wall_s=49.3, timed_s=12.6)
    assert round_s(five, noise, options, 0) == pytest.approx(36.7 / 5)
    # a factor cut short for time inside a mixed measurement: round 0 measures it whole
    mixed = TrialResult(Status.OK, objective=1.5, method="process pairs x in-process pairs", pairs=12, wall_s=20.0,
                        timed_s=8.0, warnings=["environment factor from 2 process pair(s): time ran out"])
    assert round_s(mixed, noise, options, 0) == pytest.approx(windows + 3 * 6.0)
    assert round_s(mixed, noise, options, 1) == pytest.approx(windows + 6.0)
    # its factor cached in the search: a pair's cost from the calibration (a worker's start: 9.0 - 4.8 s); the
    # pair's environment side goes on as the round's worker: no other start
    started = Noise(window_s=0.3, pairs=16, half_width=0.03, margin=0.02, spread=0.1, aa=(1.0, 0.97, 1.03),
                    timed_s=4.8, wall_s=9.0)
    combined = TrialResult(Status.OK, objective=1.25, method="process pairs x in-process pairs", pairs=3,
                           wall_s=4.5, timed_s=3.0)
    assert round_s(combined, started, options, 1) == pytest.approx(windows + (4.2 + 2 * 8 * 0.3))
    in_process = TrialResult(Status.OK, objective=1.7, method="in-process pairs", pairs=16, wall_s=10.0, timed_s=9.8)
    assert round_s(in_process, noise, options, 0) == round_s(in_process, noise, options, 2) == pytest.approx(
        windows + 0.2)


def test_candidates_of_one_environment_share_its_process_pair_in_the_time_kept() -> None:
    """The heuristic and its combination with channels_last share their environment's process pair each round:
    kept apart, a 5-minute search stopped at 125 s with 175 s left and then confirmed in 84 s. No candidate of the
    defaults' environment: no defaults' worker is kept for (it had been: 105 s kept, 66 s taken)."""
    from dataclasses import asdict

    import optuna

    from autotune.measure import Noise
    from autotune.study import SearchOptions
    from autotune.study.reserve import reserve_s, round_parts
    from autotune.trial.spec import TrialResult

    noise = Noise(window_s=0.3, pairs=16, half_width=0.03, margin=0.02, spread=0.1, aa=(1.0, 0.97, 1.03),
                  timed_s=5.0, wall_s=9.0)
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("noise", asdict(noise))
    env = {"threads": 1, "openmp": "intel"}
    recipes = [({}, 1.0, "in-process pairs", 14.0, 5.0),  # the baseline
               ({**env}, 1.08, "process pairs", 37.0, 8.0),
               ({**env, "channels_last": True}, 1.24, "process pairs x in-process pairs", 70.0, 25.0)]
    for params, value, method, wall, timed in recipes:
        study.add_trial(optuna.trial.create_trial(value=value, user_attrs={
            "wall_s": wall, "timed_s": timed, "status": "ok", "role": "baseline" if value == 1.0 else "search",
            "params": params, "objective": value, "speedup_low": value - 0.04, "speedup_high": value + 0.2,
            "method": method, "pairs": 3}))
    options = SearchOptions(budget_s=300, confirm_top=3)
    parts = [[round_parts(TrialResult("ok", objective=v, method=m, pairs=3, wall_s=w, timed_s=t), noise, options, r)
              for r in range(3)] for _, v, m, w, t in recipes[1:]]
    own = sum(o for rounds in parts for o, _ in rounds)
    shared = sum(max(a[1], b[1]) for a, b in zip(*parts, strict=True))  # one pair a round for the two
    assert reserve_s(study, options, 40.0) == pytest.approx(1.1 * (own + shared))
    assert shared < sum(p for rounds in parts for _, p in rounds)


def test_an_environment_part_of_a_round_is_at_least_one_process_pair_as_the_search_measured_it() -> None:
    """Counted from the calibration (a worker's start and the pair's windows), the heuristic's process pair was
    8.1 s a round where it took 9.4 s: a 5-minute search kept too little and its third round timed out. Its own
    trial measured a process pair at 28.3 s / 3."""
    from dataclasses import asdict

    import optuna

    from autotune.measure import Noise, environment_key
    from autotune.study import SearchOptions
    from autotune.study.reserve import floors, reserve_s

    noise = Noise(window_s=0.3, pairs=8, half_width=0.03, margin=0.02, spread=0.1, aa=(1.0, 0.97, 1.03),
                  timed_s=9.6, wall_s=15.3)
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("noise", asdict(noise))
    env = {"threads": 1, "openmp": "intel"}
    recipes = [({}, 1.0, "in-process pairs", 15.3, 9.6, 16, "baseline", 2.6),
               ({**env}, 1.08, "process pairs", 28.3, 7.8, 3, "heuristic", 20.5),
               ({**env, "channels_last": True}, 1.31, "process pairs x in-process pairs", 15.7, 15.4, 24, "combined",
                0.0)]
    for params, value, method, wall, timed, pairs, role, startup in recipes:
        study.add_trial(optuna.trial.create_trial(value=value, user_attrs={
            "wall_s": wall, "timed_s": timed, "status": "ok", "role": role, "params": params, "objective": value,
            "speedup_low": value - 0.04, "speedup_high": value + 0.04, "method": method, "pairs": pairs,
            "startup_s": startup}))
    found = floors(study)
    assert found == {environment_key({}): 2.6, environment_key(env): pytest.approx(28.3 / 3)}
    options = SearchOptions(budget_s=300, confirm_top=3, confirm_rounds=3)
    windows = 2 * 6 * 0.3 * 1.1
    # channels_last in the heuristic's environment: its windows, and that environment's process pair, a round
    assert reserve_s(study, options, 10.0) == pytest.approx(1.1 * 3 * (windows + 28.3 / 3))


def test_a_candidate_being_raced_keeps_the_time_its_own_confirmation_needs() -> None:
    """A 60-s search's first candidate raced to its cap (24 pairs, 37 s) and was then left unconfirmed ("the
    budget was short"). Counted as one more candidate from its first round, while the confirmation has room for
    it: its round's pairs at the calibration's window, its time outside windows so far, the defaults' worker's start."""
    from dataclasses import asdict

    import optuna

    from autotune.measure import Noise
    from autotune.study import SearchOptions
    from autotune.study.reserve import racing_reserve_s, reserve_s

    noise = Noise(window_s=0.5, pairs=8, half_width=0.03, margin=0.02, spread=0.1, aa=(1.0, 0.97, 1.03),
                  timed_s=8.0, wall_s=14.0)
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("noise", asdict(noise))
    study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs={
        "wall_s": 14.0, "timed_s": 8.0, "status": "ok", "role": "baseline", "params": {"batch_per_rank": 64},
        "objective": 1.0, "startup_s": 4.0}))
    candidate, method = {"batch_per_rank": 256, "threads": 2}, "in-process pairs"  # the measurer's ``method``
    one = SearchOptions(budget_s=60, confirm_top=1, confirm_rounds=1)
    assert reserve_s(study, one, None) == 0.0  # no candidate yet: nothing was kept
    # its round: 8 pairs of two 0.5-s windows, 10% over, 2 s of its 6 so far outside windows, the 6-s start
    kept = racing_reserve_s(study, one, candidate, method, wall_s=6.0, timed_s=4.0)
    assert kept == pytest.approx(1.1 * (2 * 8 * 0.5 * 1.1 + 2.0 + 6.0))
    # an environment measured by its process pairs alone: 36 s outside windows in 3 pairs, a round runs one (at
    # least the 6-s start and 4 window pairs of 0.5 s); not its whole time outside windows as one pair's
    environment = {"batch_per_rank": 64, "allocator": "tcmalloc"}
    assert racing_reserve_s(study, one, environment, "process pairs", wall_s=40.0, timed_s=4.0, pairs=3) == \
        pytest.approx(1.1 * 36.0 / 3)
    # a contender already takes the one place: the candidate would displace it, not add a confirmation
    study.add_trial(optuna.trial.create_trial(value=1.5, user_attrs={
        "wall_s": 20.0, "timed_s": 16.0, "status": "ok", "role": "seed", "params": {"batch_per_rank": 128},
        "objective": 1.5, "speedup_low": 1.4, "speedup_high": 1.6, "method": "in-process pairs", "pairs": 16}))
    assert racing_reserve_s(study, one, candidate, method, wall_s=6.0, timed_s=4.0) == reserve_s(study, one, 1.0)
    # two places: both are kept for
    two = SearchOptions(budget_s=60, confirm_top=2, confirm_rounds=1)
    assert racing_reserve_s(study, two, candidate, method, wall_s=6.0, timed_s=4.0) > reserve_s(study, two, 1.0)
    assert racing_reserve_s(study, SearchOptions(budget_s=None, confirm_top=2), candidate, method, wall_s=6.0,
                            timed_s=4.0) == 0.0  # no budget: nothing to keep


def test_the_rounds_a_measurer_resizes_are_the_ones_the_budget_keeps_time_for(facts) -> None:
    """Script mode's measurer resizes its rounds once a candidate's process pairs show that processes differ
    (``measure.sizing.Spread``): the loop stores its new noise when that trial is recorded, and the time kept to
    confirm it is 4 process pairs of 2 windows where it was 2 of 6."""
    from dataclasses import replace

    from autotune.measure import Noise
    from autotune.study import SearchOptions
    from autotune.study.budget import recorded_noise
    from autotune.study.reserve import reserve_s
    from autotune.trial import TrialResult

    class Resizing(StubMeasurer):
        def __init__(self) -> None:
            super().__init__()
            self.noise = Noise(window_s=0.5, pairs=6, half_width=0.03, margin=0.035, spread=0.1,
                               aa=(1.0, 0.97, 1.03), timed_s=18.0, wall_s=27.0, round_pairs=12)

        def calibrate(self, timeout_s: float) -> Noise:
            return self.noise

    options = SearchOptions(budget_s=178, confirm_top=1)
    measurer = Resizing()
    loop = _script_loop(facts, measurer, options, 178)
    study = loop.study
    loop.record(_ask(loop, "baseline", loop.defaults), "baseline", loop.defaults, TrialResult(
        "ok", objective=1.0, loss=1.0, wall_s=27.0, method="script process pairs (A/A)"))
    params = {**loop.defaults, "channels_last": True}
    result = TrialResult("ok", objective=1.9, speedup_low=1.2, speedup_high=2.9, loss=1.0, wall_s=24.0, timed_s=12.0,
                         pairs=12, method="script process pairs (2)")
    kept = {}
    for shape in ("unsized", "resized"):
        if shape == "resized":
            measurer.noise = replace(measurer.noise, pairs=2, round_pairs=8)
        loop.record(_ask(loop, "search", params), "search", params, result)
        kept[shape] = reserve_s(study, options, 42.0)
    assert recorded_noise(study) == loop.noise == measurer.noise
    # a process pair of the trial took 12 s, 6 of them in its 6 window pairs of 1 s: a round is 2 such pairs,
    # then 4 pairs of its 6-s start and 2 window pairs
    assert kept == {"unsized": pytest.approx(1.1 * 3 * 2 * 12.0), "resized": pytest.approx(1.1 * 3 * 4 * 8.0)}


def test_a_script_candidate_being_raced_keeps_its_rounds_of_fresh_process_pairs(tmp_path, facts) -> None:
    """Raced in script mode's long-lived copy, a candidate's confirmation is fresh process pairs of copies, priced as
    the A/A's (3 pairs in 27 s, 18.3 s of it windows: a pair of 6 window pairs 9.0 s): 3 such pairs a round, 10% over,
    not its windows as an arm's of a worker. The measurer names the method (``ScriptMeasurer.method``)."""
    from dataclasses import asdict

    import optuna

    from autotune.measure import Noise, ScriptMeasurer
    from autotune.measure.script.results import ScriptTrial
    from autotune.study import SearchOptions
    from autotune.study.reserve import racing_reserve_s

    noise = Noise(window_s=0.5, pairs=6, half_width=0.03, margin=0.035, spread=0.3, aa=(1.0, 0.9, 1.1),
                  timed_s=18.3, wall_s=27.0, aa_pairs=18, round_pairs=18)
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("noise", asdict(noise))
    study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs={
        "wall_s": 27.0, "startup_s": 8.2, "timed_s": 18.3, "status": "ok", "role": "baseline",
        "params": {"batch_size": 64}, "objective": 1.0, "method": "script process pairs (A/A)"}))
    params = {"batch_size": 64, "amp_dtype": "bfloat16"}
    measurer = ScriptMeasurer(["python", "train.py"], {"batch_size": 64}, facts, tmp_path, workload="script:train.py",
                              loss_samples=64)
    in_copy = ScriptTrial(params, baseline=False, deadline=0.0, in_copy=[(1.0, 1.5)] * 4)
    method = measurer.method(in_copy, params)
    assert method == "script window pairs in one copy (4)"
    options = SearchOptions(budget_s=600, confirm_top=1)
    pair = (27.0 - 18.3) / 3 + 6 * 18.3 / 18
    assert racing_reserve_s(study, options, params, method, wall_s=6.0, timed_s=4.0) == pytest.approx(
        1.1 * 3 * 3 * pair)
    # raced in fresh process pairs: 2 pairs of 2 window pairs (4 s), 12.2 s in all, 2 s of which its candidate's
    # training to the loss's samples, which a round's pair does not repeat; priced from the measurer's own figures
    # (``PairedMeasurer.so_far``), not the loop's nominal ones (2 windows of 0.5 s a window pair, 6 a process pair)
    fresh = ScriptTrial(params, baseline=False, deadline=0.0, started=time.monotonic() - 12.2, medians=[1.2, 1.3],
                        windows=4, timed_s=4.0, once_s=2.0)
    assert measurer.method(fresh, params) == "script process pairs (2)"
    pair = (12.2 - 4.0 - 2.0) / 2 + 6 * 4.0 / 4
    assert racing_reserve_s(study, options, params, "script process pairs (2)", wall_s=13.0, timed_s=4.0,
                            measured=measurer.so_far(fresh)) == pytest.approx(1.1 * 3 * 3 * pair, rel=1e-3)


def test_a_script_round_is_priced_without_what_its_trial_spent_once(facts) -> None:
    """A 3-minute search of the CNN script: its A/A's first process pair also timed the defaults' step alone and
    trained to the loss's samples, and its heuristic's first pair trained its candidate to the loss; counted into
    every confirmation round, that time priced the rounds of 4 pairs at 24.0 and 24.5 s where they took 20.5-20.6 s
    (3.1 s a pair outside windows), and kept the exploration's time. What a trial spent once (``once_s``) is not a
    round's; a candidate's first trial, before any was measured, takes the A/A's once-only time too."""
    import optuna

    from autotune.measure import Noise, first_rounds_s
    from autotune.study import SearchOptions, verdict
    from autotune.study.records import records
    from autotune.study.reserve import round_s
    from autotune.trial import TrialResult

    # as that search recorded them: the A/A's 3 pairs in 30.2 s, 18.29 s windows, 2.55 s spent once; the heuristic's
    # 2 pairs in 12.2 s, 4.05 s windows, 1.9 s once
    noise = Noise(window_s=0.5, pairs=2, half_width=0.03, margin=0.035, spread=0.1, aa=(1.0, 0.95, 1.05),
                  timed_s=18.29, wall_s=30.2, aa_pairs=18, round_pairs=8, start_s=(30.2 - 18.29 - 2.55) / 6)
    heuristic = TrialResult("ok", objective=1.15, method="script process pairs (2)", pairs=4, wall_s=12.2,
                            timed_s=4.05, once_s=1.9)
    in_copy = TrialResult("ok", objective=2.0, method="script window pairs in one copy (6)", pairs=6, wall_s=11.0,
                          timed_s=6.0)
    options = SearchOptions(budget_s=180)
    # the rounds are priced from the stored result (``records``), which keeps what was spent once
    study = optuna.create_study(direction="maximize")
    trial = _ask(SimpleNamespace(study=study), "heuristic", {"batch_size": 64})
    verdict.record(study, facts, options, trial, "heuristic", {"batch_size": 64}, heuristic, lambda *a: None)
    assert records(study)[0].result.once_s == 1.9
    window_pairs = 2 * 18.29 / 18  # a process pair's two window pairs, as the A/A's took them
    assert round_s(heuristic, noise, options, 0) == pytest.approx(4 * ((12.2 - 4.05 - 1.9) / 2 + 2 * 4.05 / 4))
    assert round_s(in_copy, noise, options, 0) == pytest.approx(4 * ((30.2 - 18.29 - 2.55) / 3 + window_pairs))
    for priced in (round_s(heuristic, noise, options, 0), round_s(in_copy, noise, options, 0)):
        assert 20.3 <= priced <= 1.05 * 20.6
    # the first candidate's trial: the A/A's 2 pairs and its once-only time (its loss)
    assert first_rounds_s(noise) == pytest.approx(2 * ((30.2 - 18.29 - 2.55) / 3 + window_pairs) + 2.55)
    # a study calibrated before ``once_s`` was told apart: all its time outside windows, as before
    for old in (Noise(**{**noise.__dict__, "start_s": None}), Noise(**{**noise.__dict__, "start_s": 11.91 / 6})):
        assert round_s(in_copy, old, options, 0) == pytest.approx(4 * ((30.2 - 18.29) / 3 + window_pairs))
        assert first_rounds_s(old) == pytest.approx(2 * ((30.2 - 18.29) / 3 + window_pairs))
