"""What a search records in its Optuna study, and how it is read back: the leaf of ``autotune.study``.

Every trial's outcome is stored as user attributes of its Optuna trial (keys in ``Attr``), the study's
own facts as user attributes of the study (``StudyAttr``); ``records(study)`` reads them back as
``TrialRecord`` s. The search loop, the confirmation, the seeds, the budget and the report all read
and write through these names, so a key is spelled in one place.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal

from ..measure import MIN_MARGIN, Runs, span_margin
from ..recipe import Recipe, format_speedup
from ..trial.spec import Status, TrialResult

if TYPE_CHECKING:
    import optuna
    from optuna.storages import BaseStorage
    from optuna.trial import FrozenTrial


class Attr:
    """User-attribute keys of a study's trials. The owner of a trial (host, pid, its start time) is
    recorded under the keys of ``autotune.trial.lock.owner()``; the measured ``TrialResult`` under
    its own field names (``RESULT``)."""

    ROLE: Final = "role"
    PARAMS: Final = "params"
    STATUS: Final = "status"
    ERROR: Final = "error"
    WALL_S: Final = "wall_s"
    TIMED_S: Final = "timed_s"
    INFEASIBLE: Final = "infeasible"  # why a measured trial does not count (quality guard, a knob not in effect)
    LOSS_SAMPLES: Final = "loss_samples"
    RUN_STARTED: Final = "run_started"  # wall clock: comparable between workers
    RUN_ENDED: Final = "run_ended"
    CONFIRMS: Final = "confirms"  # a confirmation run: the trial it re-measures
    ROUND: Final = "round"  # ... and its round
    RACE: Final = "race"  # why a candidate's race stopped (slower with confidence, below the incumbent, ...)
    ENVIRONMENT_FACTOR: Final = "environment_factor"  # its environment / the defaults' (an Interval's dict)
    GUARD: Final = "quality_guard"  # what the quality guard's second look found, where it took one (``guard``)
    RESULT: Final = ("status", "samples_per_s", "objective", "spread", "windows", "compile_s", "startup_s",
                     "warmup_s", "timed_s", "once_s", "loss", "loss_source", "wall_s", "error", "in_effect", "warnings",
                     "log_tail", "speedup_low", "speedup_high", "method", "pairs", "peak_memory_bytes",
                     "baseline_samples_per_s", "data_wait", "phases", "operators")


class StudyAttr:
    """User-attribute keys of the study itself."""

    FINGERPRINT: Final = "fingerprint"  # the hardware the study is measured on
    WORKLOAD: Final = "workload"
    CPU_SET: Final = "cpu_set"
    BASELINE_LOSS: Final = "baseline_loss"
    LOSS_SOURCE: Final = "loss_source"  # what the guard's losses are where not the held-out loss (``TrialResult``)
    BASELINE_SAMPLES_PER_S: Final = "baseline_samples_per_s"
    OOM_BATCH_SIZE: Final = "oom_batch_size"  # older studies: the smallest global batch that ran out of memory
    OOM_LIMITS: Final = "oom_limits"  # memory-relevant settings -> the smallest batch that ran out of memory
    MEASURE: Final = "measure"  # how trial values are measured: "paired-v1" = speedups; absent = samples/s (old)
    NOISE: Final = "noise"  # the A/A calibration of this machine (dict), shown to the user
    LOSS_SPREAD: Final = "loss_spread"  # the defaults' loss at several training seeds (``guard``), once needed
    NOT_SEEDED: Final = "not_seeded"  # precisions not seeded, measured hopeless in the kernels: dtype -> why
    FLOP_PER_SAMPLE: Final = "flop_per_sample"  # a training step per sample (``roofline``); None: not counted
    MATMUL_GFLOPS: Final = "matmul_gflops"  # the machine's measured matmul peak per dtype (``probes.Limits``)
    SCRIPT_OWNS: Final = "script_owns"  # script mode: knobs the script sets itself, left out: knob -> why
    USER_RUNS: Final = "user_runs"  # the claim's process pairs of your training (``claim.UserRuns.to_dict``)
    TESTED_RUNS: Final = "tested_runs"  # those that tested ``Confirmation.undecided`` first and did not confirm it


Role = Literal["baseline", "heuristic", "warm-start", "seed", "combined", "interaction", "search", "in-process",
               "confirm"]
BASELINE: Final = "baseline"  # PyTorch's defaults: what every trial is compared with
WARM_START: Final = "warm-start"  # the recipe stored earlier for this workload and hardware
SEARCH: Final = "search"  # sampled by Optuna
IN_PROCESS: Final = "in-process"  # sampled by Optuna in an environment that starts no process (the budget's end)
COMBINED: Final = "combined"  # the fastest environment with the fastest in-process knobs (``seeds.combination``)
INTERACTION: Final = "interaction"  # the best in-process recipe with a change that may pay only beside it
CONFIRM: Final = "confirm"  # a side-by-side re-run of a candidate or the baseline

PAIRED: Final = "paired-v1"  # StudyAttr.MEASURE of a study whose trial values are speedups over the defaults

# Outcomes that count toward --trials.
MEASURED = (Status.OK, Status.OOM, Status.NAN, Status.CRASH, Status.TIMEOUT, Status.PRUNED)
NOT_RUN = (Status.SKIPPED, Status.DUPLICATE)  # recorded without running: known to run out of memory, or a repeat
CONSTRAINTS = ("quality", "fits_memory", "finite_loss", "applied")  # Optuna constraints: feasible when all <= 0


def params_key(params: dict[str, Any]) -> str:
    """One string per distinct recipe: how seeds, candidates and confirmation runs are matched."""
    return json.dumps(params, sort_keys=True, default=str)


@dataclass(frozen=True)
class TrialRecord:
    number: int
    role: str  # a ``Role``: baseline, heuristic, warm-start, seed, combined, interaction, search, in-process, confirm
    params: dict[str, Any]
    result: TrialResult
    feasible: bool
    reason: str | None = None
    rejected_by: tuple[str, ...] = ()  # the constraints (``CONSTRAINTS``) an infeasible trial broke
    round: int = 0  # a confirmation's round (``Attr.ROUND``): each in fresh worker processes


def records(study: optuna.Study) -> list[TrialRecord]:
    """Every finished trial of the study as a ``TrialRecord``, in order."""
    out = []
    for t in study.get_trials(deepcopy=False):
        attrs = t.user_attrs
        if Attr.STATUS not in attrs or Attr.PARAMS not in attrs:
            continue
        result = TrialResult.from_dict(attrs)  # the result's fields among the trial's attributes
        # set_constraint's key -> value (feasible when all <= 0); the loop also stores them as a list for
        # optuna-dashboard, which Optuna reads back as keys "0", "1", ...: by name where named, else in order
        constraints = t.constraints
        named = ({k: v for k, v in constraints.items() if k in CONSTRAINTS}
                 or dict(zip(CONSTRAINTS, constraints.values(), strict=False)))
        feasible = result.status == Status.OK and all(v <= 0 for v in named.values())
        reason = attrs.get(Attr.INFEASIBLE) or (attrs.get(Attr.ERROR) if result.status != Status.OK else None)
        broken = tuple(k for k, v in named.items() if v > 0)
        out.append(TrialRecord(t.number, attrs.get(Attr.ROLE, SEARCH), attrs[Attr.PARAMS], result, feasible, reason,
                               broken, int(attrs.get(Attr.ROUND, 0))))
    return out


def study_margin(study: optuna.Study) -> float:
    """The margin a recipe's low bound must clear over 1: the study's calibrated one (``StudyAttr.NOISE``),
    ``MIN_MARGIN`` before the calibration."""
    return float((study.user_attrs.get(StudyAttr.NOISE) or {}).get("margin", MIN_MARGIN))


def lineup(study: optuna.Study, top: int, rounds: int = 1) -> tuple[TrialRecord | None, list[TrialRecord]]:
    """The baseline's record and the ``top`` fastest feasible distinct recipes' records: what a
    confirmation of ``rounds`` rounds re-runs (and the budget keeps time for). A recipe whose search interval lies
    wholly below what those rounds must clear (``confirm_bar``) is left out: its confirmation could not make it
    the recipe, so the time to confirm it would be lost. They come highest low bound first, the order in which
    the confirmation keeps their rounds' time: a narrow 1.15x [1.12-1.17] before a wide 1.25x [0.77-2.00], whose
    rounds (another environment's process pairs) had left the first one round."""
    searched = [r for r in records(study) if r.role != CONFIRM]
    baseline = next((r for r in searched if r.role == BASELINE and r.result.status == Status.OK), None)
    if baseline is None:
        return None, []
    bar = confirm_bar(study, rounds)
    seen = {params_key(baseline.params)}
    picked: list[TrialRecord] = []
    for r in sorted((r for r in searched if r.feasible), key=lambda r: -(r.result.objective or 0.0)):
        if r.result.speedup_high is not None and r.result.speedup_high < bar:
            continue
        if params_key(r.params) not in seen and len(picked) < top:
            seen.add(params_key(r.params))
            picked.append(r)
    return baseline, sorted(picked, key=lambda r: -(r.result.speedup_low or r.result.objective or 0.0))


# Confirmed medians this close are as fast for a user (the search benchmark's near-optimal tolerance): the surer wins
ALIKE = 0.03


def offer_bar(margin: float, rounds: int) -> float:
    """What a confirmation of ``rounds`` rounds asks of a candidate's low bound: ``1 + margin`` (the calibration's)
    over one round, 1 + the 2% floor over more (``measure.span_margin``)."""
    return 1 + span_margin(margin, rounds)


def confirm_bar(study: optuna.Study, rounds: int) -> float:
    """``offer_bar`` with the study's calibrated margin."""
    return offer_bar(study_margin(study), rounds)


def contenders(top: list[TrialRecord], bar: float) -> list[TrialRecord]:
    """Of ``lineup``'s candidates, those likely to become the recipe: not one whose search interval lies wholly
    below the first's search low bound, nor one whose search median is below ``bar`` (``confirm_bar``: more likely
    than not, fresh pairs read it there too, and the defaults are kept). The time kept for the confirmation counts
    these only: the others are confirmed in the time left, or left out for time (``confirm.Rounds``), and time
    kept for them would stop the search early."""
    if not top:
        return []
    floor = top[0].result.speedup_low or 0.0
    return [r for r in top if (r is top[0] or (r.result.speedup_high or 0.0) >= floor)
            and (r.result.objective or 0.0) >= bar]


@dataclass(frozen=True)
class Candidate:
    """One recipe in the confirmation: its search trial's speedup and its confirmation's (fresh pairs)."""

    number: int  # the trial that measured it first
    role: str
    params: dict[str, Any]
    first: float  # the search's median speedup
    confirmed: TrialResult | None = None  # the confirmation's measurement (its rounds combined): only it decides
    failed: str | None = None  # why its confirmation failed: it is out of the contest
    rounds: int = 0  # confirmation rounds behind ``confirmed``, each in fresh processes

    @property
    def median(self) -> float:
        return (self.confirmed.objective or 0.0) if self.confirmed else 0.0

    @property
    def low(self) -> float:
        return (self.confirmed.speedup_low or 0.0) if self.confirmed else 0.0

    @property
    def high(self) -> float:
        return (self.confirmed.speedup_high or 0.0) if self.confirmed else 0.0

    @property
    def pairs(self) -> int:
        return (self.confirmed.pairs or 0) if self.confirmed else 0

    def interval(self) -> str:
        """``1.23x [1.15-1.31]``"""
        return format_speedup(self.median, self.low, self.high)

    @property
    def claim(self) -> str:
        """What its confirmation claims (``recipe.CLAIMS``): ``confirmed`` over two rounds or more, else
        ``provisional`` (one round's interval does not see how a speedup varies between processes)."""
        return "confirmed" if self.rounds >= 2 else "provisional"


@dataclass(frozen=True)
class UserRuns:
    """The claim's process pairs of the recipe of trial ``number``: ``runs`` (their ratios; empty: none ran), the
    pairs asked, why fewer ran (or none was asked), and the search's process pairs by environment, whose spread the
    claim may borrow (``Runs.mean``)."""

    number: int
    runs: Runs
    asked: int
    why: str | None = None
    lent: tuple[tuple[float, ...], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"trial": self.number, "ratios": list(self.runs.ratios), "run_s": self.runs.run_s,
                "asked": self.asked, "why": self.why, "lent": [list(g) for g in self.lent]}


@dataclass(frozen=True)
class Confirmation:
    baseline: Candidate  # the defaults: their A/A (the calibration) is their measurement
    candidates: tuple[Candidate, ...]  # highest confirmed median first; failed ones last
    note: str | None = None  # why it was shortened or not run
    runs: int = 0  # confirmation measurements made by this search (not earlier ones)
    wall_s: float = 0.0
    margin: float = field(default=MIN_MARGIN)  # the calibration's: one round's speedup counts above 1 + margin
    user: UserRuns | None = None  # its choice's process pairs of your training (``claim.user_runs``)
    tested: UserRuns | None = None  # those that tested ``undecided`` before ``user`` and did not confirm it

    def bar(self, candidate: Candidate) -> float:
        """What ``candidate``'s low bound must clear (``offer_bar`` over its rounds)."""
        return offer_bar(self.margin, candidate.rounds)

    def _faster(self) -> list[Candidate]:
        """The confirmed candidates whose speedup's LOW bound is above their ``bar``, of those the most rounds
        confirmed: an interval over fewer rounds has not seen how a speedup varies between processes as theirs
        has."""
        faster = [c for c in self.candidates if c.confirmed is not None and c.failed is None
                  and c.low > self.bar(c)]
        most = max((c.rounds for c in faster), default=0)
        return [c for c in faster if c.rounds == most]

    @property
    def fastest(self) -> Candidate | None:
        """Of ``_faster``, the one with the highest median."""
        return max(self._faster(), key=lambda c: c.median, default=None)

    @property
    def best(self) -> Candidate | None:
        """The recipe's candidate, or None: keep the defaults. Of ``_faster``, those alike the fastest one (a median
        within ``ALIKE`` of its: as fast, for a user), the one surest to be fast (the highest low bound): of two alike
        medians, the one whose fresh-process rounds disagreed less. A median further below is not alike, however wide
        the fastest's interval: over two rounds a Student-t interval is 12.7 standard errors each side, and which of
        two intervals has the higher low bound says which one's rounds happened to agree (docs/measurement.md)."""
        return _surest_alike(self._faster())

    @property
    def undecided(self) -> Candidate | None:
        """The candidate its rounds could not decide: over two rounds or more, its median above its bar and its low
        bound not (a Student-t interval over three rounds reaches 4.3 standard errors each side; over two, 12.7),
        where none is offered (``best`` is None), where only one round chose
        the offer and this one's median is above the offer's (the budget's end left a faster recipe's deciding
        round for a lower one's first), or where its median is above the fastest's by more than ``ALIKE`` (a faster
        recipe's interval over two rounds can reach below its bar). Your runs'
        fresh process pairs, none of which chose it, decide it: offered where they confirm it (provisional where the
        budget's end left them too few and nothing else is offered), else the offer stands, stated from its own pairs
        where they ran after (``claim.user_runs``, ``claim.stated``). One candidate is tested, so no other look shares
        the pairs' confidence: of several (two rounds or three alike), as ``best`` chooses among its own, of those
        alike the fastest straddling median the highest low bound (by the low bound alone, a slow recipe whose rounds
        agreed would be tested before a fast one whose rounds did not)."""
        best, fastest = self.best, self.fastest
        floor = 0.0 if best is None or fastest is None else \
            fastest.median * (1 + ALIKE) if best.rounds >= 2 else best.median  # the median it must be above
        straddling = [c for c in self.candidates if c.confirmed is not None and c.failed is None and c.rounds >= 2
                      and c.median > self.bar(c) and c.low <= self.bar(c) and c.median > floor]
        return _surest_alike(straddling)


def _surest_alike(candidates: list[Candidate]) -> Candidate | None:
    """Of ``candidates``, those alike the fastest (a median within ``ALIKE`` of its), the one surest to be fast: the
    highest low bound; None of none."""
    top = max((c.median for c in candidates), default=0.0)
    return max((c for c in candidates if c.median * (1 + ALIKE) >= top), key=lambda c: (c.low, c.median), default=None)


@dataclass(frozen=True)
class SearchOutcome:
    study: str
    recipe: Recipe
    baseline: TrialRecord
    best: TrialRecord
    records: list[TrialRecord]
    stopped: str
    elapsed_s: float
    confirmation: Confirmation | None = None
    noise: dict[str, Any] | None = None  # the calibration (``autotune.measure.Noise`` as a dict)
    spent: dict[str, float] = field(default_factory=dict)  # where the trials' time went (``report.time_spent``)


# Optuna has no public way for what the ask/tell loop needs beyond ask and tell: recording a heartbeat,
# failing a trial another (dead) process asked, creating a RUNNING trial from a finished one's template
# (a confirmation run). These two helpers are the only places that reach Optuna's storage and ids.
def optuna_storage(study: optuna.Study) -> tuple[BaseStorage, int]:
    """The study's storage and the study's id in it."""
    return study._storage, study._study_id


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    """A trial's id in its storage."""
    return trial._trial_id


__all__ = [
    "ALIKE", "BASELINE", "COMBINED", "CONFIRM", "CONSTRAINTS", "INTERACTION", "IN_PROCESS", "MEASURED", "NOT_RUN",
    "PAIRED", "SEARCH", "WARM_START",
    "Attr", "Candidate", "Confirmation", "Role", "SearchOutcome", "StudyAttr", "TrialRecord", "confirm_bar",
    "contenders", "lineup", "offer_bar", "optuna_storage", "params_key", "records", "trial_id",
]
