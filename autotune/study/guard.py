"""The quality guard's second look: where a candidate's loss lands near the limit, whether this workload's loss can
resolve the limit, and if not, the candidate measured against the defaults at several training seeds.

The guard compares one loss with one loss (``verdict.quality``), each taken after the same samples at the
search's training seed. A loss also moves with that seed (initial weights, data order). Where a candidate lands
within ``max(limit / 2, NEAR)`` of the limit (2.5-7.5% for the default +5%), the defaults' loss is taken at
``SPREAD_SEEDS`` more seeds, once per study, by fresh arms of the defaults' worker (``StudyAttr.LOSS_SPREAD``):

- where the seeds' losses differ (highest - lowest, over their mean) by no more than the limit, the one loss
  decides, as before;
- where they differ by more, one loss against one loss cannot resolve the limit on this workload. Then the
  candidate is trained at each of those seeds too and its loss compared with the defaults' at the same seed
  (same initial weights, same data order), every loss taken over the wide held-out set
  (``workloads.held_out_sets``: up to four times the samples). Measured on the bundled CNN: the defaults' loss
  spans 25% over seeds 0-2, bf16's loss stays within 0.3% of the defaults' at each seed. Every seed's increase
  within the limit passes; every seed's over it rejects; where the seeds disagree the guard cannot resolve the
  limit: the candidate is not offered and its reason says so (neither passed nor rejected on one seed's noise).
  The limit is never widened.

The second look's arms train in the defaults' worker, the candidate's environment-level knobs replaced by the
defaults' (threads, allocator and the like change how fast a step runs, not what it computes); a candidate of
several processes (ranks average their gradients) is left to the first look, and its note says so.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

from ..errors import TrialError
from ..trial.spec import Status, TrialResult
from . import verdict
from .records import StudyAttr, params_key

if TYPE_CHECKING:
    import optuna

    from ..measure import LossReading, Noise, PairedMeasurer
    from .budget import Budget
    from .options import SearchOptions

SPREAD_SEEDS = 2  # training seeds besides the search's own that the defaults' loss is taken at
NEAR = 0.01  # a loss this close to the limit (relative), at the least, is near it (a limit of 0 included)
MIN_LOOK_S = 5.0  # a second look is not begun with less time left than this
CANNOT_RESOLVE = "the quality guard cannot resolve its"  # how a reason of the unresolved begins (``choice``)


def near_limit(increase: float, tolerance: float) -> bool:
    """Whether a loss ``increase`` over the baseline's lies close enough to the limit for the seed to decide.

    >>> near_limit(0.04, 0.05), near_limit(0.08, 0.05), near_limit(0.001, 0.05), near_limit(0.005, 0.0)
    (True, False, False, True)
    """
    return increase < verdict.UNBOUNDED and abs(increase - tolerance) <= max(tolerance / 2, NEAR)


def spread(losses: list[float]) -> float:
    """The losses' range over their mean's magnitude (infinite where the mean is 0 and they differ).

    >>> round(spread([1.0, 1.1, 0.9]), 3), spread([0.0, 0.0])
    (0.2, 0.0)
    """
    mean, width = sum(losses) / len(losses), max(losses) - min(losses)
    return width / abs(mean) if mean else (0.0 if width == 0 else math.inf)


def below_defaults(high: float | None, noise: Noise | None) -> bool:
    """Whether an interval whose high bound is ``high`` lies wholly below 1 - the calibrated margin: its candidate
    cannot be the recipe and needs no loss (the race skips it, ``Guard.of_result`` takes the result without)."""
    return high is not None and high < 1 - (noise.margin if noise is not None else 0.0)


class Guard:
    """The quality guard of one search: the first look (``verdict.quality``), and the second where it is near
    the limit. ``measurer``: its second look takes ``losses`` where the measurer can (``second_look``); else
    there is none. The verdicts of second looks are kept by recipe for the search's later looks at it."""

    def __init__(self, study: optuna.Study, options: SearchOptions, measurer: PairedMeasurer, budget: Budget,
                 seed: int, on_phase: Any = None) -> None:
        self.study, self.options, self.measurer, self.budget, self.seed = study, options, measurer, budget, seed
        self.on_phase = on_phase or (lambda name, detail: None)
        self.second: dict[str, tuple[float, str | None, str]] = {}
        # Ctrl-C or SIGTERM in a second look: the trial is recorded interrupted, then it is raised
        self.interrupted: KeyboardInterrupt | None = None

    def of_result(self, params: dict[str, Any], result: TrialResult,
                  noise: Noise | None) -> tuple[float, str | None, str | None] | None:
        """The verdict on a measured candidate's result (``verdict``), as ``verdict.record`` takes it; a candidate
        whose interval lies wholly below 1 - margin (the race's ``SLOWER``, a race that ended there unsaid, a
        hopeless arm) took no loss and needs none, it cannot be the recipe; None: the first look on whatever loss
        the result has."""
        if result.status != Status.OK:
            return None
        if result.loss is not None and math.isfinite(result.loss):
            return self.verdict(params, result.loss, result.loss_source)
        if result.loss is None and below_defaults(result.speedup_high, noise):
            return 0.0, None, "no loss taken: its interval lies below the defaults, it cannot be the recipe"
        return None

    def verdict(self, params: dict[str, Any], loss: float,
                source: str | None = None) -> tuple[float, str | None, str | None]:
        """``(increase, why it is rejected or None, what the second look found or None)`` for ``loss``; the second
        look takes a minute of the budget at most, and never past the search's deadline."""
        deadline = min(self.budget.deadline, self.budget.now() + 60.0)
        tolerance = self.options.max_loss_increase
        increase, reason = verdict.quality(self.study, self.options, loss, source)
        key = params_key(params)
        if key in self.second:
            return self.second[key]
        if not near_limit(increase, tolerance) or not self.measurer.second_look:
            return increase, reason, None
        if self.budget.left(deadline) < MIN_LOOK_S:
            return increase, reason, "too little time left to take the defaults' loss at other seeds"
        try:
            return self._second_look(params, increase, reason, deadline)
        except KeyboardInterrupt as e:  # the caller records the trial interrupted, then raises it (``SearchLoop``)
            self.interrupted = e
            return increase, reason, "the second look was stopped by Ctrl-C"

    def _second_look(self, params: dict[str, Any], increase: float, reason: str | None,
                     deadline: float) -> tuple[float, str | None, str]:
        """``verdict``'s look past the one loss: the defaults' spread over training seeds, then, where it is over the
        limit, the candidate at those seeds."""
        tolerance, key = self.options.max_loss_increase, params_key(params)
        try:
            seeds = self._spread(deadline)
        except TrialError as e:
            return increase, reason, f"the defaults' loss at other seeds could not be taken ({e})"
        normal = spread(seeds["losses"])
        said = (f"the defaults' loss differs by {normal:.1%} between {len(seeds['losses'])} training seeds "
                f"on {seeds['held_out']} held-out samples")
        if normal <= tolerance:
            return increase, reason, said + f": within the +{tolerance:.0%} limit, this loss decides"
        if params.get("processes", 1) > 1:
            return increase, reason, said + ": over the limit; a recipe of several processes has no second look"
        found = self._seeds_look(params, seeds, deadline, said)
        self.second[key] = found
        return found

    def _spread(self, deadline: float) -> dict[str, Any]:
        """The defaults' losses at the search's seed and ``SPREAD_SEEDS`` more (over the held-out set and the wide
        one), taken once per study."""
        recorded = self.study.user_attrs.get(StudyAttr.LOSS_SPREAD)
        if recorded is not None:
            return recorded
        seeds = [self.seed + k for k in range(SPREAD_SEEDS + 1)]
        self.on_phase("quality guard", f"the defaults' loss at seeds {', '.join(map(str, seeds))}")
        statuses = self.measurer.losses([(self.measurer.defaults, s) for s in seeds],
                                        max(1.0, self.budget.left(deadline)), wide=True)
        failed = _failure(statuses)
        if failed is not None:
            raise TrialError(failed)
        base = self.study.user_attrs.get(StudyAttr.BASELINE_LOSS)
        losses = [base if base is not None else statuses[0].loss, *(s.loss for s in statuses[1:])]
        held_out, wide = statuses[0].held_out or (0, 0)
        wide_losses = [s.wide_loss for s in statuses]  # None: the workload evaluates itself, no wide set
        recorded = {"seeds": seeds, "losses": losses,
                    "wide_losses": None if None in wide_losses else wide_losses,
                    "samples": statuses[0].loss_samples, "held_out": held_out, "wide": wide}
        self.study.set_user_attr(StudyAttr.LOSS_SPREAD, recorded)
        return recorded

    def _seeds_look(self, params: dict[str, Any], seeds: dict[str, Any], deadline: float,
                    said: str) -> tuple[float, str | None, str]:
        """The candidate at each of the defaults' seeds, each loss against the defaults' at the same seed."""
        tolerance = self.options.max_loss_increase
        wide = seeds["wide_losses"] is not None  # None: the workload evaluates itself, no wider set
        base = seeds["wide_losses"] if wide else seeds["losses"]
        over = f"{seeds['wide']} held-out samples" if wide else "the workload's own evaluation"
        self.on_phase("quality guard", f"the recipe's loss at seeds {', '.join(map(str, seeds['seeds']))}")
        try:
            statuses = self.measurer.losses([(params, s) for s in seeds["seeds"]],
                                             max(1.0, self.budget.left(deadline)), wide=wide)
            why = _failure(statuses)
        except TrialError as e:
            statuses, why = [], str(e)
        if why is not None:
            return (verdict.UNBOUNDED, f"{CANNOT_RESOLVE} +{tolerance:.0%} limit on this "
                    f"workload ({said}), and this recipe's loss at those seeds could not be taken: {why}", said)
        # each took its loss (``_failure``); the wide one, as the defaults' did (``wide``)
        losses = cast("list[float]", [s.wide_loss if wide else s.loss for s in statuses])
        increases = [verdict.relative_increase(loss, b) for loss, b in zip(losses, base, strict=True)]
        each = ", ".join(f"{i:+.1%}" if i < verdict.UNBOUNDED else "unbounded" for i in increases)
        said += f"; this recipe's loss against the defaults' at each seed, over {over}: {each}"
        if all(i <= tolerance for i in increases):
            return max(increases), None, said
        if all(i > tolerance for i in increases):
            return min(increases), (f"loss {each} over the defaults' at seeds {', '.join(map(str, seeds['seeds']))} "
                                    f"(limit +{tolerance:.0%})"), said
        return max(increases), f"{CANNOT_RESOLVE} +{tolerance:.0%} limit on this workload: {said}", said


def _failure(statuses: list[LossReading]) -> str | None:
    """Why the first arm of ``statuses`` that took no loss failed, or None when every one took its loss."""
    failed = next((s for s in statuses if s.state != "ok" or s.loss is None), None)
    return None if failed is None else f"arm {failed.arm}: {failed.state} {failed.error or ''}".strip()
