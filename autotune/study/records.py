"""What a search records in its Optuna study, and how it is read back: the leaf of ``autotune.study``.

Every trial's outcome is stored as user attributes of its Optuna trial (keys in ``Attr``), the study's
own facts as user attributes of the study (``StudyAttr``); ``records(study)`` reads them back as
``TrialRecord`` s. The search loop, the confirmation, the seeds, the budget and the report all read
and write through these names, so a key is spelled in one place. The confirmation's rules, which read these
records, are ``confirmation``'s.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, TypeGuard

from ..measure import MIN_MARGIN, Interval, environment_key
from ..search_spaces import BASELINE, HEURISTIC, SEED
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
    AHEAD: Final = "ahead_of_seed"  # an environment's seed that went ahead of a seed's turn (``Turns``)
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
    KERNEL_SPEEDS: Final = "kernel_speeds"  # each precision's kernels against float32's here (``KernelSpeed.speed``)
    FLOP_PER_SAMPLE: Final = "flop_per_sample"  # a training step per sample (``roofline``); None: not counted
    MATMUL_GFLOPS: Final = "matmul_gflops"  # the machine's measured matmul peak per dtype (``probes.Limits``)
    SCRIPT_OWNS: Final = "script_owns"  # script mode: knobs the script sets itself, left out: knob -> why
    USER_RUNS: Final = "user_runs"  # the claim's process pairs of your training (``confirmation.UserRuns.to_dict``)
    TESTED_RUNS: Final = "tested_runs"  # those that tested ``Confirmation.undecided`` first and did not confirm it


Role = Literal["baseline", "heuristic", "warm-start", "seed", "combined", "interaction", "search", "in-process",
               "confirm"]
# BASELINE (PyTorch's defaults), HEURISTIC (run_cpu's recipe) and SEED (a family's promising change): the seeds'
# roles, named where the seeds are (``search_spaces``).
WARM_START: Final = "warm-start"  # the recipe stored earlier for this workload and hardware
SEARCH: Final = "search"  # sampled by Optuna
IN_PROCESS: Final = "in-process"  # sampled by Optuna in an environment that starts no process (the budget's end)
COMBINED: Final = "combined"  # the fastest environment with the fastest in-process knobs (``combinations.combination``)
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


def environment_factors(study: optuna.Study) -> dict[str, Interval]:
    """Each environment's factor over the defaults' (``Attr.ENVIRONMENT_FACTOR``) by ``environment_key``, as its
    newest trial recorded it. A trial records its environment's factor once it is settled (``process_pair.enough``),
    the same in every later trial of one search; where parallel workers settled their own, the newest. A malformed
    one (a foreign or hand-edited study) is not read: its environment is measured again."""
    out = {}
    for t in study.get_trials(deepcopy=False):
        recorded, params = t.user_attrs.get(Attr.ENVIRONMENT_FACTOR), t.user_attrs.get(Attr.PARAMS)
        factor = _interval(recorded)
        if factor is not None and isinstance(params, dict):
            out[environment_key(params)] = factor
    return out


def _interval(recorded: Any) -> Interval | None:
    """``Interval.to_dict``'s output read back (one process pair's: an unbounded high); None for anything else."""
    fields = ("median", "low", "high", "confidence", "count")
    if not isinstance(recorded, dict) or set(recorded) != set(fields):
        return None
    values = [recorded[f] for f in fields]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v) for v in values):
        return None
    median, low, high, confidence, count = values
    if not (0 <= low <= median <= high and 0 < median < math.inf and 0 < confidence <= 1 and count >= 1
            and float(count).is_integer()):
        return None
    return Interval(float(median), float(low), float(high), float(confidence), int(count))


def finite(value: Any) -> TypeGuard[float]:
    """Whether a value read from a store is a finite number (a bool is not one): a store is not trusted to hold
    numbers where it should."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def study_margin(study: optuna.Study) -> float:
    """The margin a recipe's low bound must clear over 1: the study's calibrated one (``StudyAttr.NOISE``),
    ``MIN_MARGIN`` before the calibration."""
    return float((study.user_attrs.get(StudyAttr.NOISE) or {}).get("margin", MIN_MARGIN))


# Optuna has no public way for what the ask/tell loop needs beyond ask and tell: recording a heartbeat,
# failing a trial another (dead) process asked, creating a RUNNING trial from a finished one's template
# (a confirmation run). These two helpers are the only places that reach Optuna's storage and ids.
def optuna_storage(study: optuna.Study) -> tuple[BaseStorage, int]:
    """The study's storage and the study's id in it."""
    return study._storage, study._study_id


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    """A trial's id in its storage."""
    return trial._trial_id


def enqueued(study: optuna.Study, trial: optuna.Trial) -> bool:
    """Whether ``trial`` was enqueued (its params fixed before it was asked: by a search, or by another hand)."""
    storage, _ = optuna_storage(study)
    return "fixed_params" in storage.get_trial(trial_id(trial)).system_attrs


__all__ = [
    "BASELINE", "COMBINED", "CONFIRM", "CONSTRAINTS", "HEURISTIC", "INTERACTION", "IN_PROCESS", "MEASURED", "NOT_RUN",
    "PAIRED", "SEARCH", "SEED", "WARM_START",
    "Attr", "Role", "StudyAttr", "TrialRecord", "enqueued", "environment_factors", "finite", "optuna_storage",
    "params_key",
    "records", "study_margin", "trial_id",
]
