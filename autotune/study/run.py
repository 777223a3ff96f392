"""Study orchestration: an Optuna study whose trials are real training runs, within a time budget.

Trial 0 is PyTorch's defaults (the baseline), trial 1 the ``run_cpu`` heuristic; then TPE samples
the knobs that matter on this hardware. Every trial's outcome is recorded in the study's storage as
soon as it ends, so an interrupted search loses nothing and ``--study NAME`` continues it.
"""
from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from .. import search_spaces as spaces
from ..errors import HardwareMismatchError, TrialError, UsageError
from ..recipe import Recipe
from ..store import DEFAULT_STORAGE, RecipeStore, check_storage_url, create_schema, storage_errors
from ..trial.runner import TrialResult, TrialSettings
from .budget import parse_duration

log = logging.getLogger(__name__)

CONSTRAINTS = ("quality", "fits_memory", "finite_loss", "applied")


@dataclass(frozen=True)
class SearchOptions:
    budget_s: float | None = 1800.0
    trials: int | None = None
    storage: str = DEFAULT_STORAGE
    study: str | None = None
    settings: TrialSettings = field(default_factory=TrialSettings)
    max_loss_increase: float = 0.05  # relative to the baseline's loss
    global_batch: int | None = None
    lr_scaling: str = "sqrt"
    seed: int = 0
    compile: bool = True
    fixed: dict[str, Any] = field(default_factory=dict)  # knobs held at a value (--fix KNOB=VALUE)
    confirm_top: int = 3  # candidates re-run side by side with the baseline before one is declared best
    confirm_rounds: int = 3  # interleaved runs of each


def check_options(options: SearchOptions) -> None:
    """Refuse options no search can run with, before anything is probed or written: one line naming
    each bad option by its ``autotune search`` flag. ``search()`` and the CLI both call it."""
    s, problems = options.settings, []

    def need(ok: bool, text: str) -> None:
        if not ok:
            problems.append(text)

    need(options.budget_s is None or (math.isfinite(options.budget_s) and options.budget_s > 0),
         f"--budget must be more than zero (got {options.budget_s})")
    need(options.trials is None or options.trials >= 1, f"--trials must be at least 1 (got {options.trials})")
    need(options.budget_s is not None or options.trials is not None, "give a --budget, a --trials count, or both")
    need(not math.isnan(options.max_loss_increase) and options.max_loss_increase >= 0,
         f"--max-loss-increase must be 0 or more (got {options.max_loss_increase}): the baseline itself must pass the guard")
    need(options.global_batch is None or options.global_batch >= 1,
         f"--global-batch must be at least 1 (got {options.global_batch})")
    need(options.lr_scaling in spaces.batch.LR_RULES,
         f"--lr-scaling must be one of {', '.join(spaces.batch.LR_RULES)} (got {options.lr_scaling!r})")
    need(0 <= options.seed < 2**32 and 0 <= s.seed < 2**32, f"--seed must be 0 to {2**32 - 1} (got {options.seed})")
    need(options.confirm_top >= 0, f"--confirm must be 0 or more (got {options.confirm_top})")
    need(options.confirm_rounds >= 1, f"--confirm-rounds must be at least 1 (got {options.confirm_rounds})")
    need(s.warmup_steps >= 0, f"--warmup-steps must be 0 or more (got {s.warmup_steps})")
    need(s.windows >= 1 and s.measure_steps >= s.windows,
         f"--steps must be at least {max(1, s.windows)}, one per timed window (got {s.measure_steps})")
    need(s.train_steps >= 1, f"--train-steps must be at least 1 (got {s.train_steps}): compile time is amortised over it")
    need(s.eval_samples >= 1 and s.max_extra_windows >= 0 and s.max_spread >= 0,
         "TrialSettings: eval_samples must be at least 1, max_extra_windows and max_spread 0 or more")
    if problems:
        raise UsageError("; ".join(problems))


@dataclass(frozen=True)
class TrialRecord:
    number: int
    role: str  # baseline | heuristic | warm-start | seed | search | confirm
    params: dict[str, Any]
    result: TrialResult
    feasible: bool
    reason: str | None = None


@dataclass(frozen=True)
class SearchOutcome:
    study: str
    recipe: Recipe
    baseline: TrialRecord
    best: TrialRecord
    records: list[TrialRecord]
    stopped: str
    elapsed_s: float
    confirmation: Any = None  # autotune._confirm.Confirmation


@contextmanager
def host_lock() -> Iterator[None]:
    """One trial at a time on this host: parallel trials would measure each other."""
    path = os.path.join(tempfile.gettempdir(), "autotune-trials.lock")
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("another autotune trial runs on this host; waiting for it to end")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _open_study(options: SearchOptions, name: str, facts: Any, workload: str) -> tuple[Any, bool]:
    """The study (and whether this call created it); refuses one measured on other hardware."""
    import optuna

    check_storage_url(options.storage)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # Heartbeats are "experimental" and "meant for Study.optimize"; the ask/tell loop records them itself.
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    with storage_errors(options.storage):
        storage = _rdb_storage(options.storage)
        sampler: Any = optuna.samplers.TPESampler(
            multivariate=True, group=True, seed=options.seed, n_startup_trials=6
        )
        if options.fixed:
            sampler = optuna.samplers.PartialFixedSampler(options.fixed, sampler)
        kwargs = dict(storage=storage, sampler=sampler, study_name=name, direction="maximize",
                      pruner=optuna.pruners.NopPruner())  # a threshold replaces it once the baseline is measured
        try:  # exactly one worker of a shared study creates it, and only that one seeds it
            study, created = optuna.create_study(**kwargs), True
        except optuna.exceptions.DuplicatedStudyError:
            study, created = optuna.load_study(**{k: v for k, v in kwargs.items() if k != "direction"}), False
    _check_hardware(study, name, facts, workload)
    if created:
        _note_outdated_studies(storage, name, workload)
    return study, created


def _check_hardware(study: Any, name: str, facts: Any, workload: str) -> None:
    """Record this machine in a new study; refuse a worker whose hardware or CPU set differs, and a study
    recorded with another fingerprint scheme (its trials stay in the storage, untouched)."""
    from ..probes import outdated_fingerprint

    cpu_set = _cpu_set(facts)
    recorded = study.user_attrs.get("fingerprint")
    if recorded is None:
        study.set_user_attr("fingerprint", facts.fingerprint)
        study.set_user_attr("workload", workload)
        study.set_user_attr("cpu_set", cpu_set)
        return
    why = outdated_fingerprint(recorded)
    if why:
        raise HardwareMismatchError(
            f"study {name!r} was {why}: its trials are kept, but it cannot be continued; search again in a new "
            f"study: autotune search --workload {workload} --study NEW_NAME (or without --study)"
        )
    # The fingerprint leaves out the affinity (taskset): trials of one study must still run on the same CPUs.
    recorded_set = study.user_attrs.get("cpu_set", cpu_set)
    if recorded != facts.fingerprint or recorded_set != cpu_set:
        raise HardwareMismatchError(
            f"study {name!r} was measured on hardware {recorded} ({recorded_set}), this machine is "
            f"{facts.fingerprint} ({cpu_set}): run this worker on the same hardware and CPU set, or use another "
            "--study name"
        )


def _cpu_set(facts: Any) -> str:
    """The shape of the CPUs this process may use, as the study's workers must share it."""
    allowed = facts.cpu.allowed
    return (f"{allowed.packages} package(s), {len(allowed.numa_nodes)} NUMA node(s), {allowed.cores} core(s), "
            f"{allowed.threads} thread(s) allowed")


def _note_outdated_studies(storage: Any, name: str, workload: str) -> None:
    """Say which studies of this workload a new search leaves behind because of their fingerprint scheme."""
    import optuna

    from ..probes import outdated_fingerprint

    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        why = outdated_fingerprint(summary.user_attrs.get("fingerprint"))
        if why and summary.user_attrs.get("workload") == workload:
            log.warning("study %r (%d trials) of workload %s is not continued: it was %s; this search starts "
                        "study %r", summary.study_name, summary.n_trials, workload, why, name)


def _rdb_storage(url: str) -> Any:
    """Optuna's RDB storage, with heartbeats; several workers may create its schema at once."""
    import optuna

    return create_schema(lambda: optuna.storages.RDBStorage(url, heartbeat_interval=5, grace_period=20))


def _context(workload_spec: str, facts: Any, options: SearchOptions) -> tuple[Any, spaces.SpaceContext]:
    from ..workload import load_workload

    workload = load_workload(workload_spec)
    import torch

    model = workload.model()
    conv = any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())
    device = "cuda" if facts.gpus and torch.cuda.is_available() else "cpu"
    ctx = spaces.SpaceContext(
        device=device, default_batch_size=workload.batch_size, conv=conv, global_batch=options.global_batch,
        allow_compile=options.compile, max_batch_size=_max_batch(workload, model, facts, device),
        **spaces.sparsity.context(model),
    )
    return workload, ctx


def _max_batch(workload: Any, model: Any, facts: Any, device: str) -> int | None:
    """The batch size the probed memory should hold (``search_spaces.batch.max_batch_size``): a GPU's
    memory, else the RAM available now; estimated from a forward pass of two of the dataset's samples."""
    import torch

    memory = min((g.memory_bytes for g in facts.gpus), default=None) if device == "cuda" else facts.memory.available_bytes
    try:
        dataset = workload.dataset()
        samples = min(2, len(dataset))
        batch = torch.utils.data.default_collate([dataset[i] for i in range(samples)])
        inputs = tuple(workload.model_inputs(batch))
    except Exception as e:  # noqa: BLE001 - the trials report a broken dataset with its traceback
        log.debug("no batch-size cap: %s", e)
        return None
    limit = spaces.batch.max_batch_size(memory, model, inputs, samples)
    if limit is not None and limit < 4 * workload.batch_size:
        log.info("batch sizes above %d are not offered: %s of memory should not hold them", limit,
                 f"{memory / 2**30:.1f} GiB" if memory else "?")
    return limit


def _run_settings(ctx: spaces.SpaceContext, options: SearchOptions) -> dict[str, Any]:
    return {
        "device": ctx.device,
        "reference_batch": ctx.default_batch_size,
        "global_batch": options.global_batch,
        "lr_scaling": "none" if options.global_batch else options.lr_scaling,
    }


def _key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def _seeds(facts: Any, ctx: spaces.SpaceContext, options: SearchOptions,
           workload: str) -> list[tuple[str, dict[str, Any]]]:
    """The baseline, the stored recipe of this workload on this hardware (warm start), the heuristic,
    then the families' promising single changes; ``--fix`` holds its knobs in all but the baseline."""
    seeds = spaces.seeds(facts, ctx)
    warm = _warm_start(options.storage, workload, facts)
    if warm is not None:
        seeds.insert(1, ("warm-start", {**seeds[0][1], **warm}))
    out, seen = [seeds[0]], {_key(seeds[0][1])}
    allowed = spaces.allowed_values(facts, ctx)
    for role, params in seeds[1:]:
        params = {**params, **options.fixed}
        # A recipe stored by an earlier search may hold values today's space has not (--no-compile, another
        # --global-batch, a lower memory cap): Optuna would refuse them mid-search. Skip it, and say so.
        outside = spaces.outside(params, facts, ctx, allowed)
        if outside:
            log.warning("%s seed skipped, outside this search's space: %s", role, "; ".join(outside))
            continue
        if _key(params) not in seen:
            seen.add(_key(params))
            out.append((role, params))
    return out


def _check_fixed(fixed: dict[str, Any], facts: Any, ctx: spaces.SpaceContext) -> None:
    """Refuse a ``--fix`` of a knob that does not exist, or at a value today's space cannot take."""
    allowed = spaces.allowed_values(facts, ctx)
    for knob, value in fixed.items():
        if knob not in allowed:
            raise UsageError(f"--fix {knob}: no such knob; the knobs are {', '.join(sorted(allowed))}")
        if value not in allowed[knob]:
            shown = value if isinstance(value, str) else json.dumps(value)
            raise UsageError(f"--fix {knob}={shown}: not possible in this search on this machine; "
                             f"{knob} may be: {allowed[knob]}")


def _history_conflict(study: Any, name: str, facts: Any, ctx: spaces.SpaceContext) -> str | None:
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


def _space_digest(facts: Any, ctx: spaces.SpaceContext) -> str:
    """Six hex digits naming the knobs' choices: the default study of a search with other choices."""
    import hashlib

    space = {k: str(v) for k, v in sorted(spaces.suggested(facts, ctx).items())}
    return hashlib.sha256(json.dumps(space).encode()).hexdigest()[:6]


def _open_for_options(options: SearchOptions, name: str, facts: Any, ctx: spaces.SpaceContext,
                      workload: str) -> tuple[Any, bool, str]:
    """The study to search in, whether it was created, and its name. A default study (no ``--study``)
    searched with other choices than these options give goes on in a study of its own, named after the
    choices, so the same command still continues it; a study named with ``--study`` is refused."""
    study, created = _open_study(options, name, facts, workload)
    conflict = None if created else _history_conflict(study, name, facts, ctx)
    if conflict and options.study is None:
        name = f"{name}-{_space_digest(facts, ctx)}"
        log.warning("%s: this search goes on in study %r", conflict, name)
        study, created = _open_study(options, name, facts, workload)
        conflict = None if created else _history_conflict(study, name, facts, ctx)
    if conflict:
        raise UsageError(f"{conflict}: continue it with the options it started with, or start another with --study NAME")
    return study, created, name


def _warm_start(storage: str, workload: str, facts: Any) -> dict[str, Any] | None:
    """The searched knobs of the newest stored recipe for this workload and fingerprint, if any.
    A newer recipe recorded with another fingerprint scheme is skipped with a note."""
    from ..probes import outdated_fingerprint

    with RecipeStore.open(storage) as store:
        recipe = store.latest(workload=workload, fingerprint=facts.fingerprint)
        newest = store.latest(workload=workload)
    why = outdated_fingerprint(newest.fingerprint) if newest is not None else None
    if why:  # the workload's newest recipe is of another scheme, so newer than the one used (if any)
        log.warning("warm start: %s of workload %s is skipped: it was %s", newest.label, workload, why)
    if recipe is None:
        return None
    return {k: v for k, v in recipe.params.items() if k not in spaces.RUN_KEYS}


def _enqueue_next_seed(study: Any, seeds: list[tuple[str, dict[str, Any]]]) -> bool:
    """Enqueue the first seed that no trial of the study has taken, unless a trial is already waiting;
    True if one was enqueued. Called before every ask, so seeds go one at a time, in order: a seed
    whose trial was interrupted (Ctrl-C) or lost with a killed search is free again and comes first
    when the study continues. Workers sharing a study skip the seeds another one has taken (on one
    host the trial lock serialises this; two hosts asking at the same instant may measure a seed twice)."""
    import optuna

    state = optuna.trial.TrialState
    taken = set()
    for t in study.get_trials(deepcopy=False):
        if t.state == state.WAITING:
            return False
        key = (t.user_attrs.get("role"), _key(t.system_attrs.get("fixed_params", {})))
        interrupted = t.state == state.FAIL and (
            t.user_attrs.get("status") in (None, "interrupted") or key[0] == "baseline"  # a baseline is retried
        )
        if not interrupted:
            taken.add(key)
    for role, params in seeds:
        if (role, _key(params)) not in taken:
            study.enqueue_trial(params, user_attrs={"role": role})
            return True
    return False


def _baseline(study: Any) -> Any:
    import optuna

    done = [
        t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if t.user_attrs.get("role") == "baseline" and t.user_attrs.get("status") == "ok"
    ]
    return done[0] if done else None


def search(workload: str, *, options: SearchOptions | None = None, progress: Callable[[str, Any], None] | None = None,
           budget: str | float | None = None, trials: int | None = None) -> SearchOutcome:
    """Search the knobs for ``workload`` and store the best recipe.

    >>> outcome = search("tiny", budget="60s")          # doctest: +SKIP
    >>> outcome.recipe.speedup                           # doctest: +SKIP
    """
    options = options or SearchOptions()
    if budget is not None:
        options = replace(options, budget_s=parse_duration(budget) if isinstance(budget, str) else float(budget))
    if trials is not None:
        options = replace(options, trials=trials)
    check_options(options)
    started = time.monotonic()
    deadline = started + options.budget_s if options.budget_s else float("inf")
    notify = progress or (lambda event, data: None)

    from .. import probes
    from .confirm import confirm
    from .loop import SearchLoop, fail_orphans
    from .report import choose_recipe

    facts = probes.probe()
    wl, ctx = _context(workload, facts, options)
    _check_fixed(options.fixed, facts, ctx)  # before the study is created: a refused --fix writes nothing
    name = options.study or f"{wl.name}-{facts.fingerprint}"
    study, created, name = _open_for_options(options, name, facts, ctx, workload)
    fail_orphans(study)  # trials of a search killed on this host: failed now, their seeds free again
    run = _run_settings(ctx, options)
    notify("start", {"study": name, "facts": facts, "context": ctx, "budget_s": options.budget_s, "resumed": not created,
                     "defaults": {**spaces.defaults(facts, ctx), **run}})
    loop = SearchLoop(study, workload, facts, ctx, run, options, deadline, notify,
                      seeds=_seeds(facts, ctx, options, workload))
    stopped = loop.run()
    if _baseline(study) is None:
        raise TrialError(
            f"the baseline (PyTorch defaults) did not complete: {loop.baseline_error or 'not run'}; "
            "fix the workload or give a larger --budget"
        )
    confirmation = confirm(loop)
    recipe, baseline, best, records = choose_recipe(study, workload, facts, name, confirmation)
    with RecipeStore.open(options.storage) as store:
        recipe = store.save(recipe)
    outcome = SearchOutcome(name, recipe, baseline, best, records, stopped, time.monotonic() - started, confirmation)
    notify("done", outcome)
    return outcome


__all__ = ["CONSTRAINTS", "SearchOptions", "SearchOutcome", "TrialRecord", "check_options", "host_lock", "search"]
