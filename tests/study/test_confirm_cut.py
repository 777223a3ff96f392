"""A gain found and confirmed is never thrown away because the budget ran out (issue 55): a confirmation round the
budget's end stops is cut, not the candidate's failure, and the rounds that completed decide; a candidate that stops
answering while time remains still fails. On a scripted clock (``ReplayClock``: no sleeping) and a stubbed pair."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest

from autotune import search_spaces as spaces
from autotune.measure import Noise
from autotune.measure.stats import Interval
from autotune.study import Budget
from autotune.study.choice import choose_recipe, how_measured
from autotune.study.confirm import Rounds, confirm
from autotune.study.loop import SearchLoop
from autotune.study.options import SearchOptions
from autotune.study.records import CONFIRM, params_key, records
from autotune.testing.replay import ReplayClock
from autotune.trial.spec import Status, TrialResult

from ..stubs import StubMeasurer

ROUND_S = 10.0  # what a confirmation round of the stubbed pair takes on the scripted clock


@dataclass
class Round:
    params: dict[str, Any]
    timeout_s: float
    number: int


@dataclass
class Stubbed(StubMeasurer):
    """A measurer whose search trials are results at once (the first: the defaults), and whose confirmation rounds
    read ``rounds[trial][i]`` (a median, low, high; or a crash) after ``ROUND_S`` on the clock; a round of ``hang``
    never answers: the clock runs to its time limit and the worker's reply is the live measurer's timeout."""

    clock: ReplayClock
    search: list[TrialResult]
    rounds: dict[str, list[tuple[float, float, float] | None]]
    hang: tuple[str, int] | None = None
    confirming: bool = False
    begun: dict[str, int] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # the confirmation's rounds as begun
    round_start_s: float = 0.0  # the first candidate measured in a round starts the defaults' worker: this long
    paid: set[int] = field(default_factory=set)  # the rounds whose worker was started
    round_s: dict[str, float] = field(default_factory=dict)  # a candidate's own round time, where not ROUND_S

    def __post_init__(self) -> None:
        StubMeasurer.__init__(self)

    def calibrate(self, timeout_s: float) -> Noise:
        return Noise(window_s=0.3, pairs=8, half_width=0.03, margin=0.02, spread=0.04, aa=(1.0, 0.99, 1.01))

    def reseed(self, seed: int) -> None:
        self.confirming = True

    def begin(self, params: dict[str, Any], timeout_s: float) -> object:
        if not self.confirming:  # the search's trials, in turn: the defaults, the fast one, the slow one
            self.names.setdefault(params_key(params), ("defaults", "fast", "slow")[len(self.names)])
            return self.search.pop(0)
        name = self.names[params_key(params)]
        self.begun[name] = self.begun.get(name, 0) + 1
        self.order.append(name)
        return Round(params, timeout_s, self.begun[name] - 1)

    def more(self, handle: Any, n: int, timeout_s: float, confidence: float = 0.95) -> Interval:
        return Interval(1.0, 0.9, 1.1, confidence, n)

    def end(self, handle: Any) -> TrialResult:
        name = self.names[params_key(handle.params)]
        if self.hang == (name, handle.number):
            self.clock.charge(handle.timeout_s)
            return TrialResult(Status.TIMEOUT, error="the paired worker did not answer RunPairs within 1 s; stopped",
                               wall_s=handle.timeout_s)
        start = 0.0 if handle.number in self.paid else self.round_start_s
        self.paid.add(handle.number)
        took = self.round_s.get(name, ROUND_S) + start
        self.clock.charge(took)
        read = self.rounds[name][handle.number]
        if read is None:
            return TrialResult(Status.CRASH, error="the paired worker exited with 1", wall_s=ROUND_S)
        median, low, high = read
        return TrialResult(Status.OK, objective=median, speedup_low=low, speedup_high=high, pairs=8,
                           samples_per_s=100 * median, baseline_samples_per_s=100.0, loss=1.0, wall_s=took,
                           timed_s=ROUND_S / 2, method="in-process pairs", startup_s=start or None)

    def close(self) -> None:
        pass


def _search(tmp_path: Path, facts: Any, stub: Stubbed, budget_s: float, clock: ReplayClock, rounds: int = 3,
            claim_pairs: int | None = None, budget_option: float | None = None) -> Any:
    """Explore (the defaults; then, as the loop takes seeds and samples, trial 1 at 1.64x [1.50-1.80] and trial 2 at
    1.20x [1.10-1.30]), confirm 3 rounds of both with ``budget_s`` left on the clock, and choose the recipe."""
    ctx = spaces.SpaceContext(default_batch_size=32, conv=True)
    run = {"device": "cpu", "reference_batch": 32}
    base = {**spaces.defaults(facts, ctx), **run}
    # the third seed is reached where the sampler's in-process trial repeats a measured recipe (a duplicate takes the
    # sampled turn): a seed the space can ask, and a seeded sampler, so the search is the same every run
    loader = {"num_workers": 1, "persistent_workers": True, "prefetch_factor": 2}
    seeds = [("baseline", base), ("seed", {**base, "channels_last": True}), ("seed", {**base, **loader})]
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    study = optuna.create_study(storage=url, study_name="cut", direction="maximize",
                                sampler=optuna.samplers.TPESampler(seed=0), load_if_exists=True)
    options = SearchOptions(storage=url, trials=3, budget_s=budget_option, confirm_top=2, confirm_rounds=rounds,
                            claim_pairs=claim_pairs)
    loop = SearchLoop(study, "tiny", facts, ctx, run, options, budget=Budget(clock.monotonic() + 1e6, clock.monotonic),
                      notify=lambda event: None, seeds=seeds, measurer=stub)
    assert loop.run() == "trials"
    loop.budget.deadline = clock.monotonic() + budget_s
    confirmation = confirm(loop)
    recipe = choose_recipe(study, "tiny", facts, "cut", confirmation)[0]
    return recipe, records(study)


def _explored() -> list[TrialResult]:
    ok = {"status": Status.OK, "loss": 1.0, "pairs": 8, "wall_s": 5.0, "timed_s": 2.5, "method": "in-process pairs"}
    return [TrialResult(**{**ok, "method": None}, objective=1.0, speedup_low=0.99, speedup_high=1.01,
                        samples_per_s=100.0),
            TrialResult(**ok, objective=1.64, speedup_low=1.50, speedup_high=1.80, samples_per_s=164.0),
            TrialResult(**ok, objective=1.20, speedup_low=1.10, speedup_high=1.30, samples_per_s=120.0)]


FAST: list[tuple[float, float, float] | None] = [(1.40, 1.30, 1.50), (1.42, 1.33, 1.52), (1.41, 1.30, 1.50)]
SLOW: list[tuple[float, float, float] | None] = [(1.05, 0.95, 1.15), (1.02, 0.92, 1.12), (1.04, 0.94, 1.14)]


@pytest.mark.parametrize("other", ["not confirmed", "failed"])
def test_a_round_the_budget_cuts_is_no_failure_and_the_completed_rounds_decide(
        tmp_path: Path, facts: Any, other: str) -> None:
    """Trial 1's third round is the last of the budget: its worker does not answer until the deadline stops
    it. It is offered on its two completed rounds' interval (not the search's 1.64x [1.50-1.80]), the cut round
    named, whether the other candidate was confirmed (below the bar) or failed."""
    clock = ReplayClock()
    stub = Stubbed(clock, _explored(), {"fast": FAST, "slow": SLOW if other == "not confirmed" else [None]},
                   hang=("fast", 2))
    # rounds 1 and 2 of both (or of trial 1 alone after trial 2's crash) take 10 s each; its round 3 starts
    # with 15 s left (its price: its rounds took 10 s) and is cut there, short of its own limit of 60 s
    measured = 4 if other == "not confirmed" else 3
    recipe, recs = _search(tmp_path, facts, stub, measured * ROUND_S + 15.0, clock)
    rounds = [r for r in recs if r.role == CONFIRM]
    cut = [r for r in rounds if r.result.status == Status.CUT]
    # 15 s on the scripted clock, less the real seconds the study's writes took
    assert len(cut) == 1 and re.match(r"cut by the budget's end after 1[0-5] s \(its own limit: 60 s\)",
                                      cut[0].result.error), cut
    assert not [r for r in rounds if r.result.status == Status.TIMEOUT]
    assert recipe.params == recs[1].params, recipe.notes  # the fast one
    assert (recipe.speedup_low, recipe.speedup_high) != (1.50, 1.80)
    assert recipe.speedup == pytest.approx((FAST[0][0] * FAST[1][0]) ** 0.5, rel=1e-3)
    said = " ".join(recipe.notes)
    assert "trial 1's round 3 of 3 cut by the budget's end" in said and "over 2 rounds of fresh processes" in said
    assert (recipe.claim, recipe.confidence) == ("confirmed", 0.95)


def test_each_confirmation_round_measures_its_candidates_in_an_order_drawn_again(tmp_path: Path, facts: Any) -> None:
    """Three rounds of both candidates with an hour left: each round measures both, and not always the top-ranked
    first (a worker's speed drifts with its age: a fixed order gave the same candidate the same moment of every
    round); the order is the seed's, the same in every search of it."""
    clock = ReplayClock()
    stub = Stubbed(clock, _explored(), {"fast": FAST, "slow": FAST})  # alike: neither leaves the later rounds
    recipe, _ = _search(tmp_path, facts, stub, 3600.0, clock)
    rounds = [tuple(stub.order[i:i + 2]) for i in (0, 2, 4)]
    assert len(stub.order) == 6 and all(sorted(r) == ["fast", "slow"] for r in rounds), stub.order
    assert rounds == [("fast", "slow"), ("slow", "fast"), ("slow", "fast")]  # seed 0's draws: not one order
    assert recipe.claim == "confirmed" and recipe.speedup == pytest.approx((1.40 * 1.42 * 1.41) ** (1 / 3), rel=1e-3)


def test_a_candidate_measured_after_another_of_its_environment_is_priced_without_the_workers_start(
        tmp_path: Path, facts: Any) -> None:
    """The first candidate of a round starts the defaults' worker (6 s here) and its round takes 16 s, the next one's
    10. A live 2-minute transformer search measured bf16 first in round 1 (8.1 s, the start in it), the second-ranked
    first in round 2, then priced bf16's round 2 with the start it had paid in round 1 and left it out for time:
    the recipe was the second's 1.10x. Round 2 here begins with 30 s: the second-ranked's round with the start (16 s),
    then the fastest's without it (10 s): both run."""
    clock = ReplayClock()
    stub = Stubbed(clock, _explored(), {"fast": FAST, "slow": SLOW}, round_start_s=6.0)
    recipe, recs = _search(tmp_path, facts, stub, (16.0 + 10.0) + 30.0, clock, rounds=2)
    assert stub.order == ["fast", "slow", "slow", "fast"], (stub.order, recipe.notes)  # seed 0's draws
    assert recipe.params == recs[1].params and "left out" not in " ".join(recipe.notes), recipe.notes


TWO_SPEEDS = {"fast": 30.0, "slow": 5.0}  # trial 1, ranked first, takes 30 s a round; trial 2 5 s
SURE = [(1.30, 1.24, 1.36), (1.32, 1.26, 1.38), (1.31, 1.25, 1.37)]


def test_a_cheap_candidate_keeps_its_rounds_beside_an_expensive_one_s_that_fit(tmp_path: Path, facts: Any) -> None:
    """72 s are left at the confirmation's start. After trial 1's first round, 42 s hold one more round of it, not
    two: only the one that fits keeps its time, so trial 2 has its rounds beside it. Trial 1's two rounds disagree
    (1.35x, then 1.05x) and trial 2's agree at 1.30x: the recipe is trial 2's, confirmed. Before, trial 1's third
    round, which could not fit either, kept trial 2 out of every round and the defaults were kept."""
    clock = ReplayClock(frozen=True)
    stub = Stubbed(clock, _explored(), {"fast": [(1.35, 0.86, 2.10), (1.05, 0.80, 1.40), FAST[2]], "slow": SURE},
                   round_s=TWO_SPEEDS)
    recipe, recs = _search(tmp_path, facts, stub, 72.0, clock)
    assert stub.order == ["fast", "slow", "slow", "fast"], (stub.order, recipe.notes)  # seed 0's draws
    assert recipe.params == recs[2].params and recipe.claim == "confirmed", recipe.notes


def test_a_round_of_a_candidate_above_that_fits_keeps_its_time(tmp_path: Path, facts: Any) -> None:
    """68 s: trial 2's first round fits beside trial 1's second (38 s left, 36.5 asked: its own estimated 6.5 s
    beside trial 1's measured 30), its second round does not (33 s left, 35 asked): it gives way, and trial 1's
    second round is measured. A rule that kept no time for the rounds above would have measured trial 2 and cut
    trial 1's."""
    clock = ReplayClock(frozen=True)
    stub = Stubbed(clock, _explored(), {"fast": FAST, "slow": SURE}, round_s=TWO_SPEEDS)
    recipe, _ = _search(tmp_path, facts, stub, 68.0, clock)
    assert stub.order == ["fast", "slow", "fast"], (stub.order, recipe.notes)
    assert "trial 2 from round 2 of 3 on" in " ".join(recipe.notes), recipe.notes


def test_a_round_not_measured_yet_counts_its_estimate_beside_a_measured_one(tmp_path: Path, facts: Any) -> None:
    """Two rounds, 63 s: after trial 1's first round (30 s), 33 s are left. Trial 2's first round, not measured yet,
    is priced at its own estimated 6.5 s beside trial 1's measured 30: it does not fit, and trial 1's second round is
    measured. Priced at nothing beside the measured round (before), trial 2's took 5 s and trial 1's second round
    no longer fitted."""
    clock = ReplayClock(frozen=True)
    stub = Stubbed(clock, _explored(), {"fast": FAST, "slow": SURE}, round_s=TWO_SPEEDS)
    recipe, _ = _search(tmp_path, facts, stub, 63.0, clock, rounds=2)
    assert stub.order == ["fast", "fast"], (stub.order, recipe.notes)


def test_the_rounds_above_keep_their_time_in_rank_order_each_candidate_s_while_they_fit() -> None:
    """``Rounds.fitting`` on additive prices: the rounds of trial 1 (ranked first, 10 s each) before trial 2's (5 s),
    as a lower round gives way to every round of those above; and none of a candidate's rounds after one that does
    not fit (it is left out of the rest), while a lower candidate's that fit still count."""
    first, second = SimpleNamespace(number=1), SimpleNamespace(number=2)
    rounds = Rounds.__new__(Rounds)
    rounds.needed_s = lambda entries: sum({1: 10.0, 2: 5.0}[e.number] for e, _ in entries)
    later = [(first, 0), (first, 1), (second, 0), (second, 1)]
    assert rounds.fitting(later, 20.0) == [(first, 0), (first, 1)]  # by round then rank: trial 1's second is lost
    assert rounds.fitting(later, 27.0) == [(first, 0), (first, 1), (second, 0)]
    rounds.needed_s = lambda entries: sum({1: 30.0, 2: 5.0}[e.number] for e, _ in entries)
    assert rounds.fitting(later, 12.0) == [(second, 0), (second, 1)]
    rounds.needed_s = lambda entries: 0.5 * len(entries)
    assert rounds.fitting(later, 0.8) == []  # a round is priced a second at least, as ``measure`` asks


def test_a_confirmation_that_completed_no_round_keeps_the_defaults_and_says_why(tmp_path: Path, facts: Any) -> None:
    """5 s left, each round 10 s: no round starts. The search's own 1.64x [1.50-1.80] (an early-stopped in-process
    interval) is not offered: the defaults are kept, with the confirmation's reason (before: offered at 1.64x)."""
    clock = ReplayClock()
    recipe, recs = _search(tmp_path, facts, Stubbed(clock, _explored(), {"fast": FAST, "slow": SLOW}), 5.0, clock)
    assert not [r for r in recs if r.role == CONFIRM and r.result.status == Status.OK]
    assert recipe.params == recs[0].params and (recipe.speedup, recipe.claim) == (1.0, "defaults"), recipe.notes
    said = " ".join(recipe.notes)
    assert "the budget was short" in said and "no candidate completed a confirmation round" in said, said


def test_where_no_candidate_read_above_the_bar_the_note_says_so_not_that_the_budget_was_short(
        tmp_path: Path, facts: Any) -> None:
    """The search keeps time for its contenders' rounds only (``reserve.reserve_s``). A 3-minute GRU search whose
    candidates read 1.01-1.02x kept none, ran to its end, and its note blamed the budget ("the budget was short") for
    what was a reading: none was worth a round. The defaults are kept either way; the note says why."""
    ok = {"status": Status.OK, "loss": 1.0, "pairs": 8, "wall_s": 5.0, "timed_s": 2.5, "method": "in-process pairs"}
    flat = [_explored()[0], TrialResult(**ok, objective=1.01, speedup_low=0.96, speedup_high=1.08, samples_per_s=101.0),
            TrialResult(**ok, objective=1.00, speedup_low=0.95, speedup_high=1.06, samples_per_s=100.0)]
    clock = ReplayClock()
    recipe, _ = _search(tmp_path, facts, Stubbed(clock, flat, {"fast": FAST, "slow": SLOW}), 5.0, clock)
    assert (recipe.speedup, recipe.claim) == (1.0, "defaults"), recipe.notes
    said = " ".join(recipe.notes)
    assert "no candidate read above 1.0" in said and "so no time was kept for its rounds" in said, said
    assert "the budget was short" not in said and not how_measured(
        next(n for n in recipe.notes if "no candidate read above" in n)), said  # a line the summary shows


def test_a_recipe_of_one_confirmation_round_is_provisional_not_confirmed(tmp_path: Path, facts: Any) -> None:
    """With one round asked (``--confirm-rounds 1``), the faster candidate is offered on that round's interval, as
    provisional: its claim, its note and its env header never say confirmed."""
    clock = ReplayClock()
    stub = Stubbed(clock, _explored(), {"fast": FAST, "slow": SLOW})
    recipe, _ = _search(tmp_path, facts, stub, 3600.0, clock, rounds=1)
    assert (recipe.speedup, recipe.speedup_low, recipe.claim) == (1.40, 1.30, "provisional"), recipe.notes
    said = " ".join(recipe.notes)
    assert "provisional at 1.40x [1.30-1.50] over PyTorch defaults (one confirmation round: not confirmed)" in said
    assert "confirmed at" not in said.replace("not confirmed", "")
    assert recipe.claim_text == "provisional: one confirmation round, 95% interval"


def test_a_candidate_that_stops_answering_while_time_remains_still_fails(tmp_path: Path, facts: Any) -> None:
    """Trial 1's second round never answers with an hour left: it reaches its own limit (3x its measured round, at
    least 60 s) and is a timeout, its confirmation failed: not offered, and never on the search's interval."""
    clock = ReplayClock()
    stub = Stubbed(clock, _explored(), {"fast": FAST, "slow": SLOW}, hang=("fast", 1))
    recipe, recs = _search(tmp_path, facts, stub, 3600.0, clock)
    timeouts = [r for r in recs if r.role == CONFIRM and r.result.status == Status.TIMEOUT]
    assert len(timeouts) == 1 and "stopped answering within its own limit of 60 s" in timeouts[0].result.error
    assert recipe.params == recs[0].params and recipe.speedup == 1.0, recipe.notes  # the defaults
    said = " ".join(recipe.notes)
    assert "trial 1 failed its confirmation (timeout: stopped answering" in said
    assert "the recipe keeps the defaults" in said


def test_a_round_whose_host_lock_another_search_holds_is_cut_within_the_budget(
        tmp_path: Path, facts: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another search on the host holds the trial lock for the whole confirmation (one stopped with Ctrl-Z holds it
    as long as it is stopped): each round waits for it no longer than the budget left (here 0.3 s of real time in
    its place, the wait asked recorded), then the candidate's rounds are cut and said so, and the recipe keeps the
    defaults with the reason: before, the wait had no end."""
    import fcntl
    import os
    import tempfile
    import time

    from autotune.study import confirm as confirmation
    from autotune.trial import lock

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    asked: list[float | None] = []

    def short(name_holder_after_s: float = 1.0, wait_s: float | None = None) -> Any:
        asked.append(wait_s)
        return lock.host_lock(name_holder_after_s, wait_s=0.3)

    monkeypatch.setattr(confirmation, "host_lock", short)
    holder: list[int] = []

    class Held(Stubbed):
        def reseed(self, seed: int) -> None:  # the confirmation begins: another search takes the lock and keeps it
            super().reseed(seed)
            holder.append(os.open(tmp_path / lock.LOCK_NAME, os.O_RDONLY | os.O_CREAT))
            fcntl.flock(holder[0], fcntl.LOCK_EX | fcntl.LOCK_NB)  # free between rounds: never a wait here

    clock = ReplayClock()
    started = time.monotonic()
    try:
        recipe, recs = _search(tmp_path, facts, Held(clock, _explored(), {"fast": FAST, "slow": SLOW}), 45.0, clock)
    finally:
        for descriptor in holder:
            os.close(descriptor)
    assert holder and not [r for r in recs if r.role == CONFIRM]  # no round measured: none was begun either
    assert asked and all(wait is not None and 1.0 <= wait <= 45.0 for wait in asked), asked
    assert time.monotonic() - started < 30.0
    said = " ".join(recipe.notes)
    assert recipe.params == recs[0].params and recipe.claim == "defaults", said
    assert "trial 1 from round 1 of 3 on (the host's trial lock was held)" in said, said
