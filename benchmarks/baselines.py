"""The search benchmark's baselines (issue 58, item 3): each an Optuna sampler that ``search(..., sampler=)`` asks
for every trial after the baseline, under the same measurer, clock and confirmation as autotune's own search.

Random search and TPE at its defaults are Optuna's. The planned ones are here: one factor at a time from the
defaults, the seed list alone, and the grid in random order cut at the budget. A plan names each trial's point (the
searched knobs' values, as ``search_quality._axes`` gives them) from what the study measured so far; a knob it does
not name keeps its default. When a plan is done it asks for the defaults again, which the search skips as a recipe
measured before, and 25 such skips in a row end it by 'space': the budget is not spent on anything else.
"""
from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna

from autotune.study.records import BASELINE, CONFIRM, TrialRecord, records
from autotune.trial.spec import Status

Point = dict[str, Any]
STEP = 1.02  # one factor at a time moves to a value measured at least this much faster than where it stands
SWEEPS = 2


@dataclass(frozen=True)
class Plan:
    """What a planned baseline knows of the grid: the defaults' knobs, the grid's key of a recipe, each searched
    knob's values (an axis: the knobs each value sets), the search's seed list (its points, in order) and the input
    seeds it puts first where the baseline waits for data (``autotune.study.seeds.input_seeds`` of the wait)."""

    defaults: Point
    key: Callable[[Point], tuple[Any, ...]]
    axes: list[list[Point]]
    seeds: list[Point]
    input_seeds: Callable[[float | None], list[Point]] = lambda wait: []

    def cells(self) -> list[Point]:
        return [{k: v for part in combo for k, v in part.items()} for combo in itertools.product(*self.axes)]


class Planned(optuna.samplers.BaseSampler):
    """Each trial's point from ``next_point``; an enqueued trial (the baseline) keeps its own."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.points: dict[int, Point] = {}

    def next_point(self, measured: dict[tuple[Any, ...], float], rows: list[TrialRecord]) -> Point | None:
        raise NotImplementedError

    def measured(self, rows: list[TrialRecord]) -> dict[tuple[Any, ...], float]:
        """Each recipe the search tried (its grid key), with its best speedup; -inf where it failed, was
        infeasible or skipped: tried, not to be tried again."""
        out: dict[tuple[Any, ...], float] = {}
        for r in rows:
            if r.role == CONFIRM:
                continue
            ok = r.feasible and r.result.status == Status.OK and r.result.objective is not None
            key = self.plan.key(r.params)
            out[key] = max(out.get(key, -math.inf), r.result.objective if ok else -math.inf)  # type: ignore[type-var]
        return out

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if "fixed_params" not in trial.system_attrs:
            rows = records(study)
            self.points[trial.number] = self.next_point(self.measured(rows), rows) or {}

    def infer_relative_search_space(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
        return {}

    def sample_relative(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
                        search_space: dict[str, Any]) -> dict[str, Any]:
        return {}

    def sample_independent(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, param_name: str,
                           param_distribution: Any) -> Any:
        point = self.points.get(trial.number, {})
        if param_name in point:
            return point[param_name]
        if param_name not in self.plan.defaults:
            raise KeyError(f"{type(self).__name__}: the plan has no value for {param_name!r} and it has no default")
        return self.plan.defaults[param_name]


class Listed(Planned):
    """Points in a set order, each once: the seed list alone, or the grid's cells shuffled."""

    def __init__(self, plan: Plan, points: list[Point]) -> None:
        super().__init__(plan)
        self.order = points

    def next_point(self, measured: dict[tuple[Any, ...], float], rows: list[TrialRecord]) -> Point | None:
        return next((p for p in self.order if self.plan.key({**self.plan.defaults, **p}) not in measured), None)


class SeedList(Listed):
    """The search's seeds alone, in its order: where the baseline waits for data, its input seeds first (as
    ``Turns.seed_the_input`` puts them), then the list fixed before the calibration."""

    def next_point(self, measured: dict[tuple[Any, ...], float], rows: list[TrialRecord]) -> Point | None:
        base = next((r for r in rows if r.role == BASELINE and r.result.status == Status.OK), None)
        self.order = [*self.plan.input_seeds(base.result.data_wait if base else None), *self.plan.seeds]
        return super().next_point(measured, rows)


class OneFactor(Planned):
    """From the defaults, each knob in turn: every value of it with the others where they stand, then move to the
    fastest if at least ``STEP`` faster; ``SWEEPS`` sweeps over the knobs (a move can make another knob's values
    worth trying again)."""

    def next_point(self, measured: dict[tuple[Any, ...], float], rows: list[TrialRecord]) -> Point | None:
        def key(p: Point) -> tuple[Any, ...]:
            return self.plan.key({**self.plan.defaults, **p})

        current: Point = {}
        for _ in range(SWEEPS):
            for axis in self.plan.axes:
                options = [{**current, **value} for value in axis]
                untried = next((p for p in options if key(p) not in measured), None)
                if untried is not None:
                    return untried
                best = max(options, key=lambda p: measured[key(p)])
                if measured[key(best)] >= STEP * measured.get(key(current), 1.0):
                    current = best
        return None


def random_search(seed: int, plan: Plan) -> optuna.samplers.BaseSampler:
    # each baseline its own seed: TPE's start-up trials are a RandomSampler of its seed (one seed for all drew the
    # same first trials, and a 6-trial replay read identical figures for the sampler alone, random search and TPE)
    return optuna.samplers.RandomSampler(seed=100_003 + seed)


def tpe_defaults(seed: int, plan: Plan) -> optuna.samplers.BaseSampler:
    return optuna.samplers.TPESampler(seed=200_003 + seed)


def one_factor(seed: int, plan: Plan) -> optuna.samplers.BaseSampler:
    return OneFactor(plan)


def seed_list(seed: int, plan: Plan) -> optuna.samplers.BaseSampler:
    return SeedList(plan, plan.seeds)


def grid_order(seed: int, plan: Plan) -> optuna.samplers.BaseSampler:
    cells = plan.cells()
    random.Random(300_007 + seed).shuffle(cells)
    return Listed(plan, cells)


# (name, seeded, sampler for a seed and the plan, or None: autotune's), each under the same measurer, clock and
# confirmation; the first two always run (what the search adds beyond its seeds), the rest with --baselines
STRATEGIES: list[tuple[str, bool, Callable[[int, Plan], optuna.samplers.BaseSampler] | None]] = [
    ("autotune", True, None), ("sampler alone", False, None), ("random", False, random_search),
    ("tpe defaults", False, tpe_defaults), ("one factor", False, one_factor), ("seed list", False, seed_list),
    ("grid order", False, grid_order)]
