"""A search: an Optuna study whose trials are real training runs, within a time budget.

Trial 0 is PyTorch's defaults (the baseline), then the seeds (``autotune.study.seeds``); then TPE
samples the knobs that matter on this hardware (``autotune.study.loop``). Every trial's outcome is
recorded in the study's storage as soon as it ends, so an interrupted search loses nothing and
``--study NAME`` continues it. The candidates are confirmed side by side (``autotune.study.confirm``)
and the recipe chosen (``autotune.study.choice``) and stored.
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

from .. import probes
from .. import search_spaces as spaces
from ..database import check_storage_url, create_schema, engine_kwargs, storage_errors, use_wal
from ..errors import HardwareMismatchError, TrialError, UsageError
from ..measure import Noise, PairedMeasurer
from ..probes import outdated_fingerprint
from ..recipe import search_command
from ..store import RecipeStore
from ..trial.spec import Status
from ..workloads import Workload, call_user, load_workload
from . import machine, roofline
from .budget import Budget, parse_duration
from .choice import choose_recipe, time_spent
from .claim import searched_noise
from .confirm import confirm
from .events import Progress, SearchDone, SearchStarted, ignore
from .liveness import fail_orphans
from .loop import SearchLoop
from .options import SearchOptions, check_options
from .outcome import SearchOutcome
from .records import BASELINE, PAIRED, Attr, StudyAttr
from .seeds import check_fixed, history_conflict, not_seeded, seeds, space_digest
from .turns import fresh_processes

if TYPE_CHECKING:
    import optuna
    import torch
    from optuna.storages import RDBStorage

    from ..probes import Facts

log = logging.getLogger(__name__)


def open_study(options: SearchOptions, name: str, facts: Facts, workload: str) -> tuple[optuna.Study, bool]:
    """The study (and whether this call created it); refuses one measured on other hardware."""
    import optuna

    check_storage_url(options.storage)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # Heartbeats are "experimental" and "meant for Study.optimize"; the ask/tell loop records them itself.
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    with storage_errors(options.storage):
        storage = rdb_storage(options.storage)
        sampler: optuna.samplers.BaseSampler = optuna.samplers.TPESampler(
            multivariate=True, group=True, seed=options.seed, n_startup_trials=6
        )
        if options.fixed:
            sampler = optuna.samplers.PartialFixedSampler(options.fixed, sampler)
        # no pruner: a candidate is stopped early by the race (race.race_stop), and told to Optuna complete
        kwargs: dict[str, Any] = dict(storage=storage, sampler=sampler, study_name=name, direction="maximize",
                                      pruner=optuna.pruners.NopPruner())
        try:  # exactly one worker of a shared study creates it, and only that one seeds it
            study, created = optuna.create_study(**kwargs), True
        except optuna.exceptions.DuplicatedStudyError:
            study, created = optuna.load_study(**{k: v for k, v in kwargs.items() if k != "direction"}), False
    _check_hardware(study, name, facts, workload)
    if created or (not study.get_trials(deepcopy=False) and StudyAttr.MEASURE not in study.user_attrs):
        study.set_user_attr(StudyAttr.MEASURE, PAIRED)  # its values are speedups over the defaults
        study.set_metric_names(["speedup"])  # how optuna-dashboard labels them
    if created:
        _note_outdated_studies(storage, name, workload)
    return study, created


def samples_per_s_study(study: optuna.Study) -> bool:
    """Whether the study was recorded by an older autotune: its trial values are samples/s of single
    processes, not speedups over the defaults (``StudyAttr.MEASURE``)."""
    return study.user_attrs.get(StudyAttr.MEASURE) != PAIRED and bool(study.get_trials(deepcopy=False))


def _check_hardware(study: optuna.Study, name: str, facts: Facts, workload: str) -> None:
    """Record this machine in a new study; refuse a worker whose hardware or CPU set differs, and a study
    recorded with another fingerprint scheme (its trials stay in the storage, untouched)."""
    cpu_set = _cpu_set(facts)
    recorded = study.user_attrs.get(StudyAttr.FINGERPRINT)
    if recorded is None:
        study.set_user_attr(StudyAttr.FINGERPRINT, facts.fingerprint)
        study.set_user_attr(StudyAttr.WORKLOAD, workload)
        study.set_user_attr(StudyAttr.CPU_SET, cpu_set)
        return
    why = outdated_fingerprint(recorded)
    if why:
        raise HardwareMismatchError(
            f"study {name!r} was {why}: its trials are kept, but it cannot be continued; search again in a new "
            f"study: {search_command(workload, '--study NEW_NAME')} (or without --study)"
        )
    # The fingerprint leaves out the affinity (taskset): trials of one study must still run on the same CPUs.
    recorded_set = study.user_attrs.get(StudyAttr.CPU_SET, cpu_set)
    if recorded != facts.fingerprint or recorded_set != cpu_set:
        raise HardwareMismatchError(
            f"study {name!r} was measured on hardware {recorded} ({recorded_set}), this machine is "
            f"{facts.fingerprint} ({cpu_set}): run this worker on the same hardware and CPU set, or use another "
            "--study name"
        )


def _cpu_set(facts: Facts) -> str:
    """The shape of the CPUs this process may use, as the study's workers must share it."""
    allowed = facts.cpu.allowed
    return (f"{allowed.packages} package(s), {len(allowed.numa_nodes)} NUMA node(s), {allowed.cores} core(s), "
            f"{allowed.threads} thread(s) allowed")


def _note_outdated_studies(storage: RDBStorage, name: str, workload: str) -> None:
    """Say which studies of this workload a new search leaves behind because of their fingerprint scheme."""
    import optuna

    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        why = outdated_fingerprint(summary.user_attrs.get(StudyAttr.FINGERPRINT))
        if why and summary.user_attrs.get(StudyAttr.WORKLOAD) == workload:
            log.warning("study %r (%d trials) of workload %s is not continued: it was %s; this search starts "
                        "study %r", summary.study_name, summary.n_trials, workload, why, name)


def rdb_storage(url: str) -> RDBStorage:
    """Optuna's RDB storage, with heartbeats and a PostgreSQL connection's time limits (``database.engine_kwargs``);
    several workers may create its schema at once. SQLite is put in WAL mode (``database.use_wal``): ``autotune
    studies``/``best`` read while the search writes."""
    import optuna

    use_wal(url)
    return create_schema(lambda: optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs(url), heartbeat_interval=5,
                                                            grace_period=20))


def search_context(workload_spec: str, facts: Facts, options: SearchOptions) -> tuple[Workload, spaces.SpaceContext]:
    """The workload and the context its space is built in: device, default batch, conv layers, the
    batch-size cap from the probed memory, what may be pruned."""
    workload = load_workload(workload_spec)
    import torch

    model = call_user(f"{workload_spec}'s model()", workload.model)
    conv, conv_nd = spaces.conv_layers(model)
    device: Literal["cpu", "cuda"] = "cuda" if facts.gpus and torch.cuda.is_available() else "cpu"
    shared = one_context_only(facts) if device == "cuda" else None
    if shared:
        raise UsageError(shared)
    unprobed = unprobed_devices(facts)
    if unprobed:
        log.warning("%s: the search runs on %s", unprobed, "the probed GPUs" if facts.gpus else "the CPU")
    ctx = spaces.SpaceContext(
        device=device, default_batch_size=workload.batch_size, conv=conv, conv_nd=conv_nd,
        global_batch=options.global_batch,
        allow_compile=options.compile, max_batch_size=_max_batch(workload, model, facts, device),
        unused_parameters=_unused_parameters(workload, model), **spaces.sparsity.context(model),
    )
    return workload, ctx


def one_context_only(facts: Facts) -> str | None:
    """Why this GPU cannot host the search: its compute mode takes one CUDA context at a time (or none), while
    a search compares processes side by side on it (a paired worker beside process pairs); None when it can."""
    gpu = next((g for g in facts.gpus if g.compute_mode not in (None, "Default")), None)
    if gpu is None:
        return None
    return (f"GPU {gpu.index} ({gpu.name}) is in compute mode {gpu.compute_mode}: a search runs several processes "
            f"on it side by side; set it to Default first (sudo nvidia-smi -i {gpu.nvml_index} -c DEFAULT), "
            "or hide it (CUDA_VISIBLE_DEVICES=) to search on the CPU")


def unprobed_devices(facts: Facts) -> str | None:
    """Why the probe's GPUs are fewer than the CUDA devices torch sees (NVML skipped some, see the probe's
    warnings), or None when they agree."""
    import torch

    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if seen <= len(facts.gpus):
        return None
    return f"torch sees {seen} CUDA device(s), the probe read {len(facts.gpus)} from NVML"


def _max_batch(workload: Workload, model: torch.nn.Module, facts: Facts, device: str) -> int | None:
    """The batch size the probed memory should hold (``search_spaces.batch.max_batch_size``): a GPU's
    memory, else the RAM available now; estimated from a forward pass of two of the dataset's samples."""
    import torch

    if device == "cuda":
        memory = min((g.memory_bytes for g in facts.gpus), default=None)
    else:
        memory = facts.memory.available_bytes
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


def _unused_parameters(workload: Workload, model: torch.nn.Module) -> bool:
    """Whether some parameter gets no gradient (``search_spaces.ddp.unused_parameters``): DDP then needs
    ``find_unused_parameters``. Looked at once, on two of the dataset's samples on the CPU (the model's
    forward only, as the batch-size estimate runs it: the user's loss is never called here)."""
    import torch

    try:
        dataset = workload.dataset()
        batch = torch.utils.data.default_collate([dataset[i] for i in range(min(2, len(dataset)))])
        unused = spaces.ddp.unused_parameters(model, tuple(workload.model_inputs(batch)))
    except Exception as e:  # noqa: BLE001 - the trials report a broken workload with its traceback
        log.debug("unused parameters not looked for: %s", e)
        return False
    if unused:
        log.info("parameters without a gradient (%s): DDP runs with find_unused_parameters", ", ".join(unused[:5]))
    return bool(unused)


def run_settings(ctx: spaces.SpaceContext, options: SearchOptions) -> dict[str, Any]:
    """The settings every trial of the search runs with besides its knobs (device, reference batch, lr rule)."""
    return {
        "device": ctx.device,
        "reference_batch": ctx.default_batch_size,
        "global_batch": options.global_batch,
        "lr_scaling": "none" if options.global_batch else options.lr_scaling,
    }


def _open_for_options(options: SearchOptions, name: str, facts: Facts, ctx: spaces.SpaceContext,
                      workload: str) -> tuple[optuna.Study, bool, str]:
    """The study to search in, whether it was created, and its name. A default study (no ``--study``)
    searched with other choices than these options give goes on in a study of its own, named after the
    choices, so the same command still continues it; a study named with ``--study`` is refused."""
    study, created = open_study(options, name, facts, workload)
    if samples_per_s_study(study):
        if options.study is not None:
            raise UsageError(
                f"study {name!r} holds samples/s of single processes (recorded by an older autotune), not paired "
                "speedups over the defaults: it is kept as it is, but cannot be continued; search in a new study: "
                f"{search_command(workload, '--study NEW_NAME')} (or without --study)"
            )
        old, name = name, f"{name}-{PAIRED}"
        log.warning("study %r holds samples/s (an older autotune): kept untouched; this search goes on in study %r",
                    old, name)
        study, created = open_study(options, name, facts, workload)
    conflict = None if created else history_conflict(study, name, facts, ctx)
    if conflict and options.study is None:
        name = f"{name}-{space_digest(facts, ctx)}"
        log.warning("%s: this search goes on in study %r", conflict, name)
        study, created = open_study(options, name, facts, workload)
        conflict = None if created else history_conflict(study, name, facts, ctx)
    if conflict:
        raise UsageError(
            f"{conflict}: continue it with the options it started with, or start another with --study NAME"
        )
    return study, created, name


def _has_baseline(study: optuna.Study) -> bool:
    import optuna

    return any(t.user_attrs.get(Attr.ROLE) == BASELINE and t.user_attrs.get(Attr.STATUS) == Status.OK
               for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))


def search(workload: str, *, options: SearchOptions | None = None, progress: Progress | None = None,
           budget: str | float | None = None, trials: int | None = None,
           measurer: PairedMeasurer | None = None, facts: Facts | None = None,
           measured: probes.Measured | None = None, ctx: spaces.SpaceContext | None = None,
           stem: str | None = None, attrs: dict[str, Any] | None = None,
           timing: Budget | None = None, sampler: optuna.samplers.BaseSampler | None = None) -> SearchOutcome:
    """Search the knobs for ``workload`` and store the best recipe; ``progress`` receives the events
    of ``autotune.study.events``. ``measurer`` measures the trials (default: the live paired workers,
    ``autotune.measure.live.measurer.LiveMeasurer``; a replayed grid plugs in here); the search closes it.
    ``facts``: the machine whose space is searched (default: this one, probed now; a replayed grid's
    is the machine that recorded it). ``measured``: its kernels' measured speeds, which order and drop the
    precision seeds (default: this machine's, ``probes.measured``, cached, where the measurer's are this
    machine's, ``machine_speeds``; none for a replayed grid's). ``ctx`` and ``stem``: the space's context and the
    default study name's stem where ``workload`` names no workload factory (script mode, ``study.script_mode``);
    ``attrs``: user attributes set on the study once it is open. ``timing``: the search's time, begun before
    (script mode's, at its first copy) or on another clock (a replay's); default: ``options.budget_s`` from now.
    ``sampler``: an Optuna sampler in place of autotune's (a benchmark's baseline: random search, TPE at its
    defaults, one factor at a time), in the same loop, measurer, clock and confirmation; it picks every trial after
    the baseline (no seeds, whatever ``options.seeded`` says, and no in-process turns); ``options.fixed`` holds.

    >>> outcome = search("tiny", budget="60s")          # doctest: +SKIP
    >>> outcome.recipe.speedup                           # doctest: +SKIP
    """
    options = options or SearchOptions()
    if sampler is not None:
        options = replace(options, seeded=False)
    if budget is not None:
        options = replace(options, budget_s=parse_duration(budget) if isinstance(budget, str) else float(budget))
    if trials is not None:
        options = replace(options, trials=trials)
    check_options(options)
    timing = timing or Budget.start(options.budget_s)
    started = timing.now()
    notify = progress or ignore

    facts = facts or probes.probe()
    wl, ctx = search_context(workload, facts, options) if ctx is None else (None, ctx)
    check_fixed(options.fixed, facts, ctx)  # before the study is created: a refused --fix writes nothing
    name = options.study or f"{wl.name if wl is not None else stem}-{facts.fingerprint}"
    study, created, name = _open_for_options(options, name, facts, ctx, workload)
    fail_orphans(study)  # trials of a search killed on this host: failed now, their seeds free again
    if sampler is not None:
        import optuna

        study.sampler = optuna.samplers.PartialFixedSampler(options.fixed, sampler) if options.fixed else sampler
    for key, value in (attrs or {}).items():
        study.set_user_attr(key, value)
    run = run_settings(ctx, options)
    notify(SearchStarted(name, facts, ctx, options.budget_s, not created, {**spaces.defaults(facts, ctx), **run}))
    if measured is None and (measurer is None or measurer.machine_speeds):
        measured = machine.kernel_speeds(facts, ctx.device, timing)
    roofline.record(study, wl, machine.limits(measurer, facts, ctx.device, timing))
    # what the turns read of a seed's promise (``seeds.promising``): this search's, none where it measured none
    study.set_user_attr(StudyAttr.KERNEL_SPEEDS, {k.dtype: k.speed for k in measured.precision} if measured else {})
    skipped = not_seeded(facts, ctx, measured)
    if skipped:
        study.set_user_attr(StudyAttr.NOT_SEEDED, skipped)
    loop = SearchLoop(study, workload, facts, ctx, run, options, timing, notify,
                      seeds=seeds(facts, ctx, options, workload, measured, fresh_processes=fresh_processes(measurer),
                                  copy=measurer is not None and measurer.in_place_only),
                      measurer=measurer, outside_sampler=sampler is not None)
    try:
        stopped = loop.run()
        searching = loop.searching(timing.now())
        if not _has_baseline(study):
            raise TrialError(
                f"the baseline (PyTorch defaults) did not complete: {loop.baseline_error or 'not run'}; "
                "fix the workload or give a larger --budget"
            )
        confirmation = confirm(loop)
    finally:
        loop.measurer.close()  # every worker process ends with the search (Ctrl-C included)
    recipe, baseline, best, records = choose_recipe(study, workload, facts, name, confirmation, searching)
    with RecipeStore.open(options.storage) as store:
        stored = store.save(recipe)
    if loop.interrupted is not None:  # in your runs: the recipe their pairs so far state is stored, then it stops
        raise loop.interrupted
    # The interval as measured, whether or not this storage has columns for it yet (the store reads back the rest).
    recipe = replace(stored, **{k: getattr(recipe, k) for k in ("speedup_low", "speedup_high", "peak_memory_bytes")
                                if getattr(stored, k) is None})
    calibrated = study.user_attrs.get(StudyAttr.NOISE)  # a continued study's may be another version's: none then
    noise = searched_noise(calibrated if Noise.stored(calibrated) else None, loop, confirmation, best)
    if noise is not None:  # the report reads it: without, it said "between fresh processes not measured"
        study.set_user_attr(StudyAttr.NOISE, noise)
    outcome = SearchOutcome(name, recipe, baseline, best, records, stopped, timing.now() - started, confirmation,
                            noise, time_spent(records, searching))
    notify(SearchDone(outcome))
    return outcome


__all__ = ["open_study", "rdb_storage", "run_settings", "samples_per_s_study", "search", "search_context"]
