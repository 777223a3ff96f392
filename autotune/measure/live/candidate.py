"""A candidate as the live measurer holds it while the race measures it (``LiveTrial``), and the rules every path
of it shares: how two ratios combine, a failed arm's state as a status (which environment is the defaults' and the
method a result names: ``environment``)."""
from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ...trial.runner import run_trial
from ...trial.spec import Status, TrialResult
from .. import stats
from ..environment import DEFAULTS
from ..hopeless import HOPELESS, far_slower_result
from ..protocol import ArmStatus, PairRecord
from .paired_worker import Calibration, PairedWorker, calibrated

if TYPE_CHECKING:
    from .process_pair import HopelessEnvironment

FRESH_PAIRS = 3  # fresh-process pairs a multi-process candidate needs at least (its first call to ``more``)
NOTHING = stats.Interval(0.0, 0.0, 0.0, 0.0, 0)  # no pair yet (or an arm failed before one): slower than anything


def combine(factor: stats.Interval, ratios: Sequence[float],
            confidence: float = stats.CONFIDENCE) -> stats.Interval:
    """Another environment's speedup: its ``factor`` (its defaults over the defaults, a Student-t interval over
    fresh process pairs) times the median of its in-process ``ratios`` (paired windows against its environment's
    defaults arm), as one Welch-Satterthwaite interval on the log scale (``stats.welch_interval``). ``count``:
    the fewer of process pairs and window pairs, the units that limit it.

    >>> iv = combine(stats.log_mean_interval([0.9, 1.0, 1.1]), [2.0] * 16)
    >>> round(iv.median, 3), round(iv.low, 3), round(iv.high, 3), iv.count
    (1.993, 1.553, 2.558, 3)
    """
    parts = [stats.interval_part(factor), stats.median_part(ratios)]
    return stats.welch_interval(parts, confidence, count=min(factor.count, len(ratios)))


def round_factor(ratio: float, earlier: Sequence[float], settled: stats.Interval | None) -> stats.Interval:
    """A confirmation round's environment factor: this round's one fresh process pair, its ``ratio`` the centre,
    no earlier pair pooled with it (the confirmation must not reuse what chose the candidate). The search's pairs
    (``earlier``; or, resumed, its ``settled`` interval) lend only the spread of one pair's ratio and its degrees
    of freedom; with none, the interval is unbounded.

    >>> iv = round_factor(0.8, [0.9, 1.0, 1.1], None)
    >>> round(iv.median, 3), round(iv.low, 3), round(iv.high, 3), iv.count
    (0.8, 0.519, 1.232, 3)
    """
    if len(earlier) >= 2:
        spread, count = stats.mean_part(earlier), len(earlier)
    elif settled is not None and settled.count >= 2:
        spread, count = stats.interval_part(settled), settled.count
    else:
        return stats.part_interval(stats.mean_part([ratio]))
    return stats.part_interval(stats.Part(math.log(ratio), spread.variance * count, spread.df))


def status_of(state: str) -> Status:
    """A failed arm's state as a trial's status (``no-room``, which is not a failure of the recipe, and
    any state this version does not know, read as a crash)."""
    try:
        return Status(state)
    except ValueError:
        return Status.CRASH


@dataclass
class LiveTrial:
    """One candidate being measured: where its arm lives and what it has cost so far."""

    params: dict[str, Any]
    name: str
    seed: int
    started: float
    worker: PairedWorker | None = None  # None: fresh process pairs (``processes`` > 1) or the baseline
    base: str = DEFAULTS  # the arm it is paired with in ``worker``
    in_process: bool = True  # False: the candidate IS its environment's defaults arm (only the factor counts)
    factor: stats.Interval | None = None  # its environment / the defaults, from process pairs
    factor_key: str | None = None  # its environment (``environment_key``) when it is not the defaults'
    rounds: int = 0  # calls to ``more`` so far: the race's rounds
    baseline: bool = False  # the defaults themselves: the calibration is their measurement
    records: list[PairRecord] = field(default_factory=list)
    base_status: ArmStatus | None = None
    cand_status: ArmStatus | None = None
    fresh: list[tuple[TrialResult, TrialResult]] = field(default_factory=list)  # (defaults, candidate) runs
    failed: TrialResult | None = None
    deadline: float = float("inf")  # the trial's time limit (``begin``'s): its loss is not trained for past it
    no_loss: bool = False  # it cannot be the recipe: its loss is not trained for (``LiveMeasurer.skip_loss``)
    gave_up: float | None = None  # its fresh process's window this many times slower than the defaults' (``hopeful``)
    startup_s: float = 0.0
    warmup_s: float = 0.0
    timed_s: float = 0.0
    warnings: list[str] = field(default_factory=list)

    def in_effect(self) -> dict[str, Any] | None:
        """What its worker (its environment's) and its arm, if it has one, report in effect (``reported``); None in
        fresh process pairs."""
        if self.worker is None:
            return None
        return reported(self.worker, self.cand_status if self.in_process else None)

    def fresh_pairs(self, n: int, workload: str, defaults: dict[str, Any], facts: Any, settings: Any,
                    deadline: float, on_phase: Callable[[str, str], None], reference_s: float | None = None) -> None:
        """Fresh trial processes of the candidate and of the defaults, alternated: at least ``FRESH_PAIRS``. A
        candidate whose first window is ``HOPELESS`` times slower than the defaults is stopped there (its
        process ended; ``hopeful``) and measured slower: no more pairs, no loss."""
        count = max(1, min(n, FRESH_PAIRS - len(self.fresh))) if len(self.fresh) < FRESH_PAIRS else 1
        rng = random.Random(self.seed + len(self.fresh))
        for _ in range(count):
            on_phase("starting", f"{self.name}: fresh process pair {len(self.fresh) + 1}")
            runs: dict[str, TrialResult] = {}
            for side in (["base", "cand"] if rng.random() < 0.5 else ["cand", "base"]):
                hopeful = self.hopeful(runs.get("base"), reference_s) if side == "cand" else None
                runs[side] = run_trial(workload, defaults if side == "base" else self.params, facts, settings,
                                       timeout_s=max(1.0, deadline - time.monotonic()), on_window=hopeful)
                if side == "cand" and runs[side].status == Status.PRUNED and self.gave_up is not None:
                    self.failed = hopeless_result(self, ArmStatus(self.name, "ok", gave_up=self.gave_up),
                                                  "its first window in a fresh process", 0.0)
                    return
                self.startup_s += runs[side].startup_s or 0.0
                self.warmup_s += runs[side].warmup_s or 0.0
                self.timed_s += runs[side].timed_s or 0.0
                if runs[side].status != Status.OK:
                    failed = runs[side]
                    # the defaults' own time out is the trial's time run out, not a crash of the recipe or of them
                    status = Status.TIMEOUT if failed.status == Status.TIMEOUT else Status.CRASH
                    self.failed = failed if side == "cand" else TrialResult(
                        status, error=f"the defaults failed in a fresh process: {failed.error}")
                    return
            self.fresh.append((runs["base"], runs["cand"]))
            self.warnings += [w for w in runs["cand"].warnings if w not in self.warnings]

    def hopeful(self, base: TrialResult | None, reference_s: float | None) -> Callable[[int, float], bool] | None:
        """The hopeless rule for a candidate's fresh trial process (``run_trial``'s ``on_window``): True (stop it)
        at a window ``HOPELESS`` times slower than the defaults: their run beside it where it ran first, else
        their earlier runs, else ``reference_s`` (the calibration's seconds per sample)."""
        rates = [b.samples_per_s for b, _ in self.fresh if b.samples_per_s]
        rate = (base.samples_per_s if base is not None and base.samples_per_s
                else statistics.median(rates) if rates else 1 / reference_s if reference_s else None)
        if rate is None:
            return None

        def judge(index: int, samples_per_s: float) -> bool:
            if samples_per_s * HOPELESS < rate:
                self.gave_up = rate / samples_per_s
            return self.gave_up is not None
        return judge

    def speedup(self, cal: Calibration | None, train_steps: int,
                confidence: float = stats.CONFIDENCE) -> stats.Interval:
        """Its speedup over the defaults so far at ``confidence``, amortised over ``train_steps``: the calibration's
        A/A (``cal``) for the baseline, its fresh process pairs' ratios, its factor alone where it is its
        environment's defaults, else its paired windows (``stats.compare``) combined with its factor."""
        if self.baseline:
            return calibrated(cal).aa.amortised
        if self.worker is None:
            ratios = [c.objective / b.objective for b, c in self.fresh if c.objective and b.objective]
            return stats.log_mean_interval(ratios, confidence) if ratios else NOTHING
        if not self.in_process:
            return stats.at_confidence(self.factor, confidence) if self.factor is not None else NOTHING
        if not self.records or self.base_status is None or self.cand_status is None:
            return NOTHING
        inner = stats.compare(self.records, self.base_status, self.cand_status, train_steps=train_steps,
                              margin=calibrated(cal).margin, confidence=confidence)
        return inner.amortised if self.factor is None else combine(self.factor, inner.ratios, confidence)

    def fresh_result(self, interval: stats.Interval) -> TrialResult:
        """The result of a candidate measured in fresh process pairs: its first run's, with the pairs' interval."""
        runs = [c for _, c in self.fresh]
        if not runs:
            return TrialResult(Status.CRASH, error="no fresh process pair ran", wall_s=time.monotonic() - self.started)
        return replace(runs[0], objective=interval.median, speedup_low=interval.low, speedup_high=interval.high,
                       confidence=interval.confidence, method="fresh process pairs", pairs=interval.count,
                       samples_per_s=statistics.median(r.samples_per_s or 0.0 for r in runs),
                       baseline_samples_per_s=statistics.median(b.samples_per_s or 0.0 for b, _ in self.fresh),
                       startup_s=self.startup_s, warmup_s=self.warmup_s, timed_s=self.timed_s,
                       wall_s=time.monotonic() - self.started, warnings=self.warnings)


def reported(worker: PairedWorker, arm: ArmStatus | None) -> dict[str, Any]:
    """What a worker process reports in effect (its libraries, its environment), with its arm's own report."""
    return {**(worker.ready.in_effect if worker.ready else {}), **(arm.in_effect if arm else {})}


def hopeless_result(trial: LiveTrial, status: ArmStatus | None, why: str, stalled_s: float) -> TrialResult:
    """A candidate far slower than the defaults in its first steps (``hopeless.HOPELESS``), as a measured trial: its
    steps' ratio (``status.gave_up``; none where the parent stopped a step that had not ended, ``stalled_s`` of
    warm-up), at most ``1 / HOPELESS``, no pairs and no loss. The why joins the candidate's warnings (a failed
    candidate's end gives them)."""
    ratio = 1 / status.gave_up if status is not None and status.gave_up else None
    said = f"{ratio:.2f}x" if ratio is not None else f"under {1 / HOPELESS:.2f}x"
    trial.warnings.append(f"stopped after its first steps, {said} the defaults: {why}")
    return replace(far_slower_result(ratio, list(trial.warnings)), wall_s=time.monotonic() - trial.started,
                   startup_s=trial.startup_s, warmup_s=trial.warmup_s + stalled_s)


def hopeless_environment(trial: LiveTrial, error: HopelessEnvironment) -> TrialResult:
    """A candidate whose environment's first steps were far slower than the defaults', in its process pair now or
    in an earlier trial's (``EnvironmentFactors.hopeless``): measured slower, no windows, no loss."""
    why = f"{error} in its environment's process pair" + (" (an earlier trial's)" if error.earlier else "")
    return hopeless_result(trial, error.status, why, 0.0)
