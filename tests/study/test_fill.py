"""The budget's end: when a typical trial no longer fits before the time kept for the confirmation, a trial that
starts no process still may (``Turns.fill``). A 5-minute CNN search had stopped with 57 s of 300 unused: its
median trial took 47 s (the heuristic's process pairs), a candidate of the defaults' worker 2.8 s.

And a recipe Optuna samples again after it was measured is not measured again (``verdict.measured_before``):
one 5-minute CNN search had measured channels_last in the heuristic's environment 8 times and gone on with the
highest of the copies. The repeat is recorded as a duplicate and told PRUNED; the in-process turn gives way once
its samples only repeat."""
from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

import optuna
import pytest

from autotune import search_spaces as spaces
from autotune.measure import Interval, Noise, first_rounds_s
from autotune.measure.environment import environment_key
from autotune.study import Budget, SearchOptions, budget, reserve
from autotune.study.budget import estimate_s, in_process_estimate_s
from autotune.study.loop import SearchLoop
from autotune.study.records import Attr, StudyAttr, params_key
from autotune.study.seeds import promising
from autotune.study.turns import DUPLICATES_YIELD
from autotune.trial.spec import Status, TrialResult

from ..fakes.machines import two_sockets
from ..stubs import StubMeasurer

CTX = spaces.SpaceContext(default_batch_size=32, conv=True)
NOISE = Noise(window_s=0.3, pairs=16, half_width=0.03, margin=0.02, spread=0.06, aa=(1.0, 0.98, 1.02), timed_s=9.6,
              wall_s=15.0)
HEURISTIC = {"threads": 1, "interop_threads": 1}  # another environment than the defaults'


class Warm(StubMeasurer):
    """A measurer's ``warm``: the defaults' environment, and the environments named warm."""

    def __init__(self, defaults: dict[str, Any], *warm: dict[str, Any]) -> None:
        super().__init__(defaults)
        self.warm_envs = [environment_key(p) for p in warm]

    def warm(self, params: dict[str, Any]) -> bool:  # keyed as the live measurer keys its workers and factors
        return environment_key(params) in (environment_key(self.defaults), *self.warm_envs)


def _add(study: optuna.Study, role: str, params: dict[str, Any], objective: float, wall_s: float, method: str,
         startup_s: float, once_s: float | None = None) -> None:
    attrs = {Attr.ROLE: role, Attr.PARAMS: params, Attr.STATUS: "ok", "objective": objective, "wall_s": wall_s,
             "method": method, "startup_s": startup_s, "timed_s": wall_s - startup_s, "speedup_low": objective - 0.03,
             "speedup_high": objective + 0.03, "once_s": once_s}
    study.add_trial(optuna.trial.create_trial(value=objective, user_attrs=attrs))


@pytest.fixture
def searched(facts: Any) -> tuple[optuna.Study, dict[str, Any]]:
    """As the 5-minute search had it: the baseline, channels_last in the defaults' worker (2.8 s), the heuristic's
    environment (47 s, process pairs) and its combination with channels_last (59 s), the fastest."""
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("noise", asdict(NOISE))
    defaults = spaces.defaults(facts, CTX)
    _add(study, "baseline", defaults, 1.0, 15.0, "in-process pairs", 1.6)
    _add(study, "seed", {**defaults, "channels_last": True}, 1.2, 2.8, "in-process pairs", 0.0)
    _add(study, "heuristic", {**defaults, **HEURISTIC}, 1.1, 47.3, "process pairs", 33.6)
    _add(study, "combined", {**defaults, **HEURISTIC, "channels_last": True}, 1.3, 58.9,
         "process pairs x in-process pairs", 32.3)
    return study, defaults


def _loop(study: optuna.Study, facts: Any, measurer: Any, seeds: list | None = None) -> SearchLoop:
    options = SearchOptions(budget_s=300, storage="sqlite://", study="fill", seed=1)
    return SearchLoop(study, "cnn", facts, CTX, {}, options, Budget.start(60), lambda event: None,
                      seeds=seeds, measurer=measurer)


def _waiting(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))


def test_a_candidate_that_starts_no_process_is_estimated_from_those_alone(searched: Any) -> None:
    study, _ = searched
    assert estimate_s(study) == pytest.approx(1.2 * 47.3)  # the median of the three candidates
    assert in_process_estimate_s(study) == pytest.approx(1.2 * 2.8)  # channels_last only: the others started some
    empty = optuna.create_study(direction="maximize")
    empty.set_user_attr("noise", asdict(NOISE))
    assert in_process_estimate_s(empty) == pytest.approx(2 * 2 * 8 * 0.3)  # a first round, twice over


def test_a_candidate_of_script_modes_long_lived_copy_is_priced_as_one_that_starts_no_process(facts: Any) -> None:
    """Script mode: the first candidate measured in the long-lived copy carries the copy's start, and one whose
    arithmetic differs the start of the fresh copy for its loss; neither is a process pair. Read as started, a
    recommender script's search priced the heuristic's process pairs at such a trial's 20 s (they took 43 s) and a
    sampled in-process trial at a first round's 47 s: the sampled trial went first, and the heuristic's 2.2x found no
    time for its confirmation, so the recipe kept the defaults. The copy's start, spent once, is not the next
    candidate's: priced with it, a 3-minute CNN search's next in-copy trial (15.9 s) did not fit its 15.7 s left."""
    study = optuna.create_study(direction="maximize")
    noise = replace(NOISE, round_pairs=12, aa_pairs=18, wall_s=66.7, timed_s=42.2, start_s=4.3)
    study.set_user_attr("noise", asdict(noise))
    defaults = spaces.defaults(facts, CTX)
    _add(study, "baseline", defaults, 1.0, 66.7, "script process pairs (A/A)", 15.7)
    _add(study, "seed", {**defaults, "amp_dtype": "bfloat16"}, 0.92, 20.1, "script window pairs in one copy (4)", 5.0,
         once_s=3.9)  # the long-lived copy's start; the rest of its start-up, its loss copy's
    assert in_process_estimate_s(study) == pytest.approx(1.2 * (20.1 - 3.9))
    assert budget.started_estimate_s(study) == pytest.approx(first_rounds_s(noise)) != pytest.approx(1.2 * 16.2)
    _add(study, "heuristic", {**defaults, **HEURISTIC}, 2.2, 42.7, "script process pairs (2)", 9.3)
    assert budget.started_estimate_s(study) == pytest.approx(1.2 * 42.7)


def test_the_end_of_the_budget_is_filled_in_the_best_warm_environment(searched: Any, facts: Any) -> None:
    study, defaults = searched
    loop = _loop(study, facts, Warm(defaults, {**defaults, **HEURISTIC}))
    assert not loop.turns.fill(3.0)  # not even a candidate of a warm environment fits
    assert not _waiting(study)
    assert loop.turns.fill(20.0)
    waiting = _waiting(study)
    assert [t.user_attrs[Attr.ROLE] for t in waiting] == ["in-process"]
    trial = study.ask()  # as the loop does: the environment and compile mode fixed, the rest sampled by TPE
    params = spaces.suggest(trial, facts, CTX)
    assert {k: params[k] for k in ("threads", "interop_threads", "openmp", "allocator", "processes")} == {
        "threads": 1, "interop_threads": 1, "openmp": defaults["openmp"], "allocator": defaults["allocator"],
        "processes": 1}
    assert params["compile_mode"] == "none"
    assert params["bucket_cap_mb"] == 25 and params["static_graph"] is False  # DDP's: nothing in one process
    study.tell(trial, state=optuna.trial.TrialState.FAIL)


def test_without_the_best_environment_warm_the_defaults_worker_fills_it(searched: Any, facts: Any) -> None:
    study, defaults = searched
    loop = _loop(study, facts, Warm(defaults))  # the heuristic's worker is gone, or its factor is not settled
    assert loop.turns.fill(20.0)
    params = spaces.suggest(study.ask(), facts, CTX)
    assert {k: params[k] for k in ("threads", "interop_threads", "affinity", "openmp", "allocator")} == {
        k: defaults[k] for k in ("threads", "interop_threads", "affinity", "openmp", "allocator")}


def test_where_every_trial_starts_processes_the_end_of_the_budget_is_not_filled(facts: Any) -> None:
    """Script mode: the first round's 8 s read as a cheap trial's took 19 s, and left the leader's last
    confirmation round out."""

    class Fresh(StubMeasurer):
        fresh_processes = True

        def warm(self, params: dict[str, Any]) -> bool:
            return False

    study = optuna.create_study(direction="maximize")
    study.set_user_attr("noise", asdict(NOISE))
    defaults = spaces.defaults(facts, CTX)
    _add(study, "baseline", defaults, 1.0, 28.0, "script process pairs (A/A)", 9.2)
    _add(study, "seed", {**defaults, "channels_last": True}, 1.23, 18.6, "script process pairs (2)", 6.1)
    loop = _loop(study, facts, Fresh())
    assert in_process_estimate_s(study) is not None  # what the budget would offer a measurer with warm workers
    assert not loop.turns.fill(20.0) and not _waiting(study)
    assert loop.turns.next_estimate_s() == pytest.approx(1.2 * 18.6)


def test_a_waiting_seed_that_starts_processes_ends_the_search_and_a_warm_one_is_taken(searched: Any,
                                                                                     facts: Any) -> None:
    study, defaults = searched
    other = {**defaults, "threads": 1, "interop_threads": 2}
    study.enqueue_trial(other, user_attrs={Attr.ROLE: "seed"})
    assert not _loop(study, facts, Warm(defaults)).turns.fill(20.0)  # it would start processes: the search ends
    assert len(_waiting(study)) == 1

    fresh = optuna.create_study(direction="maximize")
    fresh.set_user_attr("noise", asdict(NOISE))
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        fresh.add_trial(t)
    for batch in (16, 128):  # the sampled trials' share of turns is taken (``sampled_turn``): a seed's turn
        _add(fresh, "in-process", {**defaults, "batch_per_rank": batch}, 1.0, 2.8, "in-process pairs", 0.0)
    seeds = [("seed", other), ("seed", {**defaults, "batch_per_rank": 64})]
    loop = _loop(fresh, facts, Warm(defaults), seeds=seeds)
    assert not loop.turns.sampled_turn()
    assert loop.turns.fill(20.0)  # the first seed not taken that starts no process: batch 64 in the defaults' worker
    waiting = _waiting(fresh)
    assert [t.user_attrs[Attr.ROLE] for t in waiting] == ["seed"]
    assert waiting[0].system_attrs["fixed_params"]["batch_per_rank"] == 64


def test_candidates_that_start_no_process_get_twice_the_time_of_those_that_start_some(searched: Any,
                                                                                      facts: Any) -> None:
    """After the heuristic and its combination (106 s of process starts and pairs), sampled trials start no
    process until those have taken twice as long: then Optuna samples every knob again."""
    study, defaults = searched
    loop = _loop(study, facts, Warm(defaults))
    assert loop.turns.in_process_turn()
    assert loop.turns.next_estimate_s() == pytest.approx(1.2 * 2.8)  # what it will sample: one that starts none
    loop.turns.enqueue_in_process()
    loop.turns.enqueue_in_process()  # one waits already: not two
    assert [t.user_attrs[Attr.ROLE] for t in _waiting(study)] == ["in-process"]
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)
    for batch in (16, 32, 64, 128, 8, 24, 48, 96):
        _add(study, "in-process", {**defaults, "batch_per_rank": batch}, 1.0, 25.0, "in-process pairs", 0.0)
    assert loop.turns.in_process_turn()  # 2.8 + 200 s against 2 x 106 s
    _add(study, "in-process", {**defaults, "batch_per_rank": 256}, 1.0, 25.0, "in-process pairs", 0.0)
    assert not loop.turns.in_process_turn()
    assert loop.turns.next_estimate_s() == pytest.approx(1.2 * 58.9)  # one sampled freely: as those that started some
    # the scripted measurers' trials (0.5 s of start-up) and the replayed grids' (none) started no process
    _add(study, "search", {**defaults, "threads": 1}, 1.0, 200.0, "process pairs", 0.5)
    assert not loop.turns.in_process_turn()


class Slow(StubMeasurer):
    """A measurer whose confirmation rounds take ``sleep_s`` each on its scripted clock (``now``), measuring
    ``speed`` (mixed: an environment factor and in-process pairs)."""

    def __init__(self, sleep_s: float) -> None:
        super().__init__()
        self.sleep_s, self.measured, self.now = sleep_s, [], 0.0

    def begin(self, params: dict[str, Any], timeout_s: float) -> object:
        self.measured.append(params["channels_last"])
        return params

    def more(self, handle: object, n: int, timeout_s: float, confidence: float = 0.95) -> Any:
        self.now += self.sleep_s
        from autotune.measure.stats import Interval

        return Interval(1.3, 1.25, 1.35, 0.95, n)

    def end(self, handle: object) -> Any:
        from autotune.trial.spec import TrialResult

        return TrialResult("ok", objective=1.3, speedup_low=1.25, speedup_high=1.35, method="in-process pairs",
                           pairs=6, loss=1.0, loss_samples=1024, wall_s=self.sleep_s, timed_s=self.sleep_s)

    def close(self) -> None:
        pass


def test_a_candidate_sharing_its_environments_round_is_not_left_out_for_that_time(tmp_path: Any, facts: Any) -> None:
    """Two candidates of the heuristic's environment (channels_last with and without): the second's round pays
    no process pair and no worker's start once the first's did (4.3 s where 20 s were counted): with 17.5 s
    left it is measured, not left out for time."""
    from autotune.study.confirm import confirm

    storage = f"sqlite:///{tmp_path}/studies.db"
    study = optuna.create_study(study_name="shared", storage=storage, direction="maximize")
    study.set_user_attr("noise", asdict(NOISE))
    defaults = spaces.defaults(facts, CTX)
    env = {**defaults, **HEURISTIC}
    _add(study, "baseline", defaults, 1.0, 15.0, "in-process pairs", 1.6)
    _add(study, "combined", {**env, "channels_last": True}, 1.33, 40.0, "process pairs x in-process pairs", 25.0)
    _add(study, "search", env, 1.3, 40.0, "process pairs x in-process pairs", 25.0)
    measurer = Slow(2.0)
    options = SearchOptions(budget_s=300, storage=storage, study="shared", confirm_top=2, confirm_rounds=1)
    from autotune.study.reserve import round_s

    first = round_s(next(r for r in _records(study) if r.number == 1).result, NOISE, options, 0)
    # the first fits; after it, less than a whole round is left
    loop = SearchLoop(study, "cnn", facts, CTX, {}, options, Budget(first + 1.5, lambda: measurer.now),
                      lambda event: None, measurer=measurer)
    loop.noise = NOISE
    outcome = confirm(loop)
    assert outcome is not None and outcome.note is None, outcome.note
    assert measurer.measured == [True, False]


def _records(study: optuna.Study) -> list[Any]:
    from autotune.study.records import records

    return records(study)


# Duplicates ---------------------------------------------------------------------------------------------------

class Counting(Warm):
    """``Warm``, and a ``begin`` that records what it was asked to measure (and fails it: nothing to measure)."""

    def __init__(self, defaults: dict[str, Any], *warm: dict[str, Any]) -> None:
        super().__init__(defaults, *warm)
        self.begun: list[dict[str, Any]] = []

    def begin(self, params: dict[str, Any], timeout_s: float) -> TrialResult:
        self.begun.append(params)
        return TrialResult(Status.CRASH, error="a scripted crash", wall_s=0.1)


def _ended(study: optuna.Study) -> optuna.trial.FrozenTrial:
    return study.get_trials(deepcopy=False)[-1]


@pytest.mark.parametrize("role", ["in-process", "search"])
def test_a_sampled_recipe_measured_before_is_not_measured_again(searched: Any, facts: Any, role: str) -> None:
    study, defaults = searched
    measurer = Counting(defaults, {**defaults, **HEURISTIC})
    loop = _loop(study, facts, measurer)
    study.enqueue_trial({**defaults, **HEURISTIC, "channels_last": True}, user_attrs={Attr.ROLE: role})
    stopped, skips, result, asked = loop._next(0, None)
    assert (stopped, skips, result, asked) == (None, 1, None, role)
    assert measurer.begun == []
    ended = _ended(study)
    assert ended.state == optuna.trial.TrialState.PRUNED and ended.user_attrs[Attr.STATUS] == "duplicate"
    assert ended.user_attrs[Attr.ERROR] == "the same recipe as trial 3, whose measurement stands"
    assert loop.turns.duplicates == 1


def test_a_recipe_that_crashed_is_measured_again(searched: Any, facts: Any) -> None:
    study, defaults = searched
    measurer = Counting(defaults)
    loop = _loop(study, facts, measurer)
    loop.noise = NOISE
    crashed = {**defaults, "batch_per_rank": 16}
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, user_attrs={
        Attr.ROLE: "search", Attr.PARAMS: crashed, Attr.STATUS: "crash", Attr.ERROR: "killed by SIGSEGV"}))
    study.enqueue_trial(crashed, user_attrs={Attr.ROLE: "search"})
    loop._next(0, None)
    assert measurer.begun == [crashed] and loop.turns.duplicates == 0


@pytest.mark.parametrize("role", ["search", "baseline"])
@pytest.mark.parametrize("hostile", [{"processes": 5000}, {"threads": "2; touch /tmp/x"}, {"threads": 4096}])
def test_a_shared_studys_trial_no_search_would_ask_is_recorded_not_run(searched: Any, facts: Any,
                                                                        hostile: dict[str, Any], role: str) -> None:
    """Another hand in a shared study enqueues a trial whose params no search writes (Optuna's own check of a fixed
    value raises on some, lets an integer out of range through with a warning) or this machine's space never asks
    (4096 threads on its CPUs), as a candidate or as the baseline: the search records the trial not run, starts
    nothing and goes on (a baseline that failed would end it). A stored trial of such params is refused the same way
    where it would run (a confirmation's round), before anything reads its params."""
    study, defaults = searched
    measurer = Counting(defaults)
    loop = _loop(study, facts, measurer)
    loop.noise = NOISE
    study.enqueue_trial({**defaults, **hostile}, user_attrs={Attr.ROLE: role})
    assert loop._next(0, None)[:3] == (None, 1, None)  # skipped, not failed: the search goes on
    assert measurer.begun == []
    ended = _ended(study)
    assert ended.user_attrs[Attr.STATUS] == "skipped" and ended.user_attrs[Attr.ERROR].startswith("not run: ")
    assert ended.state == optuna.trial.TrialState.PRUNED
    for stored in ({**defaults, **hostile}, {**defaults, "processes": "2; touch /tmp/x"}):
        assert loop.run_one(study.ask(), "confirm", stored, 60.0).status == "skipped"
    assert measurer.begun == []


def test_a_value_error_of_the_searchs_own_asking_is_raised(searched: Any, facts: Any,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Only an enqueued trial's value is another hand's: a ValueError in asking a sampled trial is a defect, raised."""
    study, defaults = searched
    loop = _loop(study, facts, Counting(defaults))

    def broken(*args: Any) -> dict[str, Any]:
        raise ValueError("a defect of the space")
    monkeypatch.setattr(spaces, "suggest", broken)
    monkeypatch.setattr(loop.turns, "waiting", lambda: [])
    monkeypatch.setattr(loop.turns, "sampled_turn", lambda: True)
    monkeypatch.setattr(loop.turns, "enqueue_in_process", lambda: None)
    with pytest.raises(ValueError, match="a defect of the space"):
        loop._next(0, None)


def test_the_in_process_turn_gives_way_once_its_samples_only_repeat(searched: Any, facts: Any) -> None:
    study, defaults = searched
    loop = _loop(study, facts, Counting(defaults))
    assert loop.turns.in_process_turn() and loop.turns.fill(20.0)
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)  # the in-process trial fill enqueued
    loop.turns.duplicates = DUPLICATES_YIELD
    assert not loop.turns.in_process_turn()  # a sample Optuna draws freely comes next
    # At the budget's end an in-process trial is still asked: a repeat is skipped at once, and MAX_SKIPS in a row
    # end the search. Returning False here left 44 s of a 5-minute search unused.
    assert loop.turns.fill(20.0)
    assert [t.user_attrs[Attr.ROLE] for t in study.get_trials(
        deepcopy=False, states=(optuna.trial.TrialState.WAITING,))] == ["in-process"]


# Sampled trials' share --------------------------------------------------------------------------------------------

class Answering(Warm):
    """``Warm``, and a ``begin`` that answers at once with a measured result (1.1x, the defaults' loss): every
    trial counts, each in no time, so the order the loop asks them in is all there is to see."""

    def begin(self, params: dict[str, Any], timeout_s: float) -> TrialResult:
        return TrialResult(Status.OK, objective=1.1, speedup_low=1.05, speedup_high=1.15, method="in-process pairs",
                           pairs=8, loss=1.0, loss_samples=1024, wall_s=0.1, timed_s=0.1,
                           samples_per_s=1100.0, baseline_samples_per_s=1000.0)


class AnsweringFresh(Answering):
    """Script mode's kind: every trial starts processes (``fresh_processes``)."""

    fresh_processes = True


@pytest.mark.parametrize("fresh", [False, True])
def test_sampled_trials_take_a_third_of_the_turns_while_seeds_remain(facts: Any, fresh: bool) -> None:
    """Six seeds of the defaults' worker and a count of 7 trials: before, the six seeds took every trial after the
    baseline and the sampler never ran (a recurrent workload's 3-minute search: 4 trials, all seeds), and with a
    sample for every two seeds 2 of the CNN's 7 were sampled. Now after every candidate but the first at least a
    third were sampled: seed, sample, seed, sample, seed, seed (then a sample). The sample is an in-process trial
    in the defaults' environment; where every trial starts processes anyway (script mode), Optuna samples the
    environment too (before, script mode's samples never changed threads, OpenMP or the allocator)."""
    # seeded: a sample that repeats a measured recipe takes its turn unmeasured (tested above), and one more trial
    # (the machine's space as it was when the order below was drawn: without glibc-kept, whose draw adds a combination)
    facts = replace(facts, runtime=replace(facts.runtime, glibc=None)) if facts.runtime else facts
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=3))
    study.set_user_attr("noise", asdict(NOISE))
    study.set_user_attr("baseline_loss", 1.0)
    defaults = spaces.defaults(facts, CTX)
    _add(study, "baseline", defaults, 1.0, 15.0, "in-process pairs", 1.6)
    seeds = [("seed", {**defaults, "batch_per_rank": b, "channels_last": c})
             for c, b in ((False, 8), (False, 16), (False, 64), (False, 128), (True, 8), (True, 16))]
    options = SearchOptions(budget_s=300, storage="sqlite://", study="share", seed=1, trials=7)
    # (an hour's deadline: the trials answer at once, but with fresh processes each is estimated as the baseline's)
    loop = SearchLoop(study, "cnn", facts, CTX, {}, options, Budget.start(3600), lambda event: None,
                      seeds=seeds, measurer=(AnsweringFresh if fresh else Answering)(defaults))
    loop.noise = NOISE
    assert loop.run() == "trials"
    told = [t.user_attrs[Attr.ROLE] for t in study.get_trials(deepcopy=False)][1:]
    sample = "search" if fresh else "in-process"
    assert told.count(sample) == 2, told
    # the combination takes a seed's turn (``Turns.sampled_turn``): whether a sample changed the environment, and so
    # made one, is the machine's space's draw (the Zen 4's made one where the Xeon's did not)
    roles = [{sample: "in-process", "combined": "seed"}.get(role, role) for role in told]
    if fresh:  # nothing was fixed for the sampler: the environment's knobs are its to choose
        assert all("fixed_params" not in t.system_attrs for t in study.get_trials(deepcopy=False)
                   if t.user_attrs[Attr.ROLE] == "search")
    # (a sample that repeats a measured recipe takes its turn unmeasured: with this seed none does here, but the
    # space is the machine's, so the order is checked turn by turn, such a repeat counted as a turn taken)
    seeded = sampled = 0
    for role in roles:
        seeded, sampled = seeded + (role == "seed"), sampled + (role == "in-process")
        assert seeded + sampled == 1 or 3 * sampled >= seeded + sampled, roles
    assert roles == ["seed", "in-process", "seed", "in-process", "seed", "seed"], told
    taken = [t.params["batch_per_rank"] for t in study.get_trials(deepcopy=False)[1:]
             if t.user_attrs[Attr.ROLE] == "seed"]
    assert taken == [8, 16, 64, 128][:len(taken)] and len(taken) >= 3, told  # in their order, none lost
    # once the seeds are all taken, the loop samples as before (the in-process turn, the combination)
    assert not SearchLoop(study, "cnn", facts, CTX, {}, options, Budget.start(60), lambda event: None,
                          seeds=seeds[:len(taken)], measurer=Answering(defaults)).turns.sampled_turn()


def test_the_combination_takes_a_seeds_turn(searched: Any, facts: Any) -> None:
    """Measured: the baseline, two seeds, the heuristic, the combination and two samples; a seed is left. Counted as
    a seed's turn, the combination makes four seeded against two sampled, and a sample is due (fewer than a third
    of the candidates with the next); not counted, three against two, and the seed would go next."""
    study, defaults = searched
    _add(study, "seed", {**defaults, "batch_per_rank": 64}, 1.0, 2.8, "in-process pairs", 0.0)
    for batch in (16, 8):
        _add(study, "in-process", {**defaults, "batch_per_rank": batch}, 1.0, 2.8, "in-process pairs", 0.0)
    seeds = [("seed", {**defaults, "batch_per_rank": 128})]
    assert _loop(study, facts, Warm(defaults), seeds=seeds).turns.sampled_turn()


@pytest.mark.parametrize(("data_wait", "first"), [(0.9, "input"), (0.02, "other"), (None, "other")])
def test_where_the_defaults_wait_for_data_the_input_is_seeded_first(facts: Any, data_wait: float | None,
                                                                    first: str) -> None:
    """The baseline's steps waited for data 90% of the time (a per-sample augmentation measured 95%): DataLoader
    workers with the threads they leave to compute come before the other seeds; 2% (the bundled CNN) or not
    measured: the seeds as they were."""
    from autotune.search_spaces import data

    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=3))
    study.set_user_attr("noise", asdict(NOISE))
    defaults = spaces.defaults(facts, CTX)
    attrs = {Attr.ROLE: "baseline", Attr.PARAMS: defaults, Attr.STATUS: "ok", "objective": 1.0, "wall_s": 15.0,
             "method": "in-process pairs", "data_wait": data_wait, "loss": 1.0}
    study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs=attrs))
    seeds = [("seed", {**defaults, "channels_last": True})]
    events: list[Any] = []
    loop = SearchLoop(study, "cnn", facts, CTX, {}, SearchOptions(budget_s=300, storage="sqlite://", study="input"),
                      Budget.start(60), events.append, seeds=seeds, measurer=Answering(defaults))
    loop.noise = NOISE
    loop.prepare()  # as the loop does before each trial: the input's seeds go first
    loop._next(0, None)
    asked = study.get_trials(deepcopy=False)[-1].user_attrs[Attr.PARAMS]
    if first == "input":
        cores = max(1, min(8, int(facts.cpu.allowed.cores or 1)))
        assert asked["num_workers"] == 1 and asked["threads"] == max(1, cores - 1), asked
        assert [s[1]["num_workers"] for s in loop.turns.seeds[:-1]] == [c["num_workers"] for c in data.input_bound(
            facts, CTX) if not spaces.outside({**defaults, **c}, facts, CTX)]
        assert loop.turns.seeds[-1][1]["channels_last"]  # the other seeds follow, none lost
        said = [e.detail for e in events if getattr(e, "name", None) == "input-bound"]  # the log's line
        assert said == ["the defaults wait for data 90% of a step: DataLoader workers and the threads they leave "
                        "are measured first"], events
    else:
        assert asked["channels_last"] and not asked["num_workers"], asked
        assert loop.turns.seeds == seeds


def test_a_seed_is_read_with_the_runs_settings_as_its_trial_will_measure_it(facts: Any) -> None:
    """``device`` is an environment key and a run setting, not a seed's: read without the run's settings, a seed of
    the defaults' environment was taken as another environment's, priced as its process pairs and never filled the
    budget's end (a suite run's search skipped its stored recipe for a sampled trial)."""
    run = {"device": "cpu"}
    defaults = {**spaces.defaults(facts, CTX), **run}
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("noise", asdict(NOISE))
    _add(study, "baseline", defaults, 1.0, 15.0, "in-process pairs", 1.6)
    seed = {**spaces.defaults(facts, CTX), "batch_per_rank": 64}
    options = SearchOptions(budget_s=300, storage="sqlite://", study="fill", seed=1)
    loop = SearchLoop(study, "cnn", facts, CTX, run, options, Budget.start(60), lambda event: None,
                      seeds=[("seed", seed)], measurer=Warm(defaults))
    assert loop.turns._warm(seed)
    assert loop.turns.fill(20.0) and _waiting(study)[0].system_attrs["fixed_params"]["batch_per_rank"] == 64


@pytest.mark.parametrize("seeded", [True, False])
def test_without_seeds_no_combination_either(facts: Any, seeded: bool) -> None:
    """A faster batch and another environment measured apart: the combination of both is autotune's seed, which
    the sampler alone (``seeded=False``, the benchmark's baselines) must not be handed."""
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=3))
    study.set_user_attr("noise", asdict(NOISE))
    defaults = spaces.defaults(facts, CTX)
    for role, params, objective in [("baseline", defaults, 1.0), ("search", {**defaults, "batch_per_rank": 64}, 1.3),
                                    ("heuristic", {**defaults, "threads": 1, "interop_threads": 1}, 1.04)]:
        attrs = {Attr.ROLE: role, Attr.PARAMS: params, Attr.STATUS: "ok", "objective": objective, "loss": 1.0,
                 "method": "in-process pairs", "wall_s": 15.0}
        study.add_trial(optuna.trial.create_trial(value=objective, user_attrs=attrs))
    options = SearchOptions(budget_s=300, storage="sqlite://", study="combined", seeded=seeded)
    loop = SearchLoop(study, "cnn", facts, CTX, {}, options, Budget.start(60), lambda event: None, seeds=[],
                      measurer=Answering(defaults))
    loop.noise = NOISE
    loop.prepare()
    loop._next(0, None)
    assert (study.get_trials(deepcopy=False)[-1].user_attrs[Attr.ROLE] == "combined") == seeded


def _apart(facts: Any, heuristic: float) -> tuple[optuna.Study, dict[str, Any]]:
    """The defaults, channels_last in their worker (1.3x), the heuristic's environment (``heuristic``) and two samples
    (the sampled third taken: the next turn is a seed's)."""
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=3))
    study.set_user_attr("noise", asdict(NOISE))
    defaults = spaces.defaults(facts, CTX)
    _add(study, "baseline", defaults, 1.0, 15.0, "in-process pairs", 1.6)
    _add(study, "seed", {**defaults, "channels_last": True}, 1.3, 2.8, "in-process pairs", 0.0)
    _add(study, "heuristic", {**defaults, **HEURISTIC}, heuristic, 47.3, "process pairs", 33.6)
    for batch in (8, 64):
        _add(study, "in-process", {**defaults, "batch_per_rank": batch}, 1.05, 2.8, "in-process pairs", 0.0)
    return study, defaults


@pytest.mark.parametrize("heuristic", [1.2, 1.01])
def test_the_combination_goes_ahead_of_the_seeds_left(facts: Any, heuristic: float) -> None:
    """A 3-minute CNN demo measured the heuristic's environment at 1.23x beside bf16 + channels_last at 2.04x, then
    two float16 seeds (0.01x) and a sample; by then their combination, which starts processes, no longer fitted:
    1.62x confirmed where another run's combination was confirmed at 2.75x. Where the environment's gain is measured
    (above the margin), the two gains together go before a guess: asked next, priced as next, and at the budget's end
    taken first where its environment is warm. An environment that read within the noise (1.01x) waits for the
    seeds, as before."""
    ahead = heuristic > 1 + NOISE.margin
    study, defaults = _apart(facts, heuristic)
    seeds = [("seed", {**defaults, "batch_per_rank": 16})]
    both = {**defaults, **HEURISTIC, "channels_last": True}

    loop = _loop(study, facts, Warm(defaults, {**defaults, **HEURISTIC}), seeds)
    assert not loop.turns.sampled_turn()
    assert loop.turns.fill(20.0)  # warm: the budget's end takes it before the seed, which is warm too
    assert [t.user_attrs[Attr.ROLE] for t in _waiting(study)] == ["combined" if ahead else "seed"]
    if ahead:
        assert params_key(_waiting(study)[0].system_attrs["fixed_params"]) == params_key(both)

    cold, _ = _apart(facts, heuristic)
    loop = SearchLoop(cold, "cnn", facts, CTX, {}, SearchOptions(budget_s=300, storage="sqlite://", study="fill"),
                      Budget.start(60), lambda event: None, seeds=seeds, measurer=Answering(defaults))
    loop.noise = NOISE
    loop.prepare()
    price = loop.turns.next_estimate_s()
    assert price == (budget.started_estimate_s(cold) if ahead else in_process_estimate_s(cold))  # what comes next
    loop._next(0, None)
    last = cold.get_trials(deepcopy=False)[-1]
    assert last.user_attrs[Attr.ROLE] == ("combined" if ahead else "seed")
    if ahead:
        assert params_key(last.user_attrs[Attr.PARAMS]) == params_key(both)


def test_without_seeds_no_input_seed_either(facts: Any) -> None:
    """``seeded=False`` (the benchmark's sampler alone) means no seed of any kind: the defaults waited for data 90%
    of a step, and still the sampler picks the next trial (the input seeds came in through that door)."""
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=3))
    study.set_user_attr("noise", asdict(NOISE))
    defaults = spaces.defaults(facts, CTX)
    attrs = {Attr.ROLE: "baseline", Attr.PARAMS: defaults, Attr.STATUS: "ok", "objective": 1.0, "wall_s": 15.0,
             "method": "in-process pairs", "data_wait": 0.9, "loss": 1.0}
    study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs=attrs))
    events: list[Any] = []
    options = SearchOptions(budget_s=300, storage="sqlite://", study="input", seeded=False)
    loop = SearchLoop(study, "cnn", facts, CTX, {}, options, Budget.start(60), events.append, seeds=[],
                      measurer=Answering(defaults))
    loop.noise = NOISE
    loop.prepare()
    loop._next(0, None)
    assert loop.turns.seeds == [] and not [e for e in events if getattr(e, "name", None) == "input-bound"]
    assert study.get_trials(deepcopy=False)[-1].user_attrs[Attr.ROLE] != "seed"


class Timed(Warm):
    """``Warm``, whose trials take the time a 2-minute GRU search's took on the budget's clock (``now``, from the
    calibration's end): a trial of the defaults' worker 9 s and 0.9x, the heuristic's environment (its process pairs)
    22 s and 1.13x."""

    user_processes = True  # the claim's pairs of your runs are kept time for

    def __init__(self, defaults: dict[str, Any], now: float) -> None:
        super().__init__(defaults)
        self.now, self.started = now, dict[str, float]()

    def begin(self, params: dict[str, Any], timeout_s: float) -> TrialResult:
        warm = self.warm(params)
        self.started.setdefault("in-process" if warm else "heuristic", self.now)
        self.now += 9.0 if warm else 22.0
        if warm:
            return TrialResult(Status.OK, objective=0.9, speedup_low=0.85, speedup_high=0.95, method="in-process pairs",
                               pairs=8, loss=1.0, loss_samples=1024, wall_s=9.0, timed_s=4.8)
        return TrialResult(Status.OK, objective=1.13, speedup_low=1.08, speedup_high=1.18, method="process pairs",
                           pairs=3, loss=1.0, loss_samples=1024, wall_s=22.0, timed_s=6.0, startup_s=16.0)


@pytest.mark.parametrize(("start_s", "budget_s", "due"), [(3.2, 120, True), (9.0, 120, False), (3.2, 300, False)])
def test_an_environments_seed_is_measured_while_its_confirmation_and_your_runs_fit(facts: Any, start_s: float,
                                                                                   budget_s: int, due: bool) -> None:
    """The cheap first made the heuristic wait for the defaults' worker's seeds and the sampled turns: a 2-minute
    GRU search reached it, its only gain, at 44 s of 120 and left its confirmation short of time. It goes next
    once one more cheap trial would leave too little for its first look (priced from a worker's start, 3.2 s) and
    the time kept for its rounds and your runs; here after two (before, after five, with 35 s left of the 58 s its
    three rounds and six pairs of your runs need; a lone contender of a short search keeps the two rounds after
    which your runs decide it). It keeps its turn after the cheap seeds where it fits then (5 minutes), and where it
    does not fit now either (workers that start in 9 s): taken at once, a CNN's took the in-process seeds' time."""
    study, loop, measurer = _due(facts, start_s, budget_s)
    roles = [t.user_attrs[Attr.ROLE] for t in study.get_trials(deepcopy=False)]
    if not due:  # its turn, after the cheap seeds
        assert roles[:7] == ["baseline", "seed", "in-process", "seed", "in-process", "seed", "heuristic"], roles
        return
    assert roles[1:5] == ["seed", "in-process", "heuristic", "seed"] and measurer.started["heuristic"] == 22.0, roles
    assert study.get_trials(deepcopy=False)[3].user_attrs.get(Attr.AHEAD)  # ahead of a seed's turn: it comes next
    left = budget_s - (measurer.started["heuristic"] + 22.0)
    kept = reserve.reserve_s(study, loop.options, budget.estimate_s(study))  # its two rounds, six pairs of your runs
    assert left >= kept > 50.0, (left, kept)


def _due(facts: Any, start_s: float, budget_s: int,
         bf16: float | None = None) -> tuple[optuna.Study, SearchLoop, Timed]:
    """A search of ``budget_s`` run to its end on ``Timed``'s clock: three seeds of the defaults' worker, then the
    heuristic, whose workers start in ``start_s``; with ``bf16``, its kernels' speed here, its seed first."""
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=3))
    study.set_user_attr("noise", asdict(replace(NOISE, pairs=16, start_s=start_s, run_s=2.6)))
    study.set_user_attr("baseline_loss", 1.0)
    defaults = spaces.defaults(facts, CTX)
    _add(study, "baseline", defaults, 1.0, 4.0, "in-process pairs", 3.2)
    seeds = [*(("seed", {**defaults, "batch_per_rank": b}) for b in (16, 64, 128)),
             ("heuristic", {**defaults, **HEURISTIC})]
    if bf16 is not None:
        study.set_user_attr(StudyAttr.KERNEL_SPEEDS, {"bfloat16": bf16})
        seeds.insert(0, ("seed", {**defaults, "amp_dtype": "bfloat16"}))
    measurer = Timed(defaults, now=4.0)  # the calibration's end
    options = SearchOptions(budget_s=budget_s, storage="sqlite://", study="due", seed=1, trials=8)
    loop = SearchLoop(study, "cnn", facts, CTX, {}, options, Budget.start(budget_s - 4, clock=lambda: measurer.now),
                      lambda event: None, seeds=seeds, measurer=measurer)
    loop.noise = NOISE
    loop.run()
    return study, loop, measurer


def test_the_seed_an_environments_seed_went_ahead_of_comes_next(facts: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Due at once, the heuristic goes ahead of the first seed's turn; that seed comes next, as it would have, then a
    sample: counted as a seed, the heuristic gave the next turn to a sample, which left a busy 3-minute demo no time
    for the bfloat16 seed (``Turns.sampled_turn``)."""
    measured: list[tuple[str, bool]] = []
    original = SearchLoop._measure

    def spied(loop: SearchLoop, role: str, params: dict[str, Any], deadline: float, ahead: bool = False) -> Any:
        measured.append((role, ahead))  # its race keeps the seed's time (``Turns.displaced``)
        return original(loop, role, params, deadline, ahead)

    monkeypatch.setattr(SearchLoop, "_measure", spied)
    study, _, measurer = _due(facts, 3.2, 100)
    roles = [t.user_attrs[Attr.ROLE] for t in study.get_trials(deepcopy=False)]
    assert roles[1:4] == ["heuristic", "seed", "in-process"] and measurer.started["heuristic"] == 4.0, roles
    assert measured[:2] == [("heuristic", True), ("seed", False)], measured
    ahead = [t.user_attrs.get(Attr.AHEAD) for t in study.get_trials(deepcopy=False)[1:3]]
    assert ahead == [True, None], ahead


@pytest.mark.parametrize(("bf16", "ahead"), [(1.35, False), (1.05, True)])
def test_an_environments_seed_goes_ahead_of_a_promising_precision_only_where_it_fits_after(
        facts: Any, bf16: float, ahead: bool) -> None:
    """A newcomer's 3-minute CNN demo on the Zen 4 pulled the heuristic ahead of the bfloat16 seed right after the
    calibration; its 43-s look and the time kept for its rounds and your runs left bfloat16 no look: 1.27x confirmed
    where bfloat16 reads 1.7-1.9x. A precision whose kernels ran 1.35x as fast as float32's here keeps its turn where
    it would not fit after the heuristic (``seeds.promising``), and the heuristic takes the turn after it, where it
    no longer fits with all its rounds: both measured in a minute, where only the heuristic was. One measured 1.05x
    is displaced, as the batch sizes are."""
    study, _, measurer = _due(facts, 1.0, 60, bf16)
    trials = study.get_trials(deepcopy=False)
    order = [(t.user_attrs[Attr.ROLE], t.params.get("amp_dtype"), t.user_attrs.get(Attr.AHEAD)) for t in trials[1:]]
    if ahead:
        assert order == [("heuristic", "float32", True)], order
        assert measurer.started == {"heuristic": 4.0}
    else:
        assert order[:2] == [("seed", "bfloat16", None), ("heuristic", "float32", None)], order
        assert measurer.started == {"in-process": 4.0, "heuristic": 13.0}


@pytest.mark.parametrize("stored", [{"bfloat16": 1.35}, {"bfloat16": "fast"}, ["bfloat16"], {"bfloat16": None},
                                    {"bfloat16": float("nan")}, {"bfloat16": True}, "x", {"float16": 9.0}])
def test_a_seeds_promise_is_read_from_numbers_only(stored: Any) -> None:
    """A study's kernel speeds come from its storage, which a foreign or hostile writer may share: anything but a
    finite number for the seed's precision is no promise, never an error; a precision ``--fix`` holds is no change."""
    study = optuna.create_study()
    study.set_user_attr(StudyAttr.KERNEL_SPEEDS, stored)
    bf16, fp32 = {"amp_dtype": "bfloat16"}, {"amp_dtype": "float32"}
    assert promising(study, bf16, fp32) == (stored == {"bfloat16": 1.35})
    assert not promising(study, bf16, bf16)


class Combining(Timed):
    """``Timed``, as a 3-minute CNN search's trials read: in the defaults' worker bfloat16 1.7x and with channels_last
    2.0x, the others 0.9x; the heuristic's environment 1.08x, whose worker is warm after it, where their
    combination, an arm of 4 s, reads 2.2x."""

    def begin(self, params: dict[str, Any], timeout_s: float) -> TrialResult:
        speed = 2.0 if params.get("channels_last") else 1.7 if params.get("amp_dtype") == "bfloat16" else 0.9
        if not self.warm(params):
            result = super().begin(params, timeout_s)
            self.warm_envs.append(environment_key(params))
            return replace(result, objective=1.08, speedup_low=0.9, speedup_high=1.29)
        if any(params.get(k) != self.defaults.get(k) for k in HEURISTIC):  # the heuristic's worker, warm now
            self.started.setdefault("combined", self.now)
            self.now += 4.0
            return TrialResult(Status.OK, objective=2.2, speedup_low=1.85, speedup_high=2.57, pairs=8, loss=1.0,
                               method="process pairs x in-process pairs", loss_samples=1024, wall_s=4.0, timed_s=3.0)
        self.started.setdefault("in-process", self.now)
        self.now += 6.0
        return TrialResult(Status.OK, objective=speed, speedup_low=speed - 0.05, speedup_high=speed + 0.05, pairs=8,
                           method="in-process pairs", loss=1.0, loss_samples=1024, wall_s=6.0, timed_s=4.8)


def test_an_environments_seed_keeps_time_for_its_combination_which_follows_it(facts: Any) -> None:
    """Counted without its combination, the heuristic of a 3-minute CNN search came at 62 s of 180 behind the
    in-process seeds, a sampled trial went next, and its combination with bfloat16 + channels_last (2.18x, the
    fastest) came at 99 s: it kept one confirmation round of three (the narrower 2.0x, ranked first, kept its
    three). Where an in-process winner would combine with it, the heuristic goes once one more cheap trial would
    leave too little for both first looks and both candidates' rounds (and the look of a seed that may make the
    combination's in-process part faster, which goes before it), and the combination, an arm of its warm worker,
    follows it (the sampled turns the share asks for at most between; here a sample with channels_last, 2.0x, is
    the winner it carries): the time left then holds every round of both and your runs."""
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=3))
    study.set_user_attr("noise", asdict(replace(NOISE, pairs=16, start_s=3.2, run_s=2.6)))
    study.set_user_attr("baseline_loss", 1.0)
    defaults = spaces.defaults(facts, CTX)
    _add(study, "baseline", defaults, 1.0, 15.0, "in-process pairs", 3.2)
    seeds = [("seed", {**defaults, "amp_dtype": "bfloat16"}),
             ("seed", {**defaults, "amp_dtype": "bfloat16", "channels_last": True}),
             *(("seed", {**defaults, "batch_per_rank": b}) for b in (16, 64, 128)),
             ("heuristic", {**defaults, **HEURISTIC})]
    measurer = Combining(defaults, now=15.0)  # the calibration's end
    options = SearchOptions(budget_s=180, storage="sqlite://", study="due", seed=1)
    loop = SearchLoop(study, "cnn", facts, CTX, {}, options, Budget.start(165, clock=lambda: measurer.now),
                      lambda event: None, seeds=seeds, measurer=measurer)
    loop.noise = NOISE
    loop.run()
    trials = study.get_trials(deepcopy=False)
    roles = [t.user_attrs[Attr.ROLE] for t in trials]
    assert roles.index("heuristic") < roles.index("combined") <= roles.index("heuristic") + 3, roles
    assert trials[roles.index("combined")].user_attrs[Attr.PARAMS]["channels_last"] is True
    left = 180 - (measurer.started["combined"] + 4.0)
    kept = reserve.reserve_s(study, loop.options, budget.estimate_s(study))  # both candidates' rounds, your runs
    assert left >= kept, (roles, measurer.started, left, kept)


def test_the_combination_goes_before_a_seed_where_one_more_trial_would_leave_it_too_little(facts: Any) -> None:
    """Behind a sampled trial's turn (a float16 sample of 15 s), a 3-minute CNN search's combination came at 99 s of
    180 and kept one confirmation round of three. Where its environment's worker is warm and one more trial would
    leave too little for its first look (an arm), its rounds and your runs, it goes first while that fits; with
    time to spare, or too little for it anyway, the seeds keep their turn."""
    waiting = {}
    for left in (300.0, 82.0, 2.0):
        study, defaults = _apart(facts, 1.01)  # its environment within the noise: the combination waits for the seeds
        options = SearchOptions(budget_s=300, storage="sqlite://", study="fill", seed=1)
        loop = SearchLoop(study, "cnn", facts, CTX, {}, options, Budget.start(left), lambda event: None,
                          seeds=[("seed", {**defaults, "batch_per_rank": 16})],
                          measurer=Warm(defaults, {**defaults, **HEURISTIC}))
        loop.noise = NOISE
        loop.prepare()
        waiting[left] = [t.user_attrs[Attr.ROLE] for t in _waiting(study)]
        if waiting[left]:  # and the loop admits it (it would wait unmeasured where its own check refused it)
            estimate = loop.turns.next_estimate_s()
            assert estimate is not None and loop.budget.left() - loop.reserve_s(estimate) >= estimate
    assert waiting == {300.0: [], 82.0: ["combined"], 2.0: []}  # it needs 81 s here (3 s and its rounds)


def test_a_seed_that_may_make_the_combinations_in_process_part_faster_goes_before_it(facts: Any) -> None:
    """Two 3-minute CNN searches combined a pinning with bfloat16 alone, the in-process winner so far, right after
    the pinning's first look; bfloat16 + channels_last, the next seed, was not measured before the confirmation,
    and bfloat16 alone was offered (1.60x, 1.67x) where the two searches before offered bfloat16 + channels_last
    (1.78x, 1.86x). A seed that keeps the winner's changes and adds to them now goes first, an arm as cheap as the
    combination's, which is then made with the faster, while the combination's look and its rounds still fit after
    it (one per winner); where one more trial would leave too little for both looks, the combination with the
    winner so far, while it fits."""
    def ahead(left: float, objective: float | None = None) -> list[tuple[str, Any, Any]]:
        study, defaults = _apart(facts, 1.2)  # channels_last 1.3x in the defaults' worker, the environment 1.2x
        both = {**defaults, "channels_last": True, "amp_dtype": "bfloat16"}
        if objective is not None:  # measured before
            _add(study, "seed", both, objective, 2.8, "in-process pairs", 0.0)
        seeds = [("seed", {**defaults, "batch_per_rank": 16}), ("seed", both),
                 ("seed", {**both, "amp_dtype": "float16"})]
        loop = SearchLoop(study, "cnn", facts, CTX, {}, SearchOptions(budget_s=300, storage="sqlite://", study="f"),
                          Budget.start(left), lambda event: None, seeds=seeds,
                          measurer=Warm(defaults, {**defaults, **HEURISTIC}))
        loop.noise = NOISE
        assert loop.turns.next_estimate_s() == in_process_estimate_s(study)  # an arm of the defaults' worker either way
        assert loop.turns.enqueue_ahead()
        return [(t.user_attrs[Attr.ROLE], t.system_attrs["fixed_params"]["amp_dtype"],
                 t.system_attrs["fixed_params"]["threads"]) for t in _waiting(study)]

    defaults = spaces.defaults(facts, CTX)
    threads, dtype, both = defaults["threads"], defaults["amp_dtype"], {**defaults, "channels_last": True,
                                                                       "amp_dtype": "bfloat16"}
    assert ahead(300.0) == [("seed", "bfloat16", threads)]
    assert ahead(84.0) == [("combined", dtype, 1)]  # the combination needs 81 s here (3 s and its rounds), its seed 3
    assert ahead(300.0, 1.8) == [("combined", "bfloat16", 1)]  # measured the winner: the combination carries it
    assert ahead(300.0, 1.2) == [("combined", dtype, 1)]  # measured slower: float16 does not go first

    waiting = {}  # the environment within the noise: the combination waits for the seeds, unless due
    for left in (300.0, 85.0, 82.0):
        study, defaults = _apart(facts, 1.01)
        loop = SearchLoop(study, "cnn", facts, CTX, {}, SearchOptions(budget_s=300, storage="sqlite://", study="f"),
                          Budget.start(left), lambda event: None, seeds=[("seed", {**defaults, "batch_per_rank": 16}),
                                                                         ("seed", both)],
                          measurer=Warm(defaults, {**defaults, **HEURISTIC}))
        loop.noise = NOISE
        loop.prepare()
        waiting[left] = [(t.user_attrs[Attr.ROLE], t.system_attrs["fixed_params"].get("amp_dtype"))
                         for t in _waiting(study)]
    # the combination alone needs 81 s here (an arm of 3 s and its rounds), with the seed's look first 84 s
    assert waiting == {300.0: [], 85.0: [("seed", "bfloat16")], 82.0: [("combined", defaults["amp_dtype"])]}


class Racing(Warm):
    """``Warm``, whose candidates read 1.15x [0.95-1.40] however many pairs (wide: the race goes on while its time
    holds a round), each round 8 s on a clock of its own; where ``told`` names an environment, each round is one
    process pair of it (``factor_ratios``), as the live measurer's race of an environment runs."""

    def __init__(self, defaults: dict[str, Any], told: str | None = None) -> None:
        super().__init__(defaults)
        self.now, self.rounds, self.told = 0.0, 0, told

    def more(self, handle: object, n: int, timeout_s: float, confidence: float = 0.95) -> Interval:
        self.now += 8.0
        self.rounds += 1
        if self.told is not None:
            self.factor_ratios.setdefault(self.told, []).append(1.15)
        return Interval(1.15, 0.95, 1.40, confidence, 3 + self.rounds)

    def method(self, handle: object, params: dict[str, Any]) -> str:
        return "process pairs"

    def end(self, handle: object) -> TrialResult:
        return TrialResult(Status.OK, objective=1.15, speedup_low=0.95, speedup_high=1.4, method="process pairs")


def test_an_environments_race_leaves_what_follows_it_its_time(facts: Any) -> None:
    """The heuristic's race settled its factor over 5-6 process pairs (37-45 s, where the due rule priced 3) and took
    the time its plan had counted for the seed that goes before its combination: a 3-minute CNN demo combined the
    pinning with bfloat16 alone. An environment's seed now keeps what follows it: its combination (priced as the
    reserve prices a candidate) and the looks of it and of that seed; its race stops a round earlier and says so.
    Nothing for the defaults' environment, a sampled trial, or once a combination carries the winner."""
    study, defaults = _apart(facts, 1.2)
    both = {**defaults, "channels_last": True, "amp_dtype": "bfloat16"}
    other = {**defaults, "threads": 1, "interop_threads": 2}  # an environment not measured yet
    look = in_process_estimate_s(study)

    def race(role: str, left: float, told: bool = False) -> tuple[int, str | None]:
        measurer = Racing(defaults, environment_key(other) if told else None)
        loop = SearchLoop(study, "cnn", facts, CTX, {}, SearchOptions(budget_s=300, storage="sqlite://", study="f"),
                          Budget.start(left, clock=lambda: measurer.now), lambda event: None, seeds=[("seed", both)],
                          measurer=measurer)
        _, why = loop._race(object(), NOISE, loop.budget.deadline, other, 0.0, 0, role)
        return measurer.rounds, why

    then, looks = _loop(study, facts, Warm(defaults), [("seed", both)]).turns.following(other, "heuristic")
    assert looks == pytest.approx(2 * look) and len(then) == 1  # the seed's look, then the combination's
    assert params_key(then[0][1]) == params_key({**defaults, "channels_last": True, "threads": 1,
                                                 "interop_threads": 2})
    seeded, sampled = race("heuristic", 120.0), race("search", 120.0)
    assert seeded[0] < sampled[0] and seeded[1] == "the time its confirmation and its combination need is kept"
    assert sampled[1] == "the time its confirmation needs is kept", (seeded, sampled)
    # its confirmation round is one process pair, priced from its pairs' time, not its whole time outside windows
    assert race("search", 120.0, told=True)[0] > sampled[0]
    loop = _loop(study, facts, Warm(defaults), [("seed", both)])
    assert loop.turns.following({**defaults, "batch_per_rank": 16}, "seed") == ([], 0.0)  # the defaults' environment
    _add(study, "seed", both, 1.2, 2.8, "in-process pairs", 0.0)  # measured slower: no seed goes first
    assert loop.turns.following(other, "heuristic")[1] == pytest.approx(look)
    _add(study, "combined", {**defaults, **HEURISTIC, "channels_last": True}, 1.5, 4.0, "process pairs", 0.0)
    assert loop.turns.following(other, "heuristic") == ([], 0.0)  # it would have to beat the winner's combination


class Unbound(Warm):
    """``Warm``, whose workers are those of the params it was given: a pinned environment's first look 1.2x, run
    unbound (``memory_policy`` default, as a worker reports it where numactl is missing), its worker warm after it."""

    def __init__(self, defaults: dict[str, Any]) -> None:
        super().__init__(defaults)
        self.given: list[dict[str, Any]] = []

    def begin(self, params: dict[str, Any], timeout_s: float) -> TrialResult:
        self.given.append(params)
        self.warm_envs.append(environment_key(params))
        return TrialResult(Status.OK, objective=1.2, speedup_low=1.1, speedup_high=1.3, method="process pairs",
                           pairs=3, loss=1.0, loss_samples=1024, wall_s=22.0, timed_s=6.0, startup_s=16.0,
                           in_effect={"memory_policy": "default"})


def test_a_pinned_environment_is_asked_as_it_runs_where_its_memory_cannot_be_bound(facts: Any) -> None:
    """Where numactl is missing (a fresh machine), a pinned environment runs unbound and its record says ``membind``
    False (``verdict.record``). Asked without it, its worker and factor were keyed otherwise than its record: a
    3-minute CNN demo read the heuristic's combination with bfloat16 + channels_last as another environment, priced
    it as new process pairs, passed it over at the budget's end five times and confirmed bf16 + channels_last alone
    (1.86x [1.57-2.21]). Asked as it runs here (``spaces.as_run``), the record's environment is its worker's: the
    combination fills the budget's end, an arm of that worker."""
    machine = replace(two_sockets(facts), runtime=replace(facts.runtime, numactl_path=None))
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=3))
    study.set_user_attr("noise", asdict(NOISE))
    study.set_user_attr("baseline_loss", 1.0)
    defaults = spaces.defaults(machine, CTX)
    pinned = {**defaults, "affinity": "compact"}
    assert spaces.memory_nodes(pinned, machine)  # its pinning implies a binding, which cannot happen here
    _add(study, "baseline", defaults, 1.0, 15.0, "in-process pairs", 1.6)
    _add(study, "seed", {**defaults, "channels_last": True}, 1.3, 2.8, "in-process pairs", 0.0)
    for batch in (8, 64):  # the sampled third taken: the next turn is a seed's
        _add(study, "in-process", {**defaults, "batch_per_rank": batch}, 1.05, 2.8, "in-process pairs", 0.0)
    study.enqueue_trial(pinned, user_attrs={Attr.ROLE: "heuristic"})
    measurer = Unbound(defaults)
    loop = SearchLoop(study, "cnn", machine, CTX, {}, SearchOptions(budget_s=300, storage="sqlite://", study="pin"),
                      Budget.start(60), lambda event: None, seeds=[("seed", {**defaults, "batch_per_rank": 16})],
                      measurer=measurer)
    loop.noise = NOISE
    loop._next(0, None)
    recorded = study.get_trials(deepcopy=False)[-1].user_attrs[Attr.PARAMS]
    assert measurer.given[-1]["membind"] is False and recorded["membind"] is False
    assert loop.turns.fill(20.0)
    waiting = _waiting(study)
    assert [t.user_attrs[Attr.ROLE] for t in waiting] == ["combined"]
    assert waiting[0].system_attrs["fixed_params"]["channels_last"] is True


def test_an_environments_seed_ahead_of_a_seeds_turn_keeps_that_seeds_time(facts: Any) -> None:
    """A busy 3-minute CNN demo pulled the heuristic ahead of the bfloat16 seed's turn right after the calibration;
    its race took 47 s and left that seed no look: 1.21x provisional where the demo before confirmed bfloat16 at 1.62x.
    An environment's seed that went ahead of a seed's turn (``Attr.AHEAD``) now keeps that seed's look and rounds,
    first, beside its plan's (``Turns.displaced``); its race stops earlier, saying so. A seed the plan already looks
    at (the combination's extension) is looked at once; one a sample measured keeps nothing."""
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=3))
    study.set_user_attr("noise", asdict(NOISE))
    defaults = spaces.defaults(facts, CTX)
    _add(study, "baseline", defaults, 1.0, 15.0, "in-process pairs", 1.6)  # the calibration only, as in the demo
    bf16, other = {**defaults, "amp_dtype": "bfloat16"}, {**defaults, "threads": 1, "interop_threads": 2}

    def race(study: optuna.Study, seed: dict[str, Any], ahead: bool, left: float) -> tuple[int, str | None]:
        measurer = Racing(defaults)
        loop = SearchLoop(study, "cnn", facts, CTX, {}, SearchOptions(budget_s=180, storage="sqlite://", study="f"),
                          Budget.start(left, clock=lambda: measurer.now), lambda event: None, seeds=[("seed", seed)],
                          measurer=measurer)
        _, why = loop._race(object(), NOISE, loop.budget.deadline, other, 0.0, 0, "heuristic", ahead)
        return measurer.rounds, why

    turns = _loop(study, facts, Warm(defaults), [("seed", bf16)]).turns
    assert turns.following(other, "heuristic") == ([], 0.0)  # no in-process winner: no combination planned
    then, looks = turns.displaced(planned=False)
    assert [params_key(p) for _, p in then] == [params_key(turns.asked(bf16))]
    assert looks == pytest.approx(in_process_estimate_s(study))
    rounds = {left: (race(study, bf16, False, left), race(study, bf16, True, left)) for left in range(60, 141, 20)}
    kept = "the time its confirmation and the seed it went ahead of need is kept"
    assert all(ahead[0] < behind[0] and ahead[1] == kept for behind, ahead in rounds.values()), rounds
    _add(study, "in-process", turns.asked(bf16), 1.6, 3.0, "in-process pairs", 0.0)  # a sample measured it first
    assert turns.displaced(planned=False) == ([], 0.0)
    study, defaults = _apart(facts, 1.2)  # channels_last won in the defaults' worker: a combination is planned
    both = {**defaults, "channels_last": True, "amp_dtype": "bfloat16"}
    extended = _loop(study, facts, Warm(defaults), [("seed", both)]).turns
    assert extended.following(other, "heuristic")[1] == pytest.approx(2 * in_process_estimate_s(study))
    then, looks = extended.displaced(planned=True)
    assert [params_key(p) for _, p in then] == [params_key(extended.asked(both))] and looks == 0.0
    assert race(study, both, True, 120.0)[1] == \
        "the time its confirmation, the seed it went ahead of and its combination need is kept"
