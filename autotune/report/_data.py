"""What the report shows, read from a study as stored (read-only): plain data, no HTML.

A paired study (``StudyAttr.MEASURE == "paired-v1"``) stores speedups over the defaults with their
intervals; an older one stores samples/s, shown as the ratio to its baseline's, without an interval.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..database import shown_url, storage_errors
from ..errors import UsageError
from ..measure import Noise
from ..recipe import checked, matmul_dtype
from ..search_spaces import RUN_KEYS
from ..store import RecipeStore
from ..study import roofline
from ..study.records import BASELINE, CONFIRM, StudyAttr, TrialRecord, params_key, records
from ..study.summaries import open_storage
from ..trial.spec import Status

if TYPE_CHECKING:
    import optuna

    from ..probes import Facts
    from ..recipe import Recipe

PAIRED = "paired-v1"
MIN_IMPORTANCE_TRIALS = 8  # Optuna's importances from fewer measured trials say more about chance than the knobs


@dataclass(frozen=True)
class Row:
    """One trial as the report shows it."""

    number: int
    role: str
    status: str
    outcome: str  # ok | infeasible | failed | stopped early
    speedup: float | None
    low: float | None  # the speedup's interval (paired studies only)
    high: float | None
    changed: dict[str, Any]  # its knobs that differ from the defaults
    reason: str | None
    startup_s: float | None
    warmup_s: float | None
    timed_s: float | None
    wall_s: float
    params: dict[str, Any] = field(default_factory=dict)
    samples_per_s: float | None = None  # as measured in its windows
    phases: dict[str, float] | None = None  # where its timed steps went: each part's share (``measure.worker.phases``)
    operators: dict[str, float] | None = None  # its top operators' shares of a profile (the defaults', the fastest)

    @property
    def dtype(self) -> str:
        """The precision its matmuls ran at: what its place against the machine's peak is taken at."""
        return matmul_dtype(self.params)


@dataclass(frozen=True)
class ReportData:
    study: str
    workload: str | None
    fingerprint: str | None
    cpu_set: str | None
    paired: bool
    probe: str  # the probe summary of the machine, or why it is not shown
    defaults: dict[str, Any]
    baseline: Row | None
    best: Row | None
    recipe: Recipe | None
    trials: list[Row]  # measured trials, in order (not confirmation runs)
    confirmations: list[Row]
    noise: Noise | None
    importances: dict[str, float] | None
    importance_note: str
    flop_per_sample: float | None = None  # the workload's, counted once per study (``study.roofline``)
    matmul_gflops: dict[str, float] | None = None  # the machine's matmul peak per dtype, measured


def collect(url: str, study_name: str, facts: Facts | None = None) -> ReportData:
    """Read study ``study_name`` of the storage at ``url`` (read-only) for the report. ``facts``: the machine's,
    when the caller probed it already; otherwise this machine is probed when its fingerprint is the study's."""
    import optuna

    storage = open_storage(url)
    if storage is None:
        raise UsageError(f"no study in {shown_url(url)}: run 'autotune search' first")
    try:
        with storage_errors(url):
            try:
                study = optuna.load_study(study_name=study_name, storage=storage)
            except KeyError:
                names = ", ".join(s.study_name for s in optuna.get_all_study_summaries(storage, False))
                raise UsageError(
                    f"no study {study_name!r} in {shown_url(url)}; its studies: {names or 'none'}") from None
            with RecipeStore.open(url, readonly=True) as store:
                recipe = store.latest(study=study_name)
            return _from_study(study, checked(recipe) if recipe is not None else None, facts)
    finally:
        storage.engine.dispose()


def _from_study(study: optuna.Study, recipe: Recipe | None, facts: Facts | None) -> ReportData:
    attrs = study.user_attrs
    paired = attrs.get(StudyAttr.MEASURE) == PAIRED
    recs = records(study)
    base = next((r for r in recs if r.role == BASELINE and r.result.status == Status.OK), None)
    defaults = dict(base.params) if base else {}
    base_value = base.result.objective if base else None

    def row(r: TrialRecord) -> Row:
        res = r.result
        speed = res.objective if paired else (res.objective / base_value if res.objective and base_value else None)
        return Row(r.number, r.role, str(res.status), _outcome(r), speed, res.speedup_low if paired else None,
                   res.speedup_high if paired else None,
                   {k: v for k, v in r.params.items() if k not in RUN_KEYS and defaults.get(k) != v}, r.reason,
                   res.startup_s, res.warmup_s, res.timed_s, res.wall_s, dict(r.params), res.samples_per_s,
                   res.phases, res.operators)

    trials = [row(r) for r in recs if r.role != CONFIRM]
    baseline = next((t for t in trials if base and t.number == base.number), None)
    noise = attrs.get(StudyAttr.NOISE)
    importances, note = _importances(study, trials)
    flop, matmul = roofline.of(study)
    return ReportData(
        study=study.study_name, workload=attrs.get(StudyAttr.WORKLOAD), fingerprint=attrs.get(StudyAttr.FINGERPRINT),
        cpu_set=attrs.get(StudyAttr.CPU_SET), paired=paired, probe=_probe(attrs.get(StudyAttr.FINGERPRINT), facts),
        defaults=defaults, baseline=baseline, best=_best(trials, recipe), recipe=recipe, trials=trials,
        confirmations=[row(r) for r in recs if r.role == CONFIRM],
        noise=_noise(noise) if isinstance(noise, dict) else None, importances=importances, importance_note=note,
        flop_per_sample=flop, matmul_gflops=matmul,
    )


def _outcome(r: TrialRecord) -> str:
    if r.result.status == Status.OK:
        return "ok" if r.feasible else "infeasible"
    if r.result.status == Status.PRUNED:
        return "stopped early"
    if r.result.status == Status.DUPLICATE:
        return "not measured"  # the same recipe as an earlier trial: that one's row holds the measurement
    if r.result.status == Status.CUT:
        return "cut by the budget"
    return "infeasible" if r.result.status in (Status.OOM, Status.NAN, Status.SKIPPED) else "failed"


def _best(trials: list[Row], recipe: Recipe | None) -> Row | None:
    """The recipe's trial (the confirmed choice) when one is stored, else the fastest feasible trial."""
    if recipe is not None:
        chosen = params_key(recipe.params)
        found = next((t for t in trials if t.outcome == "ok" and params_key(t.params) == chosen), None)
        if found is not None:
            return found
    ok = [t for t in trials if t.outcome == "ok" and t.speedup is not None]
    return max(ok, key=lambda t: t.speedup or 0.0, default=None)


def _noise(data: dict[str, Any]) -> Noise | None:
    return Noise.stored(data)  # another version's, or not well typed: shown as missing rather than wrong


def _probe(fingerprint: str | None, facts: Facts | None) -> str:
    """The probe summary of the machine the study was measured on: this one, when its fingerprint matches."""
    from .. import probes

    if facts is None:
        facts = probes.probe()
    if fingerprint is not None and facts.fingerprint != fingerprint:
        return (f"measured on hardware {fingerprint}; this machine is {facts.fingerprint}: run 'autotune report' "
                "on the machine the study was measured on for its probe summary")
    return probes.summary(facts)


def _importances(study: optuna.Study, trials: list[Row]) -> tuple[dict[str, float] | None, str]:
    """Optuna's parameter importances (PED-ANOVA) over the measured, feasible trials, when there are enough."""
    import optuna

    measured = [t for t in trials if t.outcome == "ok"]
    if len(measured) < MIN_IMPORTANCE_TRIALS:
        return None, (f"not computed: {len(measured)} feasible measured trial(s), fewer than "
                      f"{MIN_IMPORTANCE_TRIALS}; a longer search gives them")
    numbers = {t.number for t in measured}
    subset = optuna.create_study(direction="maximize")
    subset.add_trials([t for t in study.get_trials(deepcopy=False) if t.number in numbers and t.value is not None])
    try:
        with warnings.catch_warnings(record=True) as caught:  # said in the note, not on the user's terminal
            warnings.simplefilter("always")
            found = optuna.importance.get_param_importances(subset)
    except (RuntimeError, ValueError) as e:
        return None, f"not computed: {e}"
    if not found:
        return None, "not computed: the trials share no knob that varied"
    few = sorted({m.group(1) for w in caught if (m := re.search(r"parameter `([^`]+)` have less than",
                                                                    str(w.message)))})
    rough = f"; rough for {', '.join(few)}: a value of it was tried once" if few else ""
    return dict(found), f"Optuna's PED-ANOVA importances over {len(measured)} feasible trials{rough}"


__all__ = ["MIN_IMPORTANCE_TRIALS", "PAIRED", "ReportData", "Row", "collect"]
