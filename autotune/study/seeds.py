"""What a search measures first, and whether today's options fit the study's space.

The seeds, in order: the baseline (PyTorch's defaults), the recipe stored earlier for this workload
and hardware (warm start), then the seeds that keep the defaults' environment (the knob families'
promising single changes: arms in the defaults' worker, no process start), then those that change it (the
``run_cpu`` heuristic: its factor needs pairs of fresh processes, the dearest measurement), then a part of the
heuristic's environment (its allocator alone, for where its other changes cost its gain). They are
enqueued one at a time (``enqueue_next_seed``), so an interrupted seed comes first again when the study
continues. ``--fix`` is checked against the space before anything is written
(``check_fixed``), and a study whose trials asked a knob with other choices than these options give
is told apart (``history_conflict``, ``space_digest``).
"""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import search_spaces as spaces
from ..errors import UsageError
from ..measure import environment_differences, environment_keys
from ..probes import outdated_fingerprint
from ..recipe import problems
from ..store import RecipeStore
from ..trial.spec import Status
from .records import (
    BASELINE,
    HEURISTIC,
    SEED,
    WARM_START,
    Attr,
    StudyAttr,
    finite,
    params_key,
)

if TYPE_CHECKING:
    import optuna

    from ..probes import Facts, Measured
    from .options import SearchOptions

log = logging.getLogger(__name__)

Seed = tuple[str, dict[str, Any]]  # (role, params)


def not_seeded(facts: Facts, ctx: spaces.SpaceContext, measured: Measured | None) -> dict[str, str]:
    """The precisions this space offers that are not seeded, each with why: measured hopeless in this
    machine's kernels (``probes.KernelSpeed.hopeless``). The sampler may still draw them: such a trial is recorded
    skipped with this reason (``skips.not_started``)."""
    if measured is None:
        return {}
    out = {}
    for dtype in spaces.amp.dtypes(facts, ctx):
        speed = measured.speed(dtype)
        if speed is not None and speed.hopeless():
            out[dtype] = speed.describe()
    return out


def seeds(facts: Facts, ctx: spaces.SpaceContext, options: SearchOptions, workload: str,
          measured: Measured | None = None, *, fresh_processes: bool = False, copy: bool = False) -> list[Seed]:
    """The baseline, the stored recipe of this workload on this hardware (warm start), the families' promising
    single changes, then the heuristic; ``--fix`` holds its knobs in all but the baseline. With this
    machine's ``measured`` kernel speeds, a precision measured hopeless is not seeded (``not_seeded``) and
    the others go fastest first: the facts' flags say what the hardware has, not what its kernels make of it.
    Where every trial starts processes of its own (``fresh_processes``: script mode), no seed is cheaper than
    another, and the seeds that change the environment, several knobs at once, go first. Where an in-process seed is
    measured in a long-lived copy of the script (``copy``: script mode's), it is cheaper than fresh copies but not
    by a worker's margin: a precision whose kernels are ``PROMISE`` x float32's goes first, then the seeds that
    change the environment, then the other in-process seeds. A part of the heuristic's environment goes last in all."""
    found = spaces.seeds(facts, ctx)
    if not options.seeded:
        return found[:1]
    skipped = not_seeded(facts, ctx, measured)
    for dtype, why in skipped.items():
        count = sum(params.get("amp_dtype") == dtype for _, params in found)
        if count:  # once per precision, however many of its seeds
            log.warning("%d seed(s) of %s skipped: %s", count, dtype, why)
    found = [found[0], *((role, params) for role, params in found[1:] if params.get("amp_dtype") not in skipped)]
    warm = warm_start(options.storage, workload, facts)
    if warm is not None:
        found.insert(1, (WARM_START, {**found[0][1], **warm}))
    out, seen = [found[0]], {params_key(found[0][1])}
    allowed = spaces.allowed_values(facts, ctx)
    for role, params in found[1:]:
        params = {**params, **options.fixed}
        # A recipe stored by an earlier search may hold values today's space has not (--no-compile, another
        # --global-batch, a lower memory cap): Optuna would refuse them mid-search. Skip it, and say so.
        outside = spaces.outside(params, facts, ctx, allowed)
        if outside:
            log.warning("%s seed skipped, outside this search's space: %s", role, "; ".join(outside))
            continue
        params = spaces.as_trial(params, facts, ctx)
        if params_key(params) not in seen:
            seen.add(params_key(params))
            out.append((role, params))
    def speed(params: dict[str, Any]) -> float:
        measured_speed = measured.speed(params.get("amp_dtype", "float32")) if measured is not None else None
        return measured_speed.speed if measured_speed is not None else 1.0

    # the defaults and the heuristic as the seeds read: with --fix, whose knobs are no seed's change
    held, heuristic = (spaces.as_trial({**params, **options.fixed}, facts, ctx)
                       for params in (found[0][1], next((p for r, p in found if r == HEURISTIC), found[0][1])))

    def part_of_heuristic(params: dict[str, Any]) -> bool:  # a part of the heuristic's environment, not all of it
        changed = [k for k in environment_keys() if params.get(k) != held.get(k)]
        return bool(changed) and all(params.get(k) == heuristic.get(k) for k in changed) \
            and any(heuristic.get(k) != held.get(k) for k in environment_keys() if k not in changed)

    # The cheap first: a seed of another environment waits for those the defaults' worker measures; of each,
    # the precisions measured fastest first (float32's seeds as 1.0, in their order). In script mode every seed
    # starts copies: the environment's, several knobs at once, first. A part of the heuristic's environment is
    # measured for where its other changes cost its gain: after the heuristic and the in-process seeds.
    # In a long-lived copy an in-process seed costs the copy's windows, not far less than a pair of fresh copies
    # (docs/search.md): a promising precision first, then the environment's seeds.
    def order(seed: Seed) -> tuple[int, float]:
        if seed[0] == WARM_START:
            return 0, 0.0
        if part_of_heuristic(seed[1]):
            return 4, -speed(seed[1])
        other = bool(environment_differences(held, seed[1]))
        if copy and not other and _promises(seed[1], held, speed(seed[1])):
            return 1, -speed(seed[1])
        return 2 + (other != (fresh_processes or copy)), -speed(seed[1])

    return out[:1] + sorted(out[1:], key=order)


PROMISE = 1.1  # a precision's kernels measured this much faster than float32's make its seeds the likeliest gain


def promising(study: optuna.Study, params: dict[str, Any], held: dict[str, Any]) -> bool:
    """Whether a seed changes the precision ``held`` has (the defaults with ``--fix``) to one that ran this machine's
    kernels ``PROMISE`` x as fast as float32 or more, as the search recorded them (``StudyAttr.KERNEL_SPEEDS``; a
    value that is not a finite number, as a foreign store may hold, is no promise): the seeds' order puts such a
    precision before the other cheap seeds, and an environment's seed goes ahead of it only where it still fits
    after (``Turns._displaced_fits``)."""
    speeds = study.user_attrs.get(StudyAttr.KERNEL_SPEEDS)
    return _promises(params, held, speeds.get(params.get("amp_dtype", "float32")) if isinstance(speeds, dict) else None)


def _promises(params: dict[str, Any], held: dict[str, Any], speed: Any) -> bool:
    """Whether ``params`` changes ``held``'s precision to one whose kernels ran ``speed`` (float32's as 1; a value
    that is not a finite number is none) of ``PROMISE`` or more."""
    return params.get("amp_dtype", "float32") != held.get("amp_dtype", "float32") and finite(speed) \
        and speed >= PROMISE


INPUT_BOUND = 0.5  # the defaults' share of a step spent waiting for data from which the input is seeded first


def input_seeds(data_wait: float | None, defaults: dict[str, Any], facts: Facts, ctx: spaces.SpaceContext,
                fixed: dict[str, Any]) -> list[Seed]:
    """Where the defaults wait for their data ``INPUT_BOUND`` of a step or more (``TrialResult.data_wait``, their
    calibration's windows): DataLoader workers and the threads they leave to compute (``spaces.data.input_bound``),
    with ``--fix`` held; none outside today's space. From half a step the input is the larger part of it: it bounds
    the step."""
    if data_wait is None or data_wait < INPUT_BOUND:
        return []
    out = []
    for change in spaces.data.input_bound(facts, ctx):
        params = {**defaults, **change, **fixed}
        if params != defaults and not spaces.outside(params, facts, ctx):
            out.append((SEED, spaces.as_trial(params, facts, ctx)))
    return out


def input_first(seeds: list[Seed], data_wait: float | None, facts: Facts, ctx: spaces.SpaceContext,
                fixed: dict[str, Any]) -> list[Seed] | None:
    """``seeds`` with the input's (``input_seeds``, read against the baseline's params) right after the baseline and
    the warm start, before the others; None where the input does not bound the step. The seed list is made before
    the calibration, where the input's wait is not yet known."""
    defaults = next((params for role, params in seeds if role == BASELINE), spaces.defaults(facts, ctx))
    found = input_seeds(data_wait, defaults, facts, ctx, fixed)
    if not found:
        return None
    keys = {params_key(params) for _, params in found}
    rest = [seed for seed in seeds if params_key(seed[1]) not in keys]
    at = next((i for i, (role, _) in enumerate(rest) if role not in (BASELINE, WARM_START)), len(rest))
    return [*rest[:at], *found, *rest[at:]]


def warm_start(storage: str, workload: str, facts: Facts) -> dict[str, Any] | None:
    """The searched knobs of the newest stored recipe for this workload and fingerprint, if any.
    A newer recipe recorded with another fingerprint scheme is skipped with a note."""
    with RecipeStore.open(storage) as store:
        recipe = store.latest(workload=workload, fingerprint=facts.fingerprint)
        newest = store.latest(workload=workload)
    why = outdated_fingerprint(newest.fingerprint) if newest is not None else None
    if why and newest is not None:  # the workload's newest recipe is of another scheme, so newer than the one used
        log.warning("warm start: %s of workload %s is skipped: it was %s", newest.label, workload, why)
    if recipe is None:
        return None
    refused = problems(recipe)  # a shared store's row: its params would run in this search's trials
    if refused:
        log.warning("warm start: %s of workload %s is skipped: it holds what no search writes: %s", recipe.label,
                    workload, "; ".join(refused))
        return None
    # a format-1 recipe's global batch_size is the batch_per_rank it meant (search_spaces.batch)
    return {k: v for k, v in spaces.batch.upgraded(recipe.params).items() if k not in spaces.RUN_KEYS}


def enqueue_next_seed(study: optuna.Study, seeds: list[Seed]) -> bool:
    """Enqueue the first seed that no trial of the study has taken, unless a trial is already waiting;
    True if one was enqueued. Called before every ask, so seeds go one at a time, in order: a seed
    whose trial was interrupted (Ctrl-C) or lost with a killed search is free again and comes first
    when the study continues. Workers sharing a study skip the seeds another one has taken (on one
    host the trial lock serialises this; two hosts asking at the same instant may measure a seed twice)."""
    seed = next_seed(study, seeds)
    if seed is None:
        return False
    study.enqueue_trial(seed[1], user_attrs={Attr.ROLE: seed[0]})
    return True


def next_seed(study: optuna.Study, seeds: list[Seed],
              where: Callable[[dict[str, Any]], bool] = lambda params: True) -> Seed | None:
    """The first seed that no trial of the study has taken (see ``enqueue_next_seed``), of those ``where`` takes;
    None when there is none or a trial is already waiting."""
    import optuna

    state = optuna.trial.TrialState
    taken = set()
    for t in study.get_trials(deepcopy=False):
        if t.state == state.WAITING:
            return None
        key = (t.user_attrs.get(Attr.ROLE), params_key(t.system_attrs.get("fixed_params", {})))
        if not (interrupted(t) or (t.state == state.FAIL and key[0] == BASELINE)):  # a baseline is retried
            taken.add(key)
    return next(((role, params) for role, params in seeds if (role, params_key(params)) not in taken
                 and where(params)), None)


def interrupted(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether ``trial`` ended without a result of its own: stopped by Ctrl-C, or failed for its search dying
    (no status recorded). A seed or the combination so ended is measured again by the next search; one that
    crashed, ran out of memory or was rejected is not."""
    import optuna

    return trial.state == optuna.trial.TrialState.FAIL and trial.user_attrs.get(Attr.STATUS) in (
        None, Status.INTERRUPTED)


def check_fixed(fixed: dict[str, Any], facts: Facts, ctx: spaces.SpaceContext) -> None:
    """Refuse a ``--fix`` of a knob that does not exist, or at a value today's space cannot take."""
    allowed = spaces.allowed_values(facts, ctx)
    for knob, value in fixed.items():
        if knob not in allowed:
            raise UsageError(f"--fix {knob}: no such knob; the knobs are {', '.join(sorted(allowed))}")
        if value not in allowed[knob]:
            shown = value if isinstance(value, str) else json.dumps(value)
            raise UsageError(f"--fix {knob}={shown}: not possible in this search on this machine; "
                             f"{knob} may be: {allowed[knob]}")


def history_conflict(study: optuna.Study, name: str, facts: Facts, ctx: spaces.SpaceContext) -> str | None:
    """Why a study cannot go on with these options, or None: its trials asked a knob with other choices
    than these options give (``--no-compile``, another ``--global-batch``, a lower memory cap), and
    Optuna fails at the first trial that asks it again."""
    import optuna

    today = spaces.suggested(facts, ctx)
    for t in study.get_trials(deepcopy=False):
        for knob, old in t.distributions.items():
            if knob in today and isinstance(old, optuna.distributions.CategoricalDistribution) \
                    and tuple(old.choices) != today[knob].choices:
                return (f"study {name!r} searched {knob} over {', '.join(map(str, old.choices))}; "
                        f"these options give {today[knob]}")
    return None


def space_digest(facts: Facts, ctx: spaces.SpaceContext) -> str:
    """Six hex digits naming the knobs' choices: the default study of a search with other choices."""
    space = {k: str(v) for k, v in sorted(spaces.suggested(facts, ctx).items())}
    return hashlib.sha256(json.dumps(space).encode()).hexdigest()[:6]


__all__ = ["Seed", "check_fixed", "enqueue_next_seed", "history_conflict", "input_first", "input_seeds", "interrupted",
           "next_seed", "not_seeded", "promising", "seeds", "space_digest", "warm_start"]
