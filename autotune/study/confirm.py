"""Confirmation: the top candidates and the baseline, re-run side by side before one is declared best.

A search keeps its fastest measurement, and the fastest of many noisy measurements is biased upward
(the winner's curse). So the top ``confirm_top`` feasible recipes and the defaults are run again,
``confirm_rounds`` times each, interleaved (round r starts at the r-th entry, so no candidate is
always first after a quiet pause), every run a fresh subprocess like any trial. Only these runs decide:
a recipe is better than the defaults if its median beats theirs by more than the noise
(``autotune.study.significance``) *and*, with two runs or more, its slowest run beats the defaults'
fastest. The runs are trials of the study with role ``confirm`` (user attribute ``confirms``: the
trial they re-measure), so a resumed search keeps them and runs only what is missing.

The search loop keeps time for them in the budget (``autotune.study.budget.reserve_s``); when the
budget still runs out, the confirmation is shortened and the report says so.
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import TYPE_CHECKING

from ..trial.lock import host_lock
from ..trial.spec import Status
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
from .significance import MIN_NOISE, noise

if TYPE_CHECKING:
    import optuna


def _earlier_runs(study: optuna.Study) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Confirmation runs already in the study (an earlier, perhaps interrupted, search): by recipe."""
    runs: dict[str, list[float]] = defaultdict(list)
    failed: dict[str, str] = {}
    for r in records(study):
        if r.role != CONFIRM or r.result.status not in MEASURED:
            continue  # an interrupted run is simply made again
        if r.result.status == Status.OK and r.result.objective is not None:
            runs[params_key(r.params)].append(r.result.objective)
        else:
            failed[params_key(r.params)] = f"{r.result.status}: {r.result.error}"
    return runs, failed


def confirm(loop: SearchLoop) -> Confirmation | None:
    """Run the confirmation for ``loop``'s study (None when ``confirm_top`` or ``confirm_rounds`` is 0)."""
    options = loop.options
    if options.confirm_top <= 0 or options.confirm_rounds <= 0:
        return None
    baseline, top = lineup(loop.study, options.confirm_top)
    if baseline is None:
        return None  # the search checks for a baseline before it confirms
    lineup_ = [baseline, *top]
    runs, failed = _earlier_runs(loop.study)
    note, made, started = None, 0, time.monotonic()
    if not top:
        note = "no feasible recipe besides the defaults to confirm"
    rounds = options.confirm_rounds if top else 0
    # Round r runs the lineup from its r-th entry on; a recipe that already has its r-th run is skipped.
    queue = [(r, e) for r in range(rounds) for e in lineup_[r % len(lineup_):] + lineup_[: r % len(lineup_)]]
    for round_, entry in queue:
        key = params_key(entry.params)
        if key in failed or len(runs[key]) > round_:
            continue
        remaining, estimate = loop.deadline - time.monotonic(), loop.estimate_s()
        if remaining < max(1.0, estimate or 0.0):
            note = f"the budget ran out after {made} confirmation run(s): the ranges are from fewer runs"
            break
        with host_lock():
            trial = new_trial(loop, entry.number, round_)
            remaining = loop.deadline - time.monotonic()
            timeout = loop.timeout_s(entry.params, remaining, estimate)
            result = loop.run_one(trial, CONFIRM, entry.params, max(1.0, timeout))
        made += 1
        if result.status == Status.OK and result.objective is not None:
            runs[key].append(result.objective)
        else:
            failed[key] = f"{result.status}: {result.error}"

    def candidate(record: TrialRecord) -> Candidate:
        key = params_key(record.params)
        return Candidate(record.number, record.role, record.params, record.result.objective or 0.0,
                         tuple(runs[key]), failed.get(key))

    confirmed = sorted((candidate(r) for r in top), key=lambda c: (c.failed is not None, -(c.median if c.runs else 0)))
    base = candidate(baseline)
    best = next((c for c in confirmed if c.runs and c.failed is None), None)
    return Confirmation(base, tuple(confirmed), note, made, time.monotonic() - started,
                        noise(base.runs, best.runs) if best and base.runs else MIN_NOISE)


def new_trial(loop: SearchLoop, source: int, round_: int) -> optuna.Trial:
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
