"""A trial's time limit: its own, from the estimates of its kind (``own_limit_s``), within what the budget leaves
beside the time kept for the confirmation (``timeout_s``); and how a trial stopped at a limit reads (``judged``)."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..trial.spec import Status, TrialResult
from .budget import estimate_s
from .reserve import reserve_s

if TYPE_CHECKING:
    import optuna

    from .options import SearchOptions


def own_limit_s(study: optuna.Study, options: SearchOptions, params: dict[str, Any],
                estimate: float | None) -> float:
    """The trial's own time limit, the budget aside: 5x the estimate of its kind (at least 60 s). A compile mode
    not measured yet may take a quarter of the budget (at least 60 s): its first trial may take far longer than
    any measured so far, and a compile slower than that could not pay for itself in a run this budget is tuned
    for. Infinite where nothing of its kind was measured yet: only the budget limits it. A trial stopped at this
    limit stopped answering (a ``timeout``); one stopped earlier by the budget was cut (``judged``)."""
    mode = params.get("compile_mode") or "none"
    if mode != "none":
        estimate = estimate_s(study, mode)
        if estimate is None:
            return math.inf if options.budget_s is None else max(60.0, options.budget_s / 4)
    return math.inf if estimate is None else max(60.0, 5 * estimate)


def timeout_s(study: optuna.Study, options: SearchOptions, params: dict[str, Any], remaining: float,
              estimate: float | None) -> float:
    """The trial's time limit: its own (``own_limit_s``), never into the time kept for the confirmation
    (``reserve_s``): a trial that would need it is cut and the candidates already found are still confirmed."""
    available = max(1.0, remaining - reserve_s(study, options, estimate_s(study), left=remaining))
    return min(available, own_limit_s(study, options, params, estimate))


def judged(result: TrialResult, timeout: float, own_s: float) -> TrialResult:
    """A trial's result as the candidate's own: a ``timeout`` where its limit was the budget's (``timeout`` below
    its own limit ``own_s``) is ``cut`` (the search's time ran out, not the candidate's: a confirmation decides on
    the rounds that completed, the sampler learns nothing from it); one at its own limit stopped answering, and
    says so."""
    if result.status != Status.TIMEOUT:
        return result
    if timeout < own_s:
        return replace(result, status=Status.CUT, error=f"cut by the budget's end after {timeout:.0f} s (its own "
                                                       f"limit: {_seconds(own_s)}): {result.error}")
    return replace(result, error=f"stopped answering within its own limit of {own_s:.0f} s: {result.error}")


def _seconds(value: float) -> str:
    return "none yet" if math.isinf(value) else f"{value:.0f} s"


__all__ = ["judged", "own_limit_s", "timeout_s"]
