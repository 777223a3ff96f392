"""The contract between the search and a trial process: what to run (``TrialSpec``) and what came of it
(``TrialResult``). The parent writes the spec as JSON, the child (``autotune.trial.child``) reads it
with the same class and writes its result the same way; nothing crosses the process boundary as a
loose dict.

``Measurer`` is how the search asks for a measurement: the default runs a trial subprocess
(``autotune.trial.runner.SubprocessMeasurer``); a recorded grid can answer it as well.

>>> TrialResult.from_dict(TrialResult(Status.OK, samples_per_s=10.0).to_dict()).status
<Status.OK: 'ok'>
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

from ..probes import Facts

if TYPE_CHECKING:
    from .stats import Interval


class Status(str, Enum):
    """How a trial ended. A ``str``: stored trial attributes and JSON files hold the plain value."""

    OK = "ok"
    OOM = "oom"
    NAN = "nan"
    CRASH = "crash"
    TIMEOUT = "timeout"
    PRUNED = "pruned"
    INTERRUPTED = "interrupted"
    SKIPPED = "skipped"  # never run: the search knew its batch size runs out of memory
    DUPLICATE = "duplicate"  # never run: the same recipe as an earlier trial, whose measurement stands

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
    loss: float | None = None  # on the held-out samples (or the workload's evaluate)
    loss_samples: int | None = None  # samples trained (over all ranks) when the loss was taken
    wall_s: float = 0.0
    error: str | None = None
    in_effect: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # knobs not applied as asked (launcher, apply())
    log_tail: str | None = None
    steps: int | None = None  # optimizer steps the trial took (written by the child)
    failed_at: float | None = None  # wall clock of a failure: of several ranks' failures the earliest is the cause
    # Paired measurement (issue 12): ``objective`` is then the speedup over the defaults, with its interval.
    speedup_low: float | None = None
    speedup_high: float | None = None
    method: str | None = None  # "in-process pairs", "process pairs x in-process pairs"; None: samples/s of one process
    pairs: int | None = None  # window pairs behind the interval
    peak_memory_bytes: int | None = None  # peak device memory of the measured recipe (CUDA), for the 90% warning

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


class Measurer(Protocol):
    """Measures one recipe: the search loop's only way to the trial side.

    ``on_window(index, samples_per_s)`` is called after each timed window; True stops (prunes) the
    trial. KeyboardInterrupt propagates once the measurement is stopped.
    """

    def measure(self, params: dict[str, Any], timeout_s: float, on_window: OnWindow | None = None) -> TrialResult:
        ...


@dataclass(frozen=True)
class Noise:
    """This machine's noise, from the A/A calibration at the start of a search (the defaults against
    themselves), and what the search does with it."""

    window_s: float  # each window's length, long enough to be timed well
    pairs: int  # window pairs for an interval of about +-half_width: a candidate's first round
    half_width: float
    margin: float  # a speedup counts when its interval clears 1 by this much (and "slower" likewise)
    spread: float  # max - min of the A/A per-pair ratios: "identical runs here differ by up to spread/2"
    aa: tuple[float, float, float]  # the A/A median ratio and its interval (low, high)
    timed_s: float = 0.0  # time spent in timed windows by the calibration
    wall_s: float = 0.0  # the calibration's wall time (worker start, warm-up, windows)

    def note(self) -> str:
        return (f"identical runs here differ by up to {self.spread / 2:.0%}; the smallest gain this budget can "
                f"tell apart is {self.margin:.0%}")


class PairedMeasurer(Protocol):
    """Measures recipes as speedups over the defaults, in pairs of windows (issue 12). The search loop
    drives it: ``calibrate`` once, then per candidate ``begin``, ``more`` as often as the race wants
    (each call adds ``n`` pairs and returns the interval over all of the candidate's pairs so far,
    amortised, and combined with its environment's factor from process pairs), then ``end``, which
    returns the trial's result (``objective`` = the speedup's median, ``speedup_low``/``speedup_high``,
    ``method``, ``pairs``, the loss at the study's sample count, timings) and drops the candidate.
    Live: ``autotune.trial`` workers; replayed: a recorded grid (``benchmarks/search_quality.py``).
    A failure (crash, OOM, NaN) is a ``TrialResult`` from ``begin`` or ``end``, never an exception;
    KeyboardInterrupt propagates once every process is stopped."""

    def calibrate(self, timeout_s: float) -> Noise:
        ...

    def begin(self, params: dict[str, Any], timeout_s: float) -> object | TrialResult:
        ...

    def more(self, handle: object, n: int, timeout_s: float) -> Interval:
        ...

    def end(self, handle: object) -> TrialResult:
        ...

    def close(self) -> None:
        ...


__all__ = ["Measurer", "Noise", "OnWindow", "PairedMeasurer", "Status", "TrialResult", "TrialSettings", "TrialSpec"]
