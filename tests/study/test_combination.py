"""The fastest environment and the fastest in-process knobs, measured apart, are tried together once."""
from __future__ import annotations

from typing import Any

import optuna
import pytest

from autotune import search_spaces as spaces
from autotune.study.combinations import combination, enqueue_combination
from autotune.study.records import Attr, params_key

CTX = spaces.SpaceContext(default_batch_size=32)


def _add(study: optuna.Study, role: str, params: dict[str, Any], objective: float, status: str = "ok") -> None:
    attrs = {Attr.ROLE: role, Attr.PARAMS: params, Attr.STATUS: status, "objective": objective}
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, value=objective,
                                              user_attrs=attrs))


@pytest.fixture
def measured(facts: Any) -> tuple[optuna.Study, dict[str, Any]]:
    """The defaults, a faster batch in their environment, one thread (another environment) as fast as them."""
    study = optuna.create_study(direction="maximize")
    defaults = spaces.defaults(facts, CTX)
    _add(study, "baseline", defaults, 1.0)
    _add(study, "search", {**defaults, "batch_per_rank": 64}, 1.3)
    _add(study, "search", {**defaults, "batch_per_rank": 16}, 1.1)
    _add(study, "heuristic", {**defaults, "threads": 1, "interop_threads": 1}, 1.04)
    return study, defaults


def test_the_fastest_environment_is_tried_with_the_fastest_in_process_knobs(measured: Any, facts: Any) -> None:
    study, defaults = measured
    both = {**defaults, "batch_per_rank": 64, "threads": 1, "interop_threads": 1}
    assert combination(study, facts, CTX) == both
    assert enqueue_combination(study, facts, CTX)
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    assert [t.user_attrs[Attr.ROLE] for t in waiting] == ["combined"]
    assert params_key(waiting[0].system_attrs["fixed_params"]) == params_key(both)
    assert not enqueue_combination(study, facts, CTX)  # one is waiting already
    trial = study.ask()  # as the loop does: the enqueued trial is asked first, with the combination's values
    assert params_key(spaces.suggest(trial, facts, CTX)) == params_key(both)
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    _add(study, "combined", both, 1.35)
    assert combination(study, facts, CTX) is None  # measured: not again


@pytest.mark.parametrize("factors", [False, True])
def test_an_environment_read_faster_alone_after_a_combination_gets_its_own(measured: Any, facts: Any,
                                                                             factors: bool) -> None:
    """Environments rank by their own speed: a combination measured in one carries the in-process gain too, so by its
    speedup that environment would stay the fastest, and one read faster alone later (a transformer's allocator alone
    after the heuristic's combination with bf16) would never be combined. Its own speed: its factor where the search
    recorded one (live), else its fastest trial that is neither a combination nor an interaction (a replay records
    no factor)."""
    study, defaults = measured  # the heuristic's environment read 1.04 alone
    heuristic = {**defaults, "threads": 1, "interop_threads": 1}
    _add(study, "combined", {**heuristic, "batch_per_rank": 64}, 1.35)
    if factors:  # its factor above what the seed below reads alone: the factor ranks, not the reading
        study = _with_factor(study, 1.08)
    assert combination(study, facts, CTX) is None  # the only environment: combined already
    faster = {**defaults, "threads": 1}
    _add(study, "seed", faster, 1.06)
    if factors:
        assert combination(study, facts, CTX) is None  # 1.06 alone, under the heuristic's factor
        study = _with_factor(study, 1.1)
    assert combination(study, facts, CTX) == {**faster, "batch_per_rank": 64}
    _add(study, "interaction", {**defaults, "interop_threads": 1, "batch_per_rank": 64}, 1.4)  # no speed of its own
    assert combination(study, facts, CTX) == {**faster, "batch_per_rank": 64}
    if factors:  # an environment's newest factor, over the most process pairs, is its speed
        _add(study, "search", {**heuristic, "batch_per_rank": 16}, 1.2)
        study = _with_factor(study, 1.2)
        assert combination(study, facts, CTX) is None  # the heuristic's environment first again: combined already


def test_no_combination_without_a_gain_on_both_sides_or_with_fixed_knobs(measured: Any, facts: Any) -> None:
    study, defaults = measured
    assert combination(study, facts, CTX, fixed={"batch_per_rank": 64}) is not None  # --fix holds
    assert combination(study, facts, CTX, fixed={"threads": 2})["threads"] == 2  # type: ignore[index]

    slower = optuna.create_study(direction="maximize")
    _add(slower, "baseline", defaults, 1.0)
    _add(slower, "search", {**defaults, "batch_per_rank": 64}, 1.3)
    _add(slower, "heuristic", {**defaults, "threads": 1, "interop_threads": 1}, 0.8)  # slower than the defaults
    assert combination(slower, facts, CTX) is None

    within = optuna.create_study(direction="maximize")
    _add(within, "baseline", defaults, 1.0)
    _add(within, "search", {**defaults, "batch_per_rank": 64}, 1.01)  # within the margin of the defaults
    _add(within, "heuristic", {**defaults, "threads": 1, "interop_threads": 1}, 1.2)
    assert combination(within, facts, CTX) is None


def test_a_combination_measured_is_taken_also_under_a_fix_its_environment_makes_moot(measured: Any,
                                                                                     facts: Any) -> None:
    """``--fix kmp_blocktime=1`` under GNU's OpenMP: the combination is asked as its trial records it (no blocktime),
    so once measured it is taken; read with the blocktime it was new again on every turn, each ask a duplicate
    skipped, and as many in a row end a search ("space")."""
    if "intel" not in spaces.preload.openmp_choices(facts):
        pytest.skip("this machine offers no Intel OpenMP: the blocktime is never asked")
    study, defaults = measured
    fixed = {"kmp_blocktime": 1}
    both = combination(study, facts, CTX, fixed=fixed)
    assert both is not None and both["openmp"] == "gnu" and both["kmp_blocktime"] is None, both
    _add(study, "combined", both, 1.35)
    assert combination(study, facts, CTX, fixed=fixed) is None


def test_a_combination_stopped_by_ctrl_c_is_tried_again_and_a_crashed_one_is_not(measured: Any, facts: Any) -> None:
    study, defaults = measured
    both = {**defaults, "batch_per_rank": 64, "threads": 1, "interop_threads": 1}

    def ended(status: str) -> None:
        assert enqueue_combination(study, facts, CTX)
        trial = study.ask()
        trial.set_user_attr(Attr.PARAMS, spaces.suggest(trial, facts, CTX))
        trial.set_user_attr(Attr.STATUS, status)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)

    ended("interrupted")
    assert combination(study, facts, CTX) == both  # the next search measures it
    ended("crash")
    assert combination(study, facts, CTX) is None


@pytest.mark.parametrize(("factor", "ahead"), [(None, True), (0.88, False), (1.1, True)])
def test_ahead_of_the_seeds_only_on_its_environments_own_gain(facts: Any, factor: float | None, ahead: bool) -> None:
    """A warm start of one thread with bfloat16 reads 1.2x where one thread's own factor (``environment_factor``)
    is 0.88x: its environment with the fastest in-process knobs is still a combination, but not one to take before
    the seeds left; where no factor is recorded, the trial's speedup is the environment's."""
    study = optuna.create_study(direction="maximize")
    defaults = spaces.defaults(facts, CTX)
    _add(study, "baseline", defaults, 1.0)
    _add(study, "search", {**defaults, "batch_per_rank": 64}, 1.3)
    _add(study, "warm-start", {**defaults, "threads": 1, "interop_threads": 1}, 1.2)
    if factor is not None:
        study = _with_factor(study, factor)
    assert combination(study, facts, CTX) is not None
    assert (combination(study, facts, CTX, ahead=True) is not None) == ahead


def _with_factor(study: optuna.Study, factor: float) -> optuna.Study:
    """``study`` again, its last trial carrying ``Attr.ENVIRONMENT_FACTOR`` as the loop records it."""
    again = optuna.create_study(direction="maximize")
    trials = study.get_trials(deepcopy=True)
    for t in trials[:-1]:
        again.add_trial(t)
    last = trials[-1]
    attrs = {**last.user_attrs, Attr.ENVIRONMENT_FACTOR: {"median": factor, "low": factor - 0.05,
                                                           "high": factor + 0.05, "confidence": 0.95, "count": 3}}
    again.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, value=last.value,
                                              user_attrs=attrs))
    return again
