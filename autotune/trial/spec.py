"""The contract between the search and a trial process: what to run (``TrialSpec``) and what came of it
(``TrialResult``). The parent writes the spec as JSON, the child (``autotune.trial.child``) reads it
with the same class and writes its result the same way; nothing crosses the process boundary as a
loose dict.

>>> TrialResult.from_dict(TrialResult(Status.OK, samples_per_s=10.0).to_dict()).status
<Status.OK: 'ok'>
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any

from ..probes import Facts


class Status(str, Enum):
    """How a trial ended. A ``str``: stored trial attributes and JSON files hold the plain value."""

    OK = "ok"
    OOM = "oom"
    NAN = "nan"
    CRASH = "crash"
    TIMEOUT = "timeout"
    PRUNED = "pruned"
    INTERRUPTED = "interrupted"
    SKIPPED = "skipped"  # never run: the search knew it runs out of memory, or its precision is hopeless here
    DUPLICATE = "duplicate"  # never run: the same recipe as an earlier trial, whose measurement stands
    CUT = "cut"  # stopped by the search's budget, not by the candidate: no measurement, and no failure of it

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


@dataclass(frozen=True)
class TrialSettings:
    """How much each trial trains and how it is timed (the same for every trial of a study)."""

    warmup_steps: int = 4  # excluded from timing
    measure_steps: int = 24  # at the reference batch size, split into timed windows (see loss_samples)
    windows: int = 3
    max_extra_windows: int = 2  # re-measure when the windows' spread is above max_spread
    max_spread: float = 0.15
    train_steps: int = 5000  # the planned training run that compile time is amortised over
    eval_samples: int = 512  # held out of the training data: the loss the quality guard compares
    seed: int = 0


# What a script-mode trial's loss is: the training loss it told, or the script's own held-out figure
# (``Tuned.evaluate``), a loss or a metric where higher is better (the quality guard then bounds its fall).
TRAINING_LOSS, EVALUATED, EVALUATED_HIGHER = "training loss", "evaluate", "evaluate, higher is better"


@dataclass(frozen=True)
class TrialResult:
    status: Status
    samples_per_s: float | None = None
    objective: float | None = None  # samples/s with compile time amortised over train_steps
    spread: float | None = None
    windows: list[float] = field(default_factory=list)
    compile_s: float | None = None
    startup_s: float | None = None  # process start to the first training step (imports, model, data)
    warmup_s: float | None = None  # first step (compile) and warm-up steps, not timed
    timed_s: float | None = None  # the timed windows
    # script mode: untimed time the trial spent once, not each process pair (the candidate trained on to the loss's
    # samples, the defaults' step timed alone, the long-lived copy's start): neither a confirmation round's pairs
    # nor the next in-copy candidate repeat it (``costs``, ``budget.in_process_estimate_s``)
    once_s: float | None = None
    loss: float | None = None  # on the held-out samples (or the workload's evaluate)
    loss_samples: int | None = None  # samples trained (over all ranks) when the loss was taken
    loss_source: str | None = None  # script mode: TRAINING_LOSS, EVALUATED(_HIGHER); None: the workload's own
    wall_s: float = 0.0
    error: str | None = None
    in_effect: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # knobs not applied as asked (launcher, apply())
    log_tail: str | None = None
    steps: int | None = None  # optimizer steps the trial took (written by the child)
    failed_at: float | None = None  # wall clock of a failure: of several ranks' failures the earliest is the cause
    # Paired measurement: ``objective`` is then the speedup over the defaults, with its interval.
    speedup_low: float | None = None
    speedup_high: float | None = None
    method: str | None = None  # "in-process pairs", "process pairs x in-process pairs"; None: samples/s of one process
    pairs: int | None = None  # window pairs behind the interval
    confidence: float | None = None  # the interval's coverage as its method reached it (None: stored before, 95% asked)
    baseline_samples_per_s: float | None = None  # the defaults' own rate beside it, measured (None: not beside it)
    peak_memory_bytes: int | None = None  # peak device memory of the measured recipe (CUDA), for the 90% warning
    data_wait: float | None = None  # the share of its timed steps spent waiting for the next batch (the input's)
    phases: dict[str, float] | None = None  # each part's share of its timed steps (``measure.worker.phases``); CPU only
    operators: dict[str, float] | None = None  # top operators' shares of a profile (baseline, fastest yet; CPU only)

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))  # "ok" from JSON or a caller: the enum

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "status": self.status.value}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialResult:
        """A result from its dict (a result file, a trial's stored attributes); other keys are ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> TrialResult:
        return cls.from_dict(json.loads(text))


@dataclass(frozen=True)
class TrialSpec:
    """One trial for the child process: the workload, the knobs, the facts they were chosen for, the
    settings, and where to write its window events and its result."""

    workload: str
    params: dict[str, Any]
    facts: Facts
    settings: TrialSettings
    reference_batch: int  # the workload's default batch: the loss is taken after its steps' samples
    loss_samples: int  # samples every trial of the study trains before its loss is taken
    events: str  # JSON lines, one per timed window, for the pruner
    result: str  # rank 0's result; a failing rank R writes result.rank<R>.json beside it

    def to_json(self) -> str:
        data = {**asdict(self), "facts": self.facts.to_dict(), "settings": asdict(self.settings)}
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> TrialSpec:
        data = json.loads(text)
        return cls(**{**data, "facts": Facts.from_dict(data["facts"]), "settings": TrialSettings(**data["settings"])})


OnWindow = Callable[[int, float], bool]  # (window index, samples/s) -> True to prune the trial


__all__ = ["OnWindow", "Status", "TrialResult", "TrialSettings", "TrialSpec"]
