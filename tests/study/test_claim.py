"""The claim is about your process (issue 57): the recipe the confirmation chose runs against the defaults in fresh
process pairs started as your training is, and the stated speedup, its interval and the range of one run of yours
come from those pairs alone; confirmed takes two rounds and six pairs faster with confidence. On the scripted clock
and stubbed pair of ``test_confirm_cut``, whose rounds read the fast recipe at 1.40x [1.30-1.50] in the workers."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from autotune.measure import Noise, PairFailed, RunPair
from autotune.recipe_file import to_env
from autotune.study import how_measured
from autotune.study.reserve import OVER
from autotune.testing.replay import ReplayClock

from .test_confirm_cut import FAST, SLOW, Stubbed, _explored, _search

PAIR_S = 15.0  # a process pair of your runs on the scripted clock


@dataclass
class Yours(Stubbed):
    """``Stubbed``, whose process pairs of your runs read ``ratios`` in turn (a ``None``: that pair fails; ``base``
    or ``cand``: that side's process fails)."""

    ratios: list[float | None | BaseException | str] = field(default_factory=list)
    asked: list[dict[str, Any]] = field(default_factory=list)
    start_s: float | None = None  # the calibration's worker start: what prices a pair of your runs
    pair_s: float = PAIR_S  # what a pair takes
    searched: dict[str, list[float]] = field(default_factory=dict)  # the search's process pairs by environment
    user_processes = True

    def __post_init__(self) -> None:
        super().__post_init__()
        self.factor_ratios.update(self.searched)

    def calibrate(self, timeout_s: float) -> Noise:
        return replace(super().calibrate(timeout_s), start_s=self.start_s)

    def user_pair(self, params: dict[str, Any], seed: int, timeout_s: float) -> RunPair:
        self.asked.append(params)
        self.clock.charge(self.pair_s)
        ratio = self.ratios.pop(0)
        if ratio is None:
            raise PairFailed("the candidate worker's arm failed (crash): exit 1")
        if isinstance(ratio, BaseException):  # a pair that could not start, or Ctrl-C in it
            raise ratio
        if isinstance(ratio, str):
            whose = "the recipe's" if ratio == "cand" else "the defaults'"
            raise PairFailed(f"{whose} run: crash: killed by SIGSEGV", ratio)
        return RunPair(ratio, 2.0, self.pair_s, 1000.0 * ratio, 1000.0)  # the defaults' processes alike


YOURS = [1.15, 1.22, 1.10, 1.25, 1.18, 1.12]  # your process pairs: below the workers' 1.40x


def _yours(tmp_path: Path, facts: Any, ratios: list[float | None | BaseException | str], *, budget_s: float = 3600.0,
           claim_pairs: int | None = None, searched: dict[str, list[float]] | None = None) -> tuple[Any, Yours]:
    clock = ReplayClock()
    stub = Yours(clock, _explored(), {"fast": FAST, "slow": SLOW}, ratios=list(ratios), searched=searched or {})
    recipe, _ = _search(tmp_path, facts, stub, budget_s, clock, claim_pairs=claim_pairs)
    return recipe, stub


def test_the_stated_speedup_is_your_runs_not_the_workers(tmp_path: Path, facts: Any) -> None:
    """Six pairs of your runs read about 1.17x: the recipe states their geometric mean with a t interval over them
    and where one run of yours falls (90% prediction interval), not the workers' 1.41x (before: 1.41x [1.37-1.45],
    confirmed); every view carries it."""
    recipe, stub = _yours(tmp_path, facts, YOURS)
    assert len(stub.asked) == 6 and stub.asked[0] == recipe.params
    logs = [math.log(r) for r in YOURS]
    assert recipe.speedup == pytest.approx(math.exp(statistics.fmean(logs)), rel=1e-9)
    half = 2.5706 * statistics.stdev(logs) / math.sqrt(6)  # t(5) at 97.5%
    assert recipe.speedup_low == pytest.approx(recipe.speedup * math.exp(-half), rel=1e-3)
    assert recipe.speedup_high == pytest.approx(recipe.speedup * math.exp(half), rel=1e-3)
    run = 2.0150 * statistics.stdev(logs) * math.sqrt(1 + 1 / 6)  # t(5) at 95%: the 90% prediction
    assert recipe.run_low == pytest.approx(recipe.speedup * math.exp(-run), rel=1e-3)
    assert recipe.run_high == pytest.approx(recipe.speedup * math.exp(run), rel=1e-3)
    assert (recipe.claim, recipe.process_pairs, recipe.run_s, recipe.confidence) == ("confirmed", 6, 2.0, 0.95)
    assert recipe.claim_text == "confirmed: 6 fresh process pairs of your training, 95% interval"
    said = " ".join(recipe.notes)
    assert "your runs (trial 1, 6 fresh process pairs" in said and "the search's workers read 1.41x" in said, said
    assert "the defaults' processes ran at 1,000-1,000 samples/s (1.00x apart), the recipe's at 1,100-1,250" in said
    assert recipe.run_text is not None and recipe.run_text.startswith(
        f"a run of yours: {recipe.run_low:.2f}-{recipe.run_high:.2f}x the defaults' (90% prediction interval")
    header = to_env(recipe, {}, None)
    assert f"# {recipe.run_text}" in header and "confirmed: 6 fresh process pairs" in header


@pytest.mark.parametrize("theirs", ["wider", "narrower"])
def test_your_runs_borrow_the_searchs_spread_between_processes_only_where_theirs_is_no_larger(
        tmp_path: Path, facts: Any, theirs: str) -> None:
    """Six pairs whose spread (0.049 on the log scale) is under the search's process pairs' (0.114, 4 pairs of one
    environment; a group of one pair has no spread): their spread pooled, 8 degrees of freedom, and said; beside
    pairs that vary less, their own."""
    searched = {"wider": [1.30, 1.55, 1.20, 1.45], "narrower": [1.30, 1.31, 1.29, 1.30]}[theirs]
    recipe, _ = _yours(tmp_path, facts, YOURS, searched={"threads=1": searched, "one pair": [1.7]})
    logs, apart = [math.log(r) for r in YOURS], [math.log(r) for r in searched]
    if theirs == "wider":
        squares = sum((x - statistics.fmean(g)) ** 2 for g in (logs, apart) for x in g)
        half = 2.3060 * math.sqrt(squares / 8) / math.sqrt(6)  # t(8) at 97.5%
    else:
        half = 2.5706 * statistics.stdev(logs) / math.sqrt(6)
    assert recipe.speedup_low == pytest.approx(recipe.speedup * math.exp(-half), rel=1e-3)
    assert recipe.speedup_high == pytest.approx(recipe.speedup * math.exp(half), rel=1e-3)
    pooled = [n for n in recipe.notes if "pooled" in n]
    assert pooled == ([] if theirs == "narrower" else [
        "your runs: their spread pooled with that of the 4 fresh process pairs the search ran (1 setting(s); yours "
        "no larger than theirs at even odds; 8 degrees of freedom): a plain process that falls slow now and then may "
        "be missing from 6 pairs"]), recipe.notes
    assert all(how_measured(n) for n in pooled)


@pytest.mark.parametrize("case", ["three pairs asked", "interval reaches 1"])
def test_fewer_pairs_or_rounds_or_an_interval_reaching_one_is_provisional(tmp_path: Path, facts: Any,
                                                                           case: str) -> None:
    """Confirmed needs six pairs of your runs whose low bound is above 1 + the margin (and two confirmation rounds)."""
    ratios = [1.30, 0.95, 1.25, 1.02, 1.28, 0.97] if case == "interval reaches 1" else [1.18, 1.22, 1.20]
    clock = ReplayClock()
    stub = Yours(clock, _explored(), {"fast": FAST, "slow": SLOW}, ratios=list(ratios))
    recipe, _ = _search(tmp_path, facts, stub, 3600.0, clock, claim_pairs=3 if case == "three pairs asked" else None)
    assert recipe.claim == "provisional" and recipe.run_low is not None, recipe.notes
    said = " ".join(recipe.notes)
    why = {"three pairs asked": "3 process pairs, where confirmed takes 6",
           "interval reaches 1": "its interval in your processes reaches 1.02x"}[case]
    assert f"provisional: {why}" in said, said
    assert recipe.speedup_low is not None and (recipe.speedup_low > 1.02) == (case != "interval reaches 1")


@dataclass
class WideCalibration(Yours):
    """``Yours`` whose calibration's A/A reached 8% from 1: one worker's arms, which no process pair has."""

    def calibrate(self, timeout_s: float) -> Noise:
        return replace(super().calibrate(timeout_s), margin=0.08, aa=(1.0, 0.93, 1.08))


def test_your_runs_are_held_to_the_floor_not_to_one_workers_margin(tmp_path: Path, facts: Any) -> None:
    """Six process pairs reading 1.07x [1.03-1.11]: faster with confidence in fresh processes, confirmed, though the
    calibration's in-process margin was 8%."""
    clock = ReplayClock()
    stub = WideCalibration(clock, _explored(), {"fast": FAST, "slow": SLOW},
                           ratios=[1.10, 1.02, 1.12, 1.05, 1.09, 1.04])
    recipe, _ = _search(tmp_path, facts, stub, 3600.0, clock)
    assert recipe.speedup_low is not None and 1.02 < recipe.speedup_low < 1.08, recipe.notes
    assert recipe.claim == "confirmed", recipe.notes


@pytest.mark.parametrize("ratios", [[0.82, 0.85, 0.80, 0.86, 0.83, 0.81], [1.05, 0.92, 1.01, 0.95, 1.02, 0.97]])
def test_a_recipe_your_runs_do_not_read_faster_keeps_the_defaults(tmp_path: Path, facts: Any,
                                                                  ratios: list[float]) -> None:
    """The workers confirmed 1.41x; your runs read it slower (0.80-0.86x), or about even (mean 0.99x, its interval
    across 1.00x): never slower than the defaults, so they are kept."""
    recipe, _ = _yours(tmp_path, facts, ratios)
    assert (recipe.speedup, recipe.claim, recipe.process_pairs) == (1.0, "defaults", None), recipe.notes
    assert "not faster than the defaults there" in " ".join(recipe.notes)


@pytest.mark.parametrize("case", ["none asked", "a pair failed", "the budget's end", "a pair could not start",
                                  "Ctrl-C"])
def test_without_three_pairs_of_your_runs_the_recipe_is_provisional_and_says_why(tmp_path: Path, facts: Any,
                                                                                 case: str) -> None:
    """No interval of your runs from fewer than three pairs: the workers' interval is stated, named as theirs, and
    the recipe is provisional with the reason (a failed pair, the budget's end, --claim-pairs 0, a pair that could
    not start, Ctrl-C or SIGTERM after two pairs: the search then stops once the recipe is stored)."""
    ratios: list[float | None | BaseException] = {
        "a pair failed": [1.2, None], "a pair could not start": [1.2, OSError(12, "Cannot allocate memory")],
        "Ctrl-C": [1.2, 1.25, KeyboardInterrupt()]}.get(case, YOURS)
    # the confirmation's five rounds (10 s each: the fast one's three, the slow one's two, after which the race
    # leaves it out) and two pairs of 15 s fit
    budget_s = 50.0 + 2 * PAIR_S + 5.0 if case == "the budget's end" else 3600.0
    try:
        recipe, stub = _yours(tmp_path, facts, ratios, budget_s=budget_s,
                              claim_pairs=0 if case == "none asked" else None)
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C in your runs ended the confirmation without its recipe")
    assert (recipe.claim, recipe.run_low, recipe.speedup) == ("provisional", None, pytest.approx(1.41, abs=0.005))
    said = " ".join(recipe.notes)
    assert "not measured in processes of your training" in said and "the search's workers, 1.41x" in said, said
    why = {"none asked": "--claim-pairs 0", "a pair failed": "process pair 2 failed: the candidate worker's arm",
           "the budget's end": "the budget's end: 2 of 6 process pairs ran",
           "a pair could not start": "process pair 2 failed: OSError: [Errno 12] Cannot allocate memory",
           "Ctrl-C": "stopped after 2 process pairs (6 asked)"}[case]
    assert why in said, said
    assert recipe.claim_text == "provisional: not measured in processes of your training, 95% interval"


@pytest.mark.parametrize("case", ["the recipe's process failed", "each pair slower", "the defaults' process failed",
                                  "the recipe's process failed after five"])
def test_a_recipe_your_runs_saw_fail_or_run_slower_is_not_offered_on_the_workers_word(tmp_path: Path, facts: Any,
                                                                                    case: str) -> None:
    """Under three pairs the workers' interval is stated, provisional (above): not where two pairs or more each read
    it slower than the defaults; and where the recipe's own process of your training failed, at any count of pairs
    (it would be applied to your script with that error), nothing is offered. A failure of the defaults' process
    says nothing of the recipe."""
    ratios: list[float | None | BaseException | str] = {
        "the recipe's process failed": [1.2, "cand"], "each pair slower": [0.97, 0.93],
        "the defaults' process failed": [1.2, "base"],
        "the recipe's process failed after five": [1.3, 1.3, 1.3, 1.3, 1.3, "cand"]}[case]
    budget_s = 50.0 + 2 * PAIR_S + 5.0 if case == "each pair slower" else 3600.0
    recipe, stub = _yours(tmp_path, facts, ratios, budget_s=budget_s)
    said = " ".join(recipe.notes)
    if case == "the defaults' process failed":
        assert recipe.claim == "provisional" and "the search's workers, 1.41x" in said, said
        return
    assert (recipe.speedup, recipe.claim, recipe.process_pairs) == (1.0, "defaults", None), said
    why = {"the recipe's process failed": "its own process failed (process pair 2 failed: the recipe's run: crash",
           "the recipe's process failed after five": "its own process failed (process pair 6 failed: the recipe's",
           "each pair slower": "slower than the defaults in each of its 2 process pairs (0.97x, 0.93x)"}[case]
    assert why in said and "the recipe keeps the defaults" in said, said


class Charged(ReplayClock):
    """The scripted clock without real time: only what the stubs charge moves it."""

    def monotonic(self) -> float:
        return self.charged


@pytest.mark.parametrize(("start_s", "pair_s", "left_s", "ran"),
                         [(5.1, PAIR_S, 40.0, 5), (5.6, 13.0, 17.0, 4), (5.1, PAIR_S, 17.0, 3)])
def test_time_the_budget_kept_and_the_confirmation_left_runs_more_pairs_of_your_runs(
        tmp_path: Path, facts: Any, start_s: float, pair_s: float, left_s: float, ran: int) -> None:
    """A 2-minute budget asks 3 pairs (40% of it at a price of 15-16 s a pair); where the budget's end holds more once
    they ran, another runs while the time left is 1.2x the longest pair (their own time, not the price before them),
    up to six: 40 s left after pairs of 15 s hold 2 more, 17 s after pairs of 13 s one (the price, 16 s, would hold
    none), 17 s after pairs of 15 s none. Before, 3 ran and that time went unused."""
    clock = Charged()
    stub = Yours(clock, _explored(), {"fast": FAST, "slow": SLOW}, ratios=list(YOURS), start_s=start_s, pair_s=pair_s)
    recipe, _ = _search(tmp_path, facts, stub, 50.0 + 3 * pair_s + left_s, clock, budget_option=120.0)
    assert len(stub.asked) == ran and recipe.process_pairs == ran, recipe.notes
    said = " ".join(recipe.notes)
    assert recipe.claim == "provisional" and f"{ran} process pairs, where confirmed takes 6" in said, said
    assert "the budget's end" not in said, said


@pytest.mark.parametrize("offered", [True, False, "undecided"])
def test_the_claims_time_is_kept_once_a_candidate_could_be_offered(tmp_path: Path, facts: Any, offered: Any) -> None:
    """Six pairs priced at 15 s each (two processes: a start of 5.1 s, twice 4 windows of 0.3 s) are kept from the
    confirmation once a candidate's rounds clear the bar: the slow one's round that would eat them is left out, and
    all six pairs run. Where no candidate could be offered there is nothing to state, and the rounds use that time
    (a 3-minute demo left two candidates out for time that then went unused). A candidate whose first round did not
    clear the bar and whose two rounds' median does goes to your runs (``Confirmation.undecided``): their time is kept
    from then on (before, the rounds took it and four pairs ran, too few to decide it). The slow one's second round,
    which would leave that time short beside the top's later rounds (the top's first round read above the bar), is
    left out: the top gets its third (before, the slow one's second round took it)."""
    clock = ReplayClock()
    rounds = {True: {"fast": FAST, "slow": SLOW}, False: {"fast": BELOW, "slow": BELOW},
              "undecided": {"fast": [(1.08, 1.00, 1.16), (1.094, 1.01, 1.18), (1.151, 1.07, 1.24)], "slow": SLOW}}
    stub = Yours(clock, _explored(), rounds[offered], ratios=list(YOURS), start_s=5.1)
    recipe, records = _search(tmp_path, facts, stub, 40.0 + OVER * 6 * PAIR_S + 5.0, clock)
    made = len([r for r in records if r.role == "confirm"])
    said = " ".join(recipe.notes)
    if offered:
        # the pairs that decided a candidate its rounds could not state it: never said confirmed (see below)
        claim = "provisional" if offered == "undecided" else "confirmed"
        assert len(stub.asked) == 6 and recipe.claim == claim and made == 4, (made, said)
        assert "the budget was short: trial 2 from round 2 of 3 on left out" in said, said
        assert (offered == "undecided") == ("your runs decide it" in said), said
    else:
        assert not stub.asked and recipe.claim == "defaults" and made == 6, (made, said)


BELOW: list[tuple[float, float, float] | None] = [(0.99, 0.90, 1.08), (1.00, 0.91, 1.09), (1.01, 0.92, 1.10)]
# a recurrent model's three rounds on a Xeon (s44): 1.11x [1.02-1.20], straddling the 1.02x bar
STRADDLING: list[tuple[float, float, float] | None] = [(1.08, 1.04, 1.12), (1.094, 1.05, 1.14), (1.151, 1.10, 1.20)]


@pytest.mark.parametrize("case", ["they confirm it", "they do not", "two pairs ran", "five pairs ran",
                                  "a pair failed after three", "three pairs asked", "searched again"])
def test_a_candidate_whose_rounds_straddle_the_bar_is_decided_by_your_runs(tmp_path: Path, facts: Any,
                                                                         case: str) -> None:
    """Three rounds at 1.08, 1.09 and 1.15x read 1.11x [1.02-1.20]: its low bound not above the 1.02x bar, its median
    above. Before, the defaults were kept and the time kept for your runs went unused (34 s of a 2-minute recurrent
    search); now your runs' fresh pairs decide it: offered where six read it faster with confidence, provisional (the
    pairs that decided it state it, said so); where the budget's end left three to five that do too (a 2-minute
    transformer search kept the defaults where five read 1.08x [1.06-1.09]); where they do not, or fewer ran, the
    defaults are kept. Where fewer than six are asked they could not confirm it: none runs. The study searched again
    tests it no second time: the pairs it stored stand."""
    confirming = [1.13, 1.10, 1.15, 1.12, 1.09, 1.14]
    not_confirming = [1.06, 0.98, 1.09, 1.01, 1.05, 0.99]
    ratios = {"they confirm it": confirming, "they do not": not_confirming, "two pairs ran": YOURS,
              "five pairs ran": confirming, "a pair failed after three": [*confirming[:3], None],
              "three pairs asked": YOURS, "searched again": not_confirming}[case]
    clock = ReplayClock()
    stub = Yours(clock, _explored(), {"fast": STRADDLING, "slow": BELOW}, ratios=list(ratios))
    ran = {"two pairs ran": 2, "five pairs ran": 5}.get(case)
    budget_s = 60.0 + ran * PAIR_S + 5.0 if ran else 3600.0
    recipe, _ = _search(tmp_path, facts, stub, budget_s, clock, claim_pairs=3 if case == "three pairs asked" else None)
    said = " ".join(recipe.notes)
    if case == "three pairs asked":
        assert not stub.asked and (recipe.speedup, recipe.claim) == (1.0, "defaults"), said
        assert "best candidate (trial 1) 1.11x [1.02-1.20]: not faster with confidence" in said, said
        return
    if case == "searched again":  # the first search's six pairs did not confirm it
        assert (recipe.claim, len(stub.asked)) == ("defaults", 6), said
        stub = Yours(clock, _explored(), {"fast": STRADDLING, "slow": BELOW}, ratios=list(confirming))
        recipe, _ = _search(tmp_path, facts, stub, budget_s, clock)
        said = " ".join(recipe.notes)
        assert not stub.asked and "6 pair(s) from an earlier search of this study, which tested it" in said, said
        assert (recipe.speedup, recipe.claim) == (1.0, "defaults"), said
        return
    assert "trial 1's rounds could not decide it (its low bound not above 1.02x" in said, said
    assert stub.asked and all(params == stub.asked[0] for params in stub.asked), stub.asked
    if case in ("they confirm it", "five pairs ran"):
        # offered because their interval cleared the bar, the pairs that decided it state it: provisional, said why
        pairs = 6 if case == "they confirm it" else 5
        assert (recipe.claim, recipe.process_pairs, recipe.params) == ("provisional", pairs, stub.asked[0]), said
        assert recipe.speedup_low is not None and 1.02 < recipe.speedup_low < 1.11 < recipe.speedup, said
        assert (case == "five pairs ran") == ("provisional: 5 process pairs, where confirmed takes 6" in said), said
        assert "the pairs that decided it state it (where its gain lies near the bar, their interval leans high" \
            in said and "which decide it)" in said, said
    else:
        assert (recipe.speedup, recipe.claim, recipe.process_pairs) == (1.0, "defaults", None), said
        why = {"they do not": "your runs did not confirm trial 1 (its interval in your processes reaches 1.02x)",
               "two pairs ran": "your runs could not decide trial 1 (the budget's end: 2 of 6",
               # three read it faster, then a pair failed: only a confirmation offers it then
               "a pair failed after three": "your runs did not confirm trial 1 (3 process pairs, where confirmed"}[case]
        assert why in said, said


# a 2-minute demo's combined recipe on a Xeon (s53): 2.95x then 2.30x, its third round left for time; and bf16 with
# channels_last in one round, 2.13x [2.12-2.19], whose round was measured where the combined one's third was not
TWO_ROUNDS: list[tuple[float, float, float] | None] = [(2.95, 2.57, 3.40), (2.30, 1.96, 2.71), (2.60, 2.40, 2.80)]
ONE_ROUND: list[tuple[float, float, float] | None] = [(2.13, 2.12, 2.19), (2.10, 2.05, 2.15), (2.12, 2.08, 2.16)]


@pytest.mark.parametrize("case", ["they confirm it", "they do not", "they do not, its own pairs fit",
                                  "its median is lower"])
def test_a_higher_candidate_whose_rounds_straddle_is_decided_before_a_one_round_offer(
        tmp_path: Path, facts: Any, case: str) -> None:
    """Trial 1 read 2.95x and 2.30x in its two rounds, 2.61x [0.53-12.73] (one degree of freedom), and its third did not
    fit; trial 2 read 2.13x [2.12-2.19] in its one round, which did. Before, trial 2 went to your runs and was offered
    provisional, and trial 1 was never looked at: the user got 1.93x. Now your runs decide the higher one first: offered
    (provisional: the pairs that decided it state it) where six read it faster with confidence. Where they do not, trial
    2's own pairs follow where the budget's end holds three of them, and state it as before; where it does not, trial 2
    is offered as its one round read it, provisional, its interval the workers' (as a budget too short for your runs
    states it), never from the pairs of another recipe. A straddling candidate whose median is below the one-round
    offer's leaves it as it was."""
    lower = [(2.20, 1.90, 2.55), (1.90, 1.65, 2.20), (2.00, 1.80, 2.20)]
    rounds = {"fast": lower if case == "its median is lower" else TWO_ROUNDS, "slow": ONE_ROUND}
    confirming, not_confirming = [2.55, 2.62, 2.48, 2.70, 2.58, 2.51], [1.06, 0.98, 1.09, 1.01, 1.05, 0.99]
    its_own = [1.95, 1.88, 2.02, 1.91, 1.97, 1.85]  # trial 2's own pairs
    ratios = {"they confirm it": confirming, "they do not": not_confirming,
              "they do not, its own pairs fit": not_confirming + its_own, "its median is lower": its_own}[case]
    clock = ReplayClock()
    # pairs priced at 15 s; where trial 2's own fit, they take 6 s: six of trial 1 leave 63 s of the 99 kept
    stub = Yours(clock, _explored(), rounds, ratios=list(ratios), start_s=5.1,
                 pair_s=6.0 if case == "they do not, its own pairs fit" else PAIR_S)
    # round 1 of both (20 s), then six pairs of 15 s kept (10% over): trial 2's second round and trial 1's third do
    # not fit
    recipe, found = _search(tmp_path, facts, stub, 20.0 + OVER * 6 * PAIR_S + 15.0, clock)
    rounds_of = {n: len([r for r in found if r.role == "confirm" and r.result.status.value == "ok"
                         and r.params == found[n].params]) for n in (1, 2)}
    said = " ".join(recipe.notes)
    assert rounds_of == {1: 2, 2: 1} and len(stub.asked) == len(ratios), (rounds_of, said)
    if case == "its median is lower":
        assert all(params == found[2].params for params in stub.asked) and recipe.params == found[2].params, said
        assert (recipe.claim, recipe.process_pairs) == ("provisional", 6) and "could not decide" not in said, said
        return
    assert all(params == found[1].params for params in stub.asked[:6]), said
    assert "trial 1's rounds could not decide it (its low bound not above 1.02x, its median above, and above " \
           "trial 2's 2.13x of one round): your runs decide it" in said, said
    if case == "they confirm it":
        assert (recipe.params, recipe.claim, recipe.process_pairs) == (found[1].params, "provisional", 6), said
        assert recipe.speedup_low is not None and 2.4 < recipe.speedup_low < recipe.speedup < 2.7, said
        return
    assert (recipe.params, recipe.claim) == (found[2].params, "provisional"), said
    assert "your runs did not confirm trial 1 (its interval in your processes reaches 1.02x), nor could its " \
           "rounds: the recipe offers trial 2" in said and "the recipe keeps the defaults" not in said, said
    if case == "they do not":
        assert (recipe.speedup, recipe.speedup_low, recipe.speedup_high) == (2.13, 2.12, 2.19), said
        assert recipe.process_pairs is None and recipe.run_low is None, said
        assert "your runs tested trial 1): the stated interval is trial 2's confirmation in the search's " \
               "workers" in said, said
    else:  # stated from its own six pairs, as before
        assert all(params == found[2].params for params in stub.asked[6:]), said
        assert recipe.process_pairs == 6 and recipe.speedup == pytest.approx(statistics.geometric_mean(its_own),
                                                                             rel=0.02), said
        assert "your runs (trial 2, 6 fresh process pairs" in said, said


def test_a_test_your_runs_made_stands_in_a_study_searched_again_also_where_another_recipe_was_stated() -> None:
    """Where the candidate the rounds could not decide was tested first and not confirmed, the recipe's own pairs
    are the study's ``user_runs``; the test is kept apart (``tested_runs``), and a search of the study again draws
    it from there, not fresh pairs (a second chance), and never from another trial's pairs or a value not a number."""
    import optuna

    from autotune.study.claim import _tested

    study = optuna.create_study()
    study.set_user_attr("user_runs", {"trial": 2, "ratios": [1.9, 2.0, 1.95], "run_s": 2.0})
    study.set_user_attr("tested_runs", {"trial": 1, "ratios": [1.06, 0.98, 1.09], "run_s": 2.0})
    assert [p.ratio for p in _tested(study, 1)] == [1.06, 0.98, 1.09]
    assert [p.ratio for p in _tested(study, 2)] == [1.9, 2.0, 1.95] and _tested(study, 3) == []
    study.set_user_attr("tested_runs", {"trial": 1, "ratios": ["1.06"], "run_s": 2.0})
    assert _tested(study, 1) == []


def _printed(recipe: Any, found: list[Any]) -> str:
    """What ``autotune search`` prints after the search (``cli.search``): its table, claim, noise and notes."""
    import io

    from rich.console import Console

    from autotune.cli.search import _print_outcome
    from autotune.study import SearchOutcome

    baseline = next(r for r in found if r.role == "baseline")
    best = next(r for r in found if r.number == 1)  # the fast recipe, the confirmation's choice
    printed = io.StringIO()
    outcome = SearchOutcome("cut", recipe, baseline, best, found, "trials", 60.0)
    _print_outcome(Console(file=printed, width=300), outcome)
    return printed.getvalue()


@pytest.mark.parametrize("case", ["confirmed", "three pairs asked"])
def test_the_summary_says_the_claim_once_and_each_problem_on_a_line(tmp_path: Path, facts: Any, case: str) -> None:
    """The summary's notes are what a user acts on: the claim and a run's range are their own lines, a provisional
    recipe's reasons one note; how each figure was measured (the rounds, your runs, where the time went) stays in the
    recipe for ``autotune best``, counted in one line. Before, the summary printed every note."""
    clock = ReplayClock()
    stub = Yours(clock, _explored(), {"fast": FAST, "slow": SLOW}, ratios=list(YOURS))
    asked = 3 if case == "three pairs asked" else None
    recipe, found = _search(tmp_path, facts, stub, 3600.0, clock, claim_pairs=asked)
    text = _printed(recipe, found)
    notes = [line for line in text.splitlines() if line.startswith("note: ")]
    how = sum(how_measured(n) for n in recipe.notes)
    assert how >= 3 and f"{how} note(s) on how these figures were measured: autotune best" in text, recipe.notes
    assert f"over PyTorch defaults ({recipe.claim_text})" in text and f"{recipe.run_text}" in text, text
    if case == "confirmed":
        assert notes == [], notes
    else:
        assert len(notes) == 1 and notes[0].startswith(
            "note: the recipe is provisional: 3 process pairs, where confirmed takes 6"), notes


# a 5-minute replayed search of the Xeon's environment grid (s57, seed 0): the combination with tcmalloc read 2.43x
# and 2.92x in its two rounds, [0.84-8.47]; bf16 + channels_last with one interop thread 2.26x and 2.06x, [1.21-3.85],
# and was offered (its verified truth 1.93x, the combination's 2.72x)
APART = [(2.434, 2.20, 2.70), (2.919, 2.60, 3.25), (2.60, 2.40, 2.80)]
AGREEING = [(2.258, 2.10, 2.42), (2.061, 1.92, 2.21), (2.15, 2.00, 2.30)]


@pytest.mark.parametrize("case", ["they confirm it", "they do not", "the budget holds one claim",
                                  "they do not, and took longer than priced",
                                  "too few to confirm it, faster"])
def test_a_faster_candidate_whose_two_rounds_straddle_is_decided_before_a_two_round_offer(
        tmp_path: Path, facts: Any, case: str) -> None:
    """Trial 1's two rounds were far apart, trial 2's close: trial 2's low bound cleared the bar, trial 1's did not,
    and trial 2 was offered though trial 1's median was 24% above it. Now your runs decide trial 1 first where the
    budget holds its six pairs and then trial 2's six: offered (provisional) where they read it faster with confidence;
    else trial 2 is stated from its own six pairs, as it would have been. Where the budget holds one claim's pairs,
    no test: the offer confirmed over two rounds keeps its six. Where the test's pairs took longer than priced and
    none of trial 2's fit after them, trial 2 is stated as its rounds read it, provisional: rounds alone never
    state "confirmed"; so it is where the budget's end left the test fewer than six pairs, though they read trial 1
    faster: beside an offer, only a confirmation displaces it."""
    confirming, not_confirming = [2.55, 2.62, 2.48, 2.70, 2.58, 2.51], [1.06, 0.98, 1.09, 1.01, 1.05, 0.99]
    its_own = [1.95, 1.88, 2.02, 1.91, 1.97, 1.85]  # trial 2's own pairs
    ratios = {"they confirm it": confirming, "they do not": not_confirming + its_own,
              "the budget holds one claim": its_own, "they do not, and took longer than priced": not_confirming,
              "too few to confirm it, faster": confirming}[case]
    clock = ReplayClock()
    stub = Yours(clock, _explored(), {"fast": APART, "slow": AGREEING}, ratios=list(ratios), start_s=5.1,
                 pair_s={"they do not, and took longer than priced": 25.0,
                         "too few to confirm it, faster": 36.0}.get(case, PAIR_S))
    kept = 6 if case == "the budget holds one claim" else 12  # pairs the budget holds after two rounds of each
    recipe, found = _search(tmp_path, facts, stub, 40.0 + OVER * kept * PAIR_S + 10.0, clock, rounds=2)
    said = " ".join(recipe.notes)
    if case == "too few to confirm it, faster":  # the budget's end left the test short: the offer stands
        assert 3 <= len(stub.asked) < 6 and all(params == found[1].params for params in stub.asked), said
        assert (recipe.params, recipe.claim) == (found[2].params, "provisional"), said
        return
    assert len(stub.asked) == len(ratios), said
    if case == "the budget holds one claim":
        assert all(params == found[2].params for params in stub.asked) and "could not decide" not in said, said
        assert (recipe.params, recipe.claim, recipe.process_pairs) == (found[2].params, "confirmed", 6), said
        return
    assert all(params == found[1].params for params in stub.asked[:6]), said
    assert "trial 1's rounds could not decide it (its low bound not above 1.02x, its median above, and above " \
           "trial 2's 2.16x of 2 rounds, by more than 3%): your runs decide it" in said, said
    if case == "they confirm it":
        assert (recipe.params, recipe.claim, recipe.process_pairs) == (found[1].params, "provisional", 6), said
        return
    if case == "they do not, and took longer than priced":
        assert (recipe.params, recipe.claim, recipe.process_pairs) == (found[2].params, "provisional", None), said
        assert "the recipe offers trial 2 on its 2 confirmation rounds" in said, said
        assert "your runs tested trial 1): the stated interval is trial 2's confirmation in the search's workers; " \
               "the recipe is provisional" in said, said
        return
    assert all(params == found[2].params for params in stub.asked[6:]), said
    assert (recipe.params, recipe.claim, recipe.process_pairs) == (found[2].params, "confirmed", 6), said
    assert recipe.speedup == pytest.approx(statistics.geometric_mean(its_own), rel=0.02), said


def test_a_lower_candidates_round_leaves_the_claims_time_the_top_may_need_beside_its_rounds(
        tmp_path: Path, facts: Any) -> None:
    """The top candidate read 1.15x [0.95-1.40] in its first round: nothing offerable yet (so the claim's time is not
    held), but more likely than not its next round makes it a candidate your runs decide. Before, the second's first
    round was admitted beside the top's later rounds without the claim's time; its second, measured first in round 2
    (seed 0's draw), read its two rounds' median above the bar, the claim's 90 s were held, and the top's round 2 was
    left out: your runs tested the second. A replayed 2-minute GRU search confirmed an in-process bf16 at 1.04x so
    while the heuristic's 1.12x kept one round. Now the second's round, which would leave the claim's time short
    beside the top's rounds, is left out, and the top gets its second round and your runs."""
    clock = ReplayClock()
    rounds = {"fast": [(1.15, 0.95, 1.40), (1.30, 1.10, 1.50), (1.25, 1.05, 1.45)],
              "slow": [(1.06, 1.00, 1.12), (1.05, 0.99, 1.11), (1.04, 0.98, 1.10)]}
    explored = _explored()
    explored[1] = replace(explored[1], speedup_low=0.90, speedup_high=1.90)  # neither may be offered before a round
    explored[2] = replace(explored[2], speedup_low=0.90, speedup_high=1.60)
    stub = Yours(clock, explored, rounds, ratios=list(YOURS), start_s=5.1)
    recipe, found = _search(tmp_path, facts, stub, 10.0 + 100.0, clock)  # the top's first round, then 100 s
    said = " ".join(recipe.notes)
    assert stub.order == ["fast", "fast"], (stub.order, said)
    assert "the budget was short: trial 2 from round 1 of 3 on" in said, said
    assert stub.asked and all(params == found[1].params for params in stub.asked), said
    assert recipe.params == found[1].params, said


def test_a_candidate_with_no_round_left_holds_no_claims_time_from_one_below(tmp_path: Path, facts: Any) -> None:
    """With one confirmation round, the top candidate's round (1.05x [0.97-1.13]) can make it nothing more: no second
    round follows to go to your runs. Read as one that may go there next, it held the claim's time from the second's
    only round (1.30x [1.25-1.35]), which was left out while that time went unused."""
    clock = ReplayClock()
    rounds = {"fast": [(1.05, 0.97, 1.13)], "slow": [(1.30, 1.25, 1.35)]}
    stub = Yours(clock, _explored(), rounds, ratios=list(YOURS), start_s=5.1)
    recipe, _ = _search(tmp_path, facts, stub, 10.0 + 50.0, clock, rounds=1)
    assert stub.order == ["fast", "slow"], (stub.order, " ".join(recipe.notes))


def test_an_interrupt_in_your_runs_stops_the_search_once_the_recipe_is_stored(tmp_path: Path, facts: Any) -> None:
    """Ctrl-C or SIGTERM in the third pair of your runs: the recipe the confirmation and the two pairs state is
    stored, then the search raises it; before, it stopped with nothing stored."""
    from autotune.store import RecipeStore

    from .test_race import SPEED, Scripted, _batch_alone, _search

    class Stopped(Scripted):
        user_processes = True

        def user_pair(self, params: dict[str, Any], seed: int, timeout_s: float) -> RunPair:
            self.ran = getattr(self, "ran", 0) + 1
            if self.ran > 2:
                raise KeyboardInterrupt
            return RunPair(SPEED[64], 2.0, 4.0, 1000.0 * SPEED[64], 1000.0)

    with pytest.raises(KeyboardInterrupt):
        _search(tmp_path, Stopped(), study="stopped", fixed=_batch_alone(facts), trials=5, confirm_top=1)
    with RecipeStore.open(f"sqlite:///{tmp_path}/studies.db", readonly=True) as store:
        recipe = store.latest()
    assert recipe is not None and any("stopped after 2 process pairs" in n for n in recipe.notes), recipe
