"""Combinations: what the measured trials call for beyond the seeds. The fastest environment measured with the fastest
in-process knobs of the defaults' environment (``combination``), the in-process winner with the changes that may pay
only beside it (``interaction_seeds``), and a seed that may make the winner faster before it is combined
(``extension``). Each reads the study's measured trials; the loop's turns (``Turns``) decide when they go.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import search_spaces as spaces
from ..measure import environment_differences, environment_key, environment_keys
from .records import (
    BASELINE,
    COMBINED,
    CONFIRM,
    IN_PROCESS,
    INTERACTION,
    SEARCH,
    Attr,
    TrialRecord,
    environment_factors,
    params_key,
    records,
    study_margin,
)
from .seeds import Seed, interrupted, next_seed

if TYPE_CHECKING:
    import optuna

    from ..probes import Facts


def combination(study: optuna.Study, facts: Facts, ctx: spaces.SpaceContext,
                fixed: dict[str, Any] | None = None, ahead: bool = False) -> dict[str, Any] | None:
    """The fastest environment measured so far with the fastest in-process knobs of the defaults' environment, when no
    trial has measured them together yet; None otherwise. Each was measured against the defaults, the one across process
    pairs, the other inside the defaults' worker, and TPE samples every knob at once, so in a short search the two gains
    are seldom tried together. Its factor is cached and its worker may still be alive: the combination costs an arm's
    warm-up and its pairs. Environments rank by their own speed (``_own_speeds``), not by a combination's. Taken only
    where the in-process knobs beat the defaults by the margin and a trial of the environment read at least the
    defaults' speed; one process (``processes`` > 1 is measured in fresh processes, without a factor). ``ahead``: only
    where it goes before the seeds left, its environment's own speed above the defaults by the margin (a gain measured,
    not a reading in the noise)."""
    found = _measured(study)
    baseline = next((r for r in found if r.role == BASELINE), None)
    inner = _inner_winner(study, found)
    if baseline is None or inner is None:
        return None
    other = [r for r in found if environment_differences(baseline.params, r.params)
             and spaces.processes.count(r.params) == 1]
    if not other:
        return None
    groups: dict[str, list[TrialRecord]] = {}
    for r in other:
        groups.setdefault(environment_key(r.params), []).append(r)
    speeds = _own_speeds(study, groups)
    if not speeds:
        return None
    key = max(speeds, key=lambda k: speeds[k])
    if max(r.result.objective or 0.0 for r in groups[key]) < 1 or (ahead and speeds[key] <= 1 + study_margin(study)):
        return None
    return _joined(study, inner.params, groups[key][0].params, facts, ctx, fixed)


def _own_speeds(study: optuna.Study, groups: dict[str, list[TrialRecord]]) -> dict[str, float]:
    """Each environment's speed over the defaults' (``groups``: its measured trials by ``environment_key``): its
    factor's median (``environment_factors``: settled over process pairs, as its newest trial recorded it), else
    its fastest trial that is not a combination nor an interaction; none where it has neither. Such a trial carries
    the in-process winner's gain and would keep its environment first; a trial the sampler drew may carry one too."""
    factors, out = environment_factors(study), {}
    for key, mine in groups.items():
        alone = [r.result.objective or 0.0 for r in mine if r.role not in (COMBINED, INTERACTION)]
        if key in factors:
            out[key] = factors[key].median
        elif alone:
            out[key] = max(alone)
    return out


def prospective_combination(study: optuna.Study, facts: Facts, ctx: spaces.SpaceContext,
                            fixed: dict[str, Any] | None, environment: dict[str, Any]) -> dict[str, Any] | None:
    """The combination an environment not measured yet (``environment``: a seed's params) would make where it reads
    the fastest environment and at least the defaults' speed (``combination``): the in-process winner
    (``_inner_winner``) in it; None without one, or for several processes (measured without a factor)."""
    inner = _inner_winner(study, _measured(study))
    if inner is None or spaces.processes.count(environment) != 1:
        return None
    return _joined(study, inner.params, environment, facts, ctx, fixed)


def _joined(study: optuna.Study, inner: dict[str, Any], environment: dict[str, Any], facts: Facts,
            ctx: spaces.SpaceContext, fixed: dict[str, Any] | None) -> dict[str, Any] | None:
    """``inner``'s in-process knobs in ``environment``'s environment, unless taken or outside the space."""
    params = {**inner, **{k: environment[k] for k in environment_keys() if k in environment}, **(fixed or {})}
    if spaces.outside(params, facts, ctx):
        return None
    params = spaces.as_trial(params, facts, ctx)  # as taken trials record theirs: a moot --fix is none of them
    return None if params_key(params) in _taken(study) else params


def interaction_seeds(study: optuna.Study, facts: Facts, ctx: spaces.SpaceContext,
                      fixed: dict[str, Any] | None = None) -> list[Seed]:
    """The fastest in-process recipe of the defaults' environment, where it beats the defaults by the margin, with
    each change the families say may pay only beside another's gain (``spaces.interactions``: one thread with
    bfloat16, where one thread alone is slower), each not measured yet (role
    ``interaction``); a change of a knob ``--fix`` holds is left out. The single changes cannot show such a gain,
    and a sampler that draws every knob at once seldom lands on it in a short search."""
    inner = _inner_winner(study, _measured(study))
    if inner is None:
        return []
    taken, out = _taken(study), []
    for change in spaces.interactions(facts, ctx):
        if any(k in (fixed or {}) for k in change):
            continue
        params = {**inner.params, **change}
        if spaces.outside(params, facts, ctx):
            continue
        params = spaces.as_trial(params, facts, ctx)
        if params_key(params) not in taken:
            out.append((INTERACTION, params))
    return out


def extension(study: optuna.Study, seeds: list[Seed], asked: Callable[[dict[str, Any]], dict[str, Any]]) -> Seed | None:
    """The first seed not taken (``next_seed``) that keeps every change of the in-process winner (``_inner_winner``)
    and adds to them, in the defaults' environment and one process, its params read as ``asked`` (the loop's
    settings): the winner it may become is what the combination should carry, not the winner so far alone."""
    found = _measured(study)
    baseline, inner = next((r for r in found if r.role == BASELINE), None), _inner_winner(study, found)
    if baseline is None or inner is None:
        return None
    changed = {k: v for k, v in inner.params.items() if baseline.params.get(k) != v}

    def extends(run: dict[str, Any]) -> bool:
        return (not environment_differences(baseline.params, run) and spaces.processes.count(run) == 1
                and all(run.get(k) == v for k, v in changed.items()) and params_key(run) != params_key(inner.params))
    # one per winner: a seed that extended it and read slower ends the chain (channels_last + float16 after
    # channels_last + bfloat16 would go before the combination too), and a recipe measured is not asked again
    if any(r.role not in (SEARCH, IN_PROCESS) and extends(r.params) for r in found):
        return None
    measured = {params_key(r.params) for r in found}

    def new_extension(params: dict[str, Any]) -> bool:
        run = asked(params)
        return extends(run) and params_key(run) not in measured
    return next_seed(study, seeds, new_extension)


def winner_combined(study: optuna.Study) -> bool:
    """Whether a combination (role ``combined``) carrying the in-process winner's knobs (``_inner_winner``) was
    measured: another environment's comes only where that environment reads faster alone, which its seed's race
    cannot know, so keeps no time for it (``Turns.following``)."""
    found = _measured(study)
    inner = _inner_winner(study, found)
    if inner is None:
        return False
    environment = set(environment_keys())

    def own(params: dict[str, Any]) -> dict[str, Any]:  # its in-process knobs
        return {k: v for k, v in params.items() if k not in environment}
    return any(r.role == COMBINED and own(r.params) == own(inner.params) for r in found)


def _measured(study: optuna.Study) -> list[TrialRecord]:
    """The study's feasible measured trials, confirmations aside."""
    return [r for r in records(study) if r.role != CONFIRM and r.feasible and r.result.objective is not None]


def _inner_winner(study: optuna.Study, found: list[TrialRecord]) -> TrialRecord | None:
    """Of ``found``, the fastest recipe of the defaults' environment (the baseline's own aside), where it beats the
    defaults by the study's margin; else None."""
    baseline = next((r for r in found if r.role == BASELINE), None)
    same = [r for r in found if baseline is not None and r is not baseline
            and not environment_differences(baseline.params, r.params)]
    inner = max(same, key=lambda r: r.result.objective or 0.0, default=None)
    return inner if inner is not None and (inner.result.objective or 0.0) > 1 + study_margin(study) else None


def _taken(study: optuna.Study) -> set[str]:
    """The recipes of the study's trials, enqueued or asked (an interrupted one's aside: it is free again)."""
    return {params_key(t.user_attrs.get(Attr.PARAMS) or t.system_attrs.get("fixed_params", {}))
            for t in study.get_trials(deepcopy=False) if not interrupted(t)}


def enqueue_combination(study: optuna.Study, facts: Facts, ctx: spaces.SpaceContext,
                        fixed: dict[str, Any] | None = None) -> bool:
    """Enqueue the ``combination`` (role ``combined``) unless a trial is already waiting; True if one was."""
    import optuna

    if any(t.state == optuna.trial.TrialState.WAITING for t in study.get_trials(deepcopy=False)):
        return False
    params = combination(study, facts, ctx, fixed)
    if params is None:
        return False
    study.enqueue_trial(params, user_attrs={Attr.ROLE: COMBINED})
    return True


__all__ = ["combination", "enqueue_combination", "extension", "interaction_seeds", "prospective_combination",
           "winner_combined"]
