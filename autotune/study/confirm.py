"""Confirmation: the top candidates re-measured with fresh pairs before one is declared best.

A search keeps its fastest measurement, and the fastest of many noisy measurements is biased upward
(the winner's curse). So the top ``confirm_top`` feasible recipes (by their search median; not those
whose search interval lies wholly below ``1 + margin``: they could not be offered) are measured
again against the defaults with FRESH pairs: a new seed for the windows' order, ``confirm_rounds x
noise.pairs`` pairs (at least 4), and every environment factor measured again over new process pairs.
Only these measurements decide: a recipe is offered when its confirmed speedup's low bound is above
``1 + margin`` (``Confirmation.best``); otherwise the defaults are kept, and the report says why. They
are trials of the study with role ``confirm`` (user attribute ``confirms``: the trial they re-measure),
so a resumed search keeps them and measures only what is missing.

The search loop keeps time for them in the budget (``autotune.study.budget.reserve_s``, from the measured
pair times); when the budget still runs out, the confirmation is shortened and the report says so.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..trial.lock import host_lock
from ..trial.spec import Status, TrialResult
from ..trial.stats import MIN_MARGIN
from . import budget
from .loop import SearchLoop
from .records import (
    CONFIRM,
    MEASURED,
    Attr,
    Candidate,
    Confirmation,
    TrialRecord,
    lineup,
    optuna_storage,
    params_key,
    records,
)

if TYPE_CHECKING:
    import optuna


def _earlier(study: optuna.Study) -> dict[str, TrialResult]:
    """Confirmations already in the study (an earlier, perhaps interrupted, search): by recipe."""
    return {params_key(r.params): r.result for r in records(study)
            if r.role == CONFIRM and r.result.status in MEASURED}  # an interrupted one is simply made again


def confirm(loop: SearchLoop) -> Confirmation | None:
    """Run the confirmation for ``loop``'s study (None when ``confirm_top`` is 0 or there is no baseline)."""
    options = loop.options
    if options.confirm_top <= 0:
        return None
    baseline, top = lineup(loop.study, options.confirm_top)
    if baseline is None:
        return None  # the search checks for a baseline before it confirms
    done = _earlier(loop.study)
    note, made, started = None, 0, time.monotonic()
    if not top:
        note = "no feasible recipe besides the defaults could be faster by the margin: nothing to confirm"
    reseed = getattr(loop.measurer, "reseed", None)  # fresh window orders and environment factors
    if reseed is not None and top:
        reseed(options.seed + 7919)
    for entry in top:
        key = params_key(entry.params)
        if key in done:
            continue
        remaining = loop.deadline - time.monotonic()
        needed = budget.confirm_s(entry.result, loop.noise, options)
        if remaining < max(1.0, 0.5 * needed):
            note = f"the budget ran out after {made} confirmation(s): the later candidates were not confirmed"
            break
        with host_lock():
            trial = new_trial(loop, entry.number)
            remaining = loop.deadline - time.monotonic()
            timeout = max(1.0, min(remaining, max(60.0, 3 * needed)))
            done[key] = loop.run_one(trial, CONFIRM, entry.params, timeout)
        made += 1

    def candidate(record: TrialRecord) -> Candidate:
        result = done.get(params_key(record.params))
        failed = f"{result.status}: {result.error}" if result is not None and result.status != Status.OK else None
        return Candidate(record.number, record.role, record.params, record.result.objective or 0.0,
                         result if failed is None else None, failed)

    confirmed = sorted((candidate(r) for r in top),
                       key=lambda c: (c.failed is not None, c.confirmed is None, -c.median))
    margin = loop.noise.margin if loop.noise is not None else MIN_MARGIN
    return Confirmation(Candidate(baseline.number, baseline.role, baseline.params, 1.0, baseline.result),
                        tuple(confirmed), note, made, time.monotonic() - started, margin)


def new_trial(loop: SearchLoop, source: int, round_: int = 0) -> optuna.Trial:
    """A RUNNING trial of the study with the params (and distributions) of trial ``source``, claimed by
    this search. Not asked from the sampler: another worker cannot pop it as an enqueued trial can be."""
    import optuna

    storage, study_id = optuna_storage(loop.study)
    frozen = storage.get_trial(storage.get_trial_id_from_study_id_trial_number(study_id, source))
    template = optuna.trial.create_trial(
        state=optuna.trial.TrialState.RUNNING, params=frozen.params, distributions=frozen.distributions,
        user_attrs={Attr.ROLE: CONFIRM, Attr.CONFIRMS: source, Attr.ROUND: round_},
    )
    trial = optuna.Trial(loop.study, storage.create_new_trial(study_id, template_trial=template))
    loop.claim(trial, CONFIRM, frozen.user_attrs[Attr.PARAMS])
    return trial


__all__ = ["confirm", "new_trial"]
