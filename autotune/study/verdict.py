"""What a measured trial is: told to Optuna with its value or state, and, where it ran, whether it is this recipe
at all: the quality guard (its held-out loss against the baseline's, after the same samples), every knob in
effect, and out of memory or a NaN loss as infeasible, with the reason recorded."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .. import search_spaces as spaces
from ..recipe import SCRIPT_WORKLOAD
from ..trial.spec import EVALUATED, EVALUATED_HIGHER, TRAINING_LOSS, Status, TrialResult
from . import oom_limits
from .events import Progress, TrialFinished
from .records import (
    BASELINE,
    CONFIRM,
    CONSTRAINTS,
    Attr,
    StudyAttr,
    TrialRecord,
    optuna_storage,
    params_key,
    records,
    trial_id,
)

if TYPE_CHECKING:
    import optuna

    from ..probes import Facts
    from .options import SearchOptions


UNBOUNDED = 1e9  # the constraint value of a loss the guard cannot bound (Optuna's constraints are finite floats)


def quality(study: optuna.Study, options: SearchOptions, loss: float,
            source: str | None = None) -> tuple[float, str | None]:
    """The loss's increase over the baseline's (relative), and why the quality guard rejects it (None: it does
    not). Without a finite baseline loss nothing can pass it; a baseline loss of 0 admits no higher loss. ``source``:
    what the loss is (``TrialResult.loss_source``), which must be the baseline's: a script's own figure
    (``Tuned.evaluate``) is not compared with a training loss."""
    attrs = study.user_attrs
    base, tolerance = attrs.get(StudyAttr.BASELINE_LOSS), options.max_loss_increase
    if base is None or not math.isfinite(base):
        return UNBOUNDED, f"no finite baseline loss to compare its loss with (the defaults' was {base})"
    base_source = loss_source(attrs.get(StudyAttr.LOSS_SOURCE), attrs.get(StudyAttr.WORKLOAD))
    if source != base_source:
        return UNBOUNDED, f"its copy told {source or 'no loss'} where the defaults' told {base_source}"
    higher = base_source == EVALUATED_HIGHER  # a metric: its fall is what the limit bounds
    increase = relative_increase(-loss, -base) if higher else relative_increase(loss, base)
    if increase <= tolerance:
        return increase, None
    what = "your evaluate() figure" if base_source in (EVALUATED, EVALUATED_HIGHER) else "loss"
    if increase >= UNBOUNDED:
        said = "beyond any bound " + ("below" if higher else "over")
    else:
        said = f"{increase:.1%} below" if higher else f"{increase:+.1%} over"
    limit = f"{tolerance:.0%}" if higher else f"+{tolerance:.0%}"
    return increase, f"{what} {loss:.4f} is {said} the baseline's {base:.4f} (limit {limit})"


def loss_source(recorded: str | None, workload: str | None) -> str | None:
    """A baseline's ``loss_source``: a script's study begun before sources were recorded compared training losses.

    >>> loss_source(None, "script:train.py"), loss_source(None, "cnn"), loss_source("evaluate", "script:train.py")
    ('training loss', None, 'evaluate')
    """
    if recorded is None and str(workload or "").startswith(SCRIPT_WORKLOAD):
        return TRAINING_LOSS
    return recorded


def relative_increase(loss: float, base: float) -> float:
    """``loss`` over ``base``, relative; over a base of 0 none but a loss of 0 or less is bounded, and a loss that is
    not finite is not.

    >>> relative_increase(2.1, 2.0), relative_increase(0.0, 0.0), relative_increase(1e-6, 0.0)
    (0.050000000000000044, 0.0, 1000000000.0)
    """
    if base == 0:
        return 0.0 if loss <= 0 else UNBOUNDED
    return (loss - base) / abs(base) if math.isfinite(loss) else UNBOUNDED


def record(study: optuna.Study, facts: Facts, options: SearchOptions, trial: optuna.Trial, role: str,
           params: dict[str, Any], result: TrialResult, notify: Progress,
           guarded: tuple[float, str | None, str | None] | None = None) -> None:
    """Store the trial's result and constraints and tell Optuna its value (or state). ``guarded``: the quality
    guard's verdict where the search took it with its second look (``guard.Guard.verdict``); else the first."""
    import optuna

    data = result.to_dict()
    for key in Attr.RESULT:
        if data.get(key) not in (None, [], {}):
            trial.set_user_attr(key, data[key])
    state = optuna.trial.TrialState
    if spaces.membind_off(spaces.memory_nodes(params, facts), result.in_effect):
        # numactl --membind refused or missing: the pinning was measured unbound, and the recipe says so
        params = {**params, "membind": False}
        trial.set_user_attr(Attr.PARAMS, params)
    if result.status == Status.OK:
        reason = _feasibility(study, options, trial, role, params, result, guarded)
        _constraints_list(study, trial)
        study.tell(trial, result.objective)
    elif result.status in (Status.OOM, Status.NAN):
        # FAIL, not a value: 0.0 would be a measurement (TPE's worst, the dashboard's history flattened);
        # the constraints and the status say why (``records`` reads them, not the state)
        reason = _infeasible(study, trial, params, result)
        _constraints_list(study, trial)
        study.tell(trial, state=state.FAIL)
    else:
        reason = result.error
        study.tell(trial, state=state.PRUNED if result.status == Status.PRUNED else state.FAIL)
    notify(TrialFinished(trial.number, role, params, result, reason))

def _constraints_list(study: optuna.Study, trial: optuna.Trial) -> None:
    """Also store the constraints as one list, in ``CONSTRAINTS`` order: optuna-dashboard 0.21 reads only
    that (older) form, Optuna 5's ``set_constraint`` writes ``constraints:<key>`` per key; without it the
    dashboard marks no trial infeasible. An unset constraint is 0 (not broken)."""
    named = trial.constraints
    values = [float(named.get(key, 0.0)) for key in CONSTRAINTS]
    storage, _ = optuna_storage(study)
    storage.set_trial_system_attr(trial_id(trial), "constraints", values)

def _feasibility(study: optuna.Study, options: SearchOptions, trial: optuna.Trial, role: str, params: dict[str, Any],
                 result: TrialResult, guarded: tuple[float, str | None, str | None] | None) -> str | None:
    """The quality guard, and every knob in effect: why a trial that ran is not this recipe, or None."""
    reason = _guard(study, options, trial, role, result, guarded)
    # A knob the trial process reports not in effect measured something else: not this recipe.
    missing = [] if role == BASELINE else spaces.not_in_effect(params, result.in_effect)
    trial.set_constraint("applied", float(len(missing)))
    if missing:
        reason = "; ".join(missing + ([reason] if reason else []))
        trial.set_user_attr(Attr.INFEASIBLE, reason)
    return reason

def _infeasible(study: optuna.Study, trial: optuna.Trial, params: dict[str, Any], result: TrialResult) -> str:
    """An out-of-memory or NaN trial: infeasible; an out-of-memory batch caps the later ones with the
    same memory-relevant settings (``oom_limits``)."""
    oom = result.status == Status.OOM
    trial.set_constraint("quality", 0.0)
    trial.set_constraint("fits_memory", 1.0 if oom else 0.0)
    trial.set_constraint("finite_loss", 1.0 if result.status == Status.NAN else 0.0)
    reason = "out of memory" if oom else "the loss became NaN/inf"
    if oom:
        limits = study.user_attrs.get(StudyAttr.OOM_LIMITS)
        study.set_user_attr(StudyAttr.OOM_LIMITS, oom_limits.record_oom(limits, params))
    trial.set_user_attr(Attr.INFEASIBLE, reason)
    return reason

def _guard(study: optuna.Study, options: SearchOptions, trial: optuna.Trial, role: str,
           result: TrialResult, guarded: tuple[float, str | None, str | None] | None) -> str | None:
    """The quality guard: a held-out loss above the baseline's by more than the tolerance is infeasible.
    Every trial's loss is taken after the same samples (``loss_samples``, recorded for the report)."""
    if result.loss_samples is not None:
        trial.set_user_attr(Attr.LOSS_SAMPLES, result.loss_samples)
    if role == BASELINE:
        study.set_user_attr(StudyAttr.BASELINE_LOSS, result.loss)  # the A/A's defaults arm
        study.set_user_attr(StudyAttr.LOSS_SOURCE, result.loss_source)
        study.set_user_attr(StudyAttr.BASELINE_SAMPLES_PER_S, result.samples_per_s)
    # The defaults are the recipe the search falls back on: compared with themselves, whatever their loss.
    if role == BASELINE:
        increase, reason = 0.0, None
    elif guarded is not None:
        increase, reason, second = guarded
        if second is not None:
            trial.set_user_attr(Attr.GUARD, second)
    else:
        loss = result.loss if result.loss is not None else float("nan")
        increase, reason = quality(study, options, loss, result.loss_source)
    trial.set_constraint("quality", increase - options.max_loss_increase)
    trial.set_constraint("fits_memory", 0.0)
    trial.set_constraint("finite_loss", 0.0)
    if reason is not None:
        trial.set_user_attr(Attr.INFEASIBLE, reason)
    return reason


def measured_before(study: optuna.Study, params: dict[str, Any], role: str | None = None) -> int | None:
    """The first trial whose measurement of the recipe ``params`` stands (status ok, a confirmation's round aside), or
    None; None for a trial of ``role`` the baseline or a confirmation, which measure again by design.

    For a candidate (a seed too: a sampled trial, which takes turns with the seeds, ``Turns.sampled_turn``, may have
    measured its recipe first) that measurement stands: a repeat in a warm worker measures the same arms against the
    same baseline, and the confirmation measures the chosen recipes again in fresh processes anyway; measuring it
    again would spend the budget on one recipe and carry on with the luckiest of its copies. The loop skips the
    repeat (as discussed in optuna/optuna#2021) and tells it PRUNED, which TPE ranks below every completed trial, so
    it draws elsewhere rather than the same point again; the earlier trial keeps its value. A recipe that crashed or
    timed out is measured again."""
    if role in (BASELINE, CONFIRM):
        return None
    key = params_key(params)
    return next((r.number for r in records(study)
                 if r.role != CONFIRM and r.result.status == Status.OK and params_key(r.params) == key), None)


def best_record(study: optuna.Study) -> TrialRecord | None:
    """The record of the fastest feasible trial measured so far (not a confirmation), or None."""
    return max((r for r in records(study) if r.role != CONFIRM and r.feasible and r.result.objective is not None),
               key=lambda r: r.result.objective or 0.0, default=None)


def incumbent(study: optuna.Study) -> tuple[float, float, float] | None:
    """The best feasible speedup so far (the baseline's 1.0 at least): its median, low and high bounds."""
    best = best_record(study)
    if best is None or best.result.objective is None:
        return None
    median, low, high = best.result.objective, best.result.speedup_low, best.result.speedup_high
    return median, low if low is not None else median, high if high is not None else median
