"""The studies in a storage, read as they are: what ``autotune studies`` lists and ``autotune best`` compares with.

Nothing here writes: an SQLite file is opened read-only (``database.readonly_connect``), Optuna's tables
are neither created nor migrated, and a database no search has written to simply holds no study. A
search may be writing at the same time (its SQLite file is in WAL mode: readers do not wait for it).

>>> [s.name for s in summaries("sqlite:///studies.db")]   # doctest: +SKIP
['tiny-v3-6df7a97e7c9c']
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..database import check_storage_url, engine_kwargs, shown_url, storage_errors
from ..recipe import problems
from ..store import RecipeStore
from ..trial.spec import Status
from .records import BASELINE, CONFIRM, MEASURED, Attr, StudyAttr, TrialRecord, records

if TYPE_CHECKING:
    import optuna
    from optuna.storages import RDBStorage

    from ..recipe import Recipe


@dataclass(frozen=True)
class StudySummary:
    """One study as ``autotune studies`` shows it. ``speedup`` is the stored recipe's when there is one (``confirmed``
    only where its claim is: two confirmation rounds or more, or the defaults kept), else the best feasible trial's
    single measurement over the baseline's; None before a baseline and a feasible trial exist."""

    name: str
    workload: str | None
    fingerprint: str | None
    trials: int  # measured trials (ok, infeasible, failed, pruned), not confirmation runs
    running: int
    speedup: float | None
    confirmed: bool
    recipe: int | None  # the newest recipe stored for this study
    started: datetime | None  # with the local time zone
    last: datetime | None  # the newest trial's end (or start, while it runs)
    speedup_low: float | None = None  # the stored recipe's interval (paired measurement)
    speedup_high: float | None = None
    claim: str | None = None  # the stored recipe's (``recipe.CLAIMS``); None: no recipe, or stored before it was kept

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "workload": self.workload, "fingerprint": self.fingerprint, "trials": self.trials,
            "running": self.running, "speedup": self.speedup, "speedup_low": self.speedup_low,
            "speedup_high": self.speedup_high, "confirmed": self.confirmed, "claim": self.claim, "recipe": self.recipe,
            "started": self.started.isoformat() if self.started else None,
            "last": self.last.isoformat() if self.last else None,
        }


def open_storage(url: str) -> RDBStorage | None:
    """Optuna's storage at ``url``, opened read-only; None when no search has written to the database."""
    import optuna
    from sqlalchemy import create_engine, inspect

    check_storage_url(url)
    with storage_errors(url):
        kwargs = engine_kwargs(url, readonly=True)
        engine = create_engine(url, **kwargs)
        try:
            if not inspect(engine).has_table("studies"):
                return None
        finally:
            engine.dispose()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs, skip_table_creation=True)


def summaries(url: str) -> list[StudySummary]:
    """Every study in the storage, the most recently active first."""
    import optuna

    storage = open_storage(url)
    if storage is None:
        return []
    try:
        with storage_errors(url), RecipeStore.open(url, readonly=True) as store:
            out = [_summary(optuna.load_study(study_name=s.study_name, storage=storage), store)
                   for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
    finally:
        storage.engine.dispose()
    return sorted(out, key=lambda s: s.last or s.started or datetime.min.replace(tzinfo=timezone.utc), reverse=True)


def _summary(study: optuna.Study, store: RecipeStore) -> StudySummary:
    import optuna

    trials = study.get_trials(deepcopy=False)
    recs = [r for r in records(study) if r.role != CONFIRM]
    recipe = store.latest(study=study.study_name)
    if recipe is not None and problems(recipe):  # what no search writes is listed as no recipe ('best' says why)
        recipe = None
    stored = recipe if recipe is not None and recipe.speedup is not None else None  # else: the best so far
    speedup = stored.speedup if stored is not None else _best_so_far(recs)
    starts = [t.datetime_start for t in trials if t.datetime_start]
    ends = [t.datetime_complete or t.datetime_start for t in trials if t.datetime_start]
    return StudySummary(
        name=study.study_name, workload=study.user_attrs.get(StudyAttr.WORKLOAD),
        fingerprint=study.user_attrs.get(StudyAttr.FINGERPRINT),
        trials=sum(1 for r in recs if r.result.status in MEASURED),
        running=sum(1 for t in trials if t.state == optuna.trial.TrialState.RUNNING),
        speedup=speedup, confirmed=stored is not None and stored.claim in ("confirmed", "defaults"),
        recipe=recipe.id if recipe else None,
        started=_local(min(starts)) if starts else None, last=_local(max(ends)) if ends else None,
        speedup_low=stored.speedup_low if stored else None, speedup_high=stored.speedup_high if stored else None,
        claim=recipe.claim if recipe else None,
    )


def _best_so_far(recs: list[TrialRecord]) -> float | None:
    base = next((r.result.objective for r in recs if r.role == BASELINE and r.result.status == Status.OK), None)
    best = max((r.result.objective or 0.0 for r in recs if r.feasible), default=0.0)
    return best / base if base and best else None


def _local(moment: datetime) -> datetime:
    """Optuna records trial times as naive local times: the same moment with this machine's zone."""
    return moment.astimezone()


def baseline_params(url: str, study: str) -> dict[str, Any] | None:
    """The params of a study's baseline trial (PyTorch's defaults as measured), or None when the storage
    does not hold that study or its baseline."""
    import optuna

    storage = open_storage(url)
    if storage is None:
        return None
    try:
        with storage_errors(url):
            found = optuna.load_study(study_name=study, storage=storage)
            trials = found.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    except KeyError:  # no such study here
        return None
    finally:
        storage.engine.dispose()
    return next((dict(t.user_attrs[Attr.PARAMS]) for t in trials
                 if t.user_attrs.get(Attr.ROLE) == BASELINE and Attr.PARAMS in t.user_attrs), None)


def pytorch_defaults(recipe: Recipe, url: str) -> tuple[dict[str, Any] | None, str]:
    """PyTorch's defaults to compare ``recipe`` with, and where they come from: its study's baseline trial
    in ``url``; else, for a recipe measured on this machine, ``search_spaces.defaults`` for it; else None."""
    if recipe.study:
        try:
            params = baseline_params(url, recipe.study)
        except Exception:  # noqa: BLE001 - a recipe file read without its database: fall back to the space
            params = None
        if params is not None:
            return params, f"the baseline trial of study {recipe.study}"
    from .. import probes
    from .. import search_spaces as spaces

    facts = probes.probe()
    if recipe.fingerprint != facts.fingerprint:
        return None, f"unknown: its study is not in {shown_url(url)} and it was measured on other hardware"
    reference = recipe.params.get("reference_batch")
    ctx = spaces.SpaceContext(device=recipe.params.get("device", "cpu"), default_batch_size=int(reference or 32))
    defaults = spaces.defaults(facts, ctx)
    if reference is None:  # the workload's own batch size is not recorded: no default to compare with
        defaults.pop("batch_per_rank", None)
    return defaults, "PyTorch's defaults on this machine"
