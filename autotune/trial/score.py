"""A candidate recipe's speedup over the defaults, measured paired, with its interval and its loss.

The engine side of the confirmation by paired measurement (issue 12): a ``PairedScorer`` holds one worker
in the defaults' environment, with the defaults as an arm, and calibrates it once (an A/A of the defaults
against an identical arm: window length, pairs, margin, and the machine's noise to tell the user). Then
each candidate is scored:
- same environment as the defaults (only in-process knobs differ): a candidate arm in that worker, pairs
  of windows against the defaults arm; the speedup is the median per-pair ratio with each arm's compile
  time amortised over ``train_steps`` (``stats.compare``), with its exact interval;
- another environment: (its environment's in-process defaults / the defaults, from process pairs,
  ``process_pair.across_processes``) x (its in-process ratio against that environment's defaults arm, in a
  worker of its own). The two intervals are combined on the log scale: the lower (upper) distances from
  each estimate add in quadrature. A bootstrap was the other choice; with the 3-8 process pairs a
  comparison affords its resamples take a handful of values and under-cover, as for the median
  (``stats``), and it would depend on a seed.
Every arm's loss is taken after the study's fixed sample count, for the quality guard.

    >>> with PairedScorer("cnn", defaults, facts, settings) as scorer:                   # doctest: +SKIP
    ...     score = scorer.score("cl", {**defaults, "channels_last": True})
    ...     score.speedup.low > 1 + scorer.margin, scorer.noise_note()
    (True, 'identical runs here differ by up to 4%; the smallest gain this budget can tell apart is 2%')
"""
from __future__ import annotations

import math
import random
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from .. import search_spaces as spaces
from . import stats
from .paired import ENVIRONMENT_KEYS, WINDOW_FLOOR_S, choose_window_s, environment_differences, environment_key
from .process_pair import PROCESS_PAIRS, AcrossProcesses, across_processes, enough, process_pair
from .protocol import ArmStatus, PairRecord
from .runner import _ended, run_trial
from .spec import Noise, Status, TrialResult
from .worker import Calibration, PairedWorker, WorkerError

Method = Literal["in-process pairs", "process pairs x in-process pairs"]
DEFAULTS = "defaults"


@dataclass(frozen=True)
class Score:
    """A candidate against the defaults."""

    name: str
    method: Method
    speedup: stats.Interval  # amortised over train_steps, against the defaults
    verdict: stats.Verdict
    in_process: stats.Comparison  # against its environment's defaults arm
    environment: AcrossProcesses | None  # its environment's defaults against the defaults; None: the same
    loss: float | None
    baseline_loss: float | None
    loss_samples: int | None
    arm: ArmStatus


def same_environment(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in ENVIRONMENT_KEYS)


def combine(first: stats.Interval, second: stats.Interval) -> stats.Interval:
    """The product of two independent ratios, each with its interval: log distances add in quadrature.

    >>> iv = combine(stats.Interval(1.0, 0.9, 1.1, 0.95, 3), stats.Interval(2.0, 2.0, 2.0, 0.95, 16))
    >>> round(iv.median, 3), round(iv.low, 3), round(iv.high, 3)
    (2.0, 1.8, 2.2)
    """
    centre = math.log(first.median) + math.log(second.median)

    def spread(a: stats.Interval, b: stats.Interval, side: Literal["low", "high"]) -> float:
        return math.hypot(*(abs(math.log(getattr(iv, side)) - math.log(iv.median)) if getattr(iv, side) > 0
                            else math.inf for iv in (a, b)))

    low, high = spread(first, second, "low"), spread(first, second, "high")
    return stats.Interval(math.exp(centre), math.exp(centre - low), math.exp(centre + high),
                          min(first.confidence, second.confidence), min(first.count, second.count))


def _status(state: str) -> Status:
    """A failed arm's state as a trial's status (``no-room``, which is not a failure of the recipe, and
    any state this version does not know, read as a crash)."""
    try:
        return Status(state)
    except ValueError:
        return Status.CRASH


class PairedScorer:
    """The defaults' worker, calibrated once, and candidates scored against it (see the module docstring).

    A context manager: leaving it ends every worker it started."""

    def __init__(self, workload: str, defaults: dict[str, Any], facts: Any, settings: Any, *,
                 calibration_pairs: int = 16, half_width: float = 0.03, window_s: float | None = None,
                 process_pairs: tuple[int, int] = PROCESS_PAIRS) -> None:
        self.workload, self.defaults, self.facts, self.settings = workload, defaults, facts, settings
        self.worker = PairedWorker(workload, defaults, facts, settings)
        self.calibration_pairs, self.half_width, self.window_s = calibration_pairs, half_width, window_s
        self.process_pairs = process_pairs
        self.calibration: Calibration | None = None
        self.baseline: ArmStatus | None = None

    def __enter__(self) -> PairedScorer:
        try:
            self.worker.start()
            self.calibration = self.worker.calibrate(DEFAULTS, self.defaults, pairs=self.calibration_pairs,
                                                     half_width=self.half_width, window_s=self.window_s)
        except BaseException:
            self.worker.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.worker.close()

    @property
    def cal(self) -> Calibration:
        if self.calibration is None:
            raise WorkerError("the scorer is not started: use it as a context manager")
        return self.calibration

    @property
    def margin(self) -> float:
        return self.cal.margin

    def noise_note(self) -> str:
        """What the calibration says of this machine, for the report."""
        return (f"identical runs here differ by up to {self.cal.spread / 2:.0%}; the smallest gain this budget can "
                f"tell apart is {self.cal.margin:.0%}")

    def score(self, name: str, params: dict[str, Any], seed: int = 0) -> Score:
        """``params`` against the defaults; ``WorkerError`` when an arm failed (its state and error named)."""
        if same_environment(params, self.defaults):
            comparison, arm = self._in_process(self.worker, DEFAULTS, name, params, seed)
            base_loss = self.worker.evaluate(DEFAULTS)
            self.worker.drop_arm(name)
            return Score(name, "in-process pairs", comparison.amortised, comparison.verdict, comparison, None,
                         arm.loss, base_loss.loss, arm.loss_samples, arm)
        env_defaults = {**self.defaults, **{k: params.get(k) for k in ENVIRONMENT_KEYS}}
        least, most = self.process_pairs
        environment = across_processes(self.workload, self.defaults, env_defaults, self.facts, self.settings,
                                       pairs=max(4, self.cal.pairs // 2), window_s=self.cal.window_s, least=least,
                                       most=most, half_width=self.cal.half_width, margin=self.margin, seed=seed)
        with PairedWorker(self.workload, env_defaults, self.facts, self.settings) as worker:
            self._add(worker, DEFAULTS, env_defaults)
            comparison, arm = self._in_process(worker, DEFAULTS, name, params, seed)
        speedup = combine(environment.ratio, comparison.amortised)
        base_loss = self.worker.evaluate(DEFAULTS)
        return Score(name, "process pairs x in-process pairs", speedup, stats.verdict(speedup, self.margin),
                     comparison, environment, arm.loss, base_loss.loss, arm.loss_samples, arm)

    @staticmethod
    def _add(worker: PairedWorker, name: str, params: dict[str, Any]) -> ArmStatus:
        status = worker.add_arm(name, params)
        if status.state != "ok":
            raise WorkerError(f"arm {name!r} failed ({status.state}): {status.error}")
        return status

    def _in_process(self, worker: PairedWorker, base: str, name: str, params: dict[str, Any],
                    seed: int) -> tuple[stats.Comparison, ArmStatus]:
        self._add(worker, name, params)
        run = worker.run_pairs(base, name, self.cal.pairs, self.cal.window_s, seed=seed)
        if not run.pairs:
            raise WorkerError(f"arm {name!r} failed ({run.cand.state}): {run.cand.error}")
        comparison = stats.compare(run.pairs, run.base, run.cand, train_steps=self.settings.train_steps,
                                   margin=self.margin)
        return comparison, worker.evaluate(name)


# The live measurer of a search ----------------------------------------------------------------------------

PhaseHook = Callable[[str, str], None]  # (phase name, detail): "starting", "compiling", "paired windows", ...
FRESH_PAIRS = 3  # fresh-process pairs a multi-process candidate needs at least (its first call to ``more``)


@dataclass
class _Trial:
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
    startup_s: float = 0.0
    warmup_s: float = 0.0
    timed_s: float = 0.0
    warnings: list[str] = field(default_factory=list)
    interval: stats.Interval | None = None


class LiveMeasurer:
    """The search's ``PairedMeasurer`` on this machine (``autotune.trial.spec.PairedMeasurer``).

    - ``calibrate``: the defaults' worker started and calibrated once (an A/A: ``Noise``);
    - a candidate of the defaults' environment is an arm in that worker, paired with the defaults arm;
    - another environment: its factor (its in-process defaults / the defaults, over fresh process pairs,
      ``across_processes``) measured once per environment per search and cached (``factors``, which a
      resumed search may fill from its trials; each confirmation round adds one fresh process pair), x its
      in-process ratio in a worker of that environment, kept alive while consecutive candidates use it (one at
      most besides the defaults'; the idle one is frozen): the environment's side of its last process pair,
      its heap fixed from then on (``process_pair.process_pair``'s ``keep``), where no worker of it runs;
    - ``processes`` > 1 (a worker holds one process), or two models that do not fit on one GPU: fresh
      trial processes, alternated with fresh runs of the defaults, ``FRESH_PAIRS`` pairs or more, ratio
      interval by ``stats.log_mean_interval``;
    - the first ``begin(defaults)`` after ``calibrate`` is the baseline trial: ``end`` gives the A/A's interval
      and the defaults arm's loss (no pairs run).
    A failed arm is a ``TrialResult`` (oom, nan, crash); a dead or hung worker a crash or timeout, and the
    worker is started again for the next candidate.

        >>> measurer = LiveMeasurer("cnn", defaults, facts, settings)            # doctest: +SKIP
        >>> noise = measurer.calibrate(600)                                       # doctest: +SKIP
        >>> h = measurer.begin({**defaults, "channels_last": True}, 300)          # doctest: +SKIP
        >>> measurer.more(h, noise.pairs, 300).low > 1 + noise.margin, measurer.end(h).objective  # doctest: +SKIP
        (True, 1.21)
    """

    def __init__(self, workload: str, defaults: dict[str, Any], facts: Any, settings: Any, *,
                 calibration_pairs: int = 16, half_width: float = 0.03, window_s: float | None = None,
                 process_pairs: tuple[int, int] = PROCESS_PAIRS, seed: int = 0,
                 on_phase: PhaseHook | None = None) -> None:
        self.workload, self.defaults, self.facts, self.settings = workload, defaults, facts, settings
        self.calibration_pairs, self.half_width, self.window_s = calibration_pairs, half_width, window_s
        self.process_pairs, self.seed = process_pairs, seed
        self.on_phase: PhaseHook = on_phase or (lambda name, detail: None)
        self.worker: PairedWorker | None = None
        self.env: tuple[str, PairedWorker] | None = None
        self.calibration: Calibration | None = None
        self.noise: Noise | None = None
        self.factors: dict[str, stats.Interval] = {}  # environment key -> its factor (``environment_key``)
        self.factor_ratios: dict[str, list[float]] = {}  # environment key -> one ratio per process pair run
        self._due: set[str] = set()  # factors that get one more fresh process pair (``reseed``)
        self._grow = True  # a search's race adds process pairs to a factor; a confirmation round only its one
        self._pair_s = 0.0  # the last process pair's wall time
        self._startup_s = 0.0  # the defaults' worker start, not yet charged to a trial
        self._start_s = 0.0  # the last worker start measured: what another environment's worker will take
        self._count = 0
        self._baseline_given = False

    # The defaults' worker --------------------------------------------------------------------------------

    def calibrate(self, timeout_s: float) -> Noise:
        started, timeout_s = time.monotonic(), min(timeout_s, 86_400.0)  # no budget: a day is as good
        self.on_phase("calibrating noise", "the defaults against themselves, in one process")
        worker = self._defaults_worker(timeout_s)
        # The A/A within a sixth of the time given: its pairs as asked but at least 6 (a 95% interval needs them),
        # and on a slow machine with a short budget, windows shorter than 4 steps (never under the device's floor).
        status = self._add(worker, DEFAULTS, self.defaults, timeout_s)
        device = self.defaults.get("device") or "cpu"
        window = self.window_s or max(WINDOW_FLOOR_S.get(device, WINDOW_FLOOR_S["cpu"]), min(
            choose_window_s(status.step_s or status.first_step_s or 0.0, device), timeout_s / 6 / (2 * 6)))
        pairs = max(6, min(self.calibration_pairs, int(timeout_s / 6 / (2 * window))))
        cal = worker.calibrate(DEFAULTS, self.defaults, pairs=pairs, half_width=self.half_width, window_s=window,
                               seed=self.seed)
        # A budget-sized race: a candidate's most pairs (3 x pairs, two windows each) within a quarter of the time.
        affordable = max(8, int(timeout_s / (4 * 3 * 2 * cal.window_s)))
        if cal.pairs > affordable:
            cal = replace(cal, pairs=affordable)
        self.calibration = cal
        aa = cal.aa.amortised
        self.noise = Noise(cal.window_s, cal.pairs, cal.half_width, cal.margin, cal.spread,
                           (aa.median, aa.low, aa.high), timed_s=2 * aa.count * cal.window_s,
                           wall_s=time.monotonic() - started)
        return self.noise

    def _defaults_worker(self, timeout_s: float) -> PairedWorker:
        """The defaults' worker with its defaults arm; started (again, after a failure) when needed."""
        if self.worker is not None and self.worker.proc is not None and self.worker.proc.poll() is None:
            return self.worker
        self.on_phase("starting", "the defaults' worker")
        started = time.monotonic()
        self.worker = PairedWorker(self.workload, self.defaults, self.facts, self.settings)
        self.worker.start(timeout_s)
        self._start_s = time.monotonic() - started
        if self.calibration is not None:  # a restart: calibrate() adds the arm itself the first time
            self._add(self.worker, DEFAULTS, self.defaults, timeout_s)
        self._startup_s += time.monotonic() - started
        return self.worker

    @property
    def cal(self) -> Calibration:
        if self.calibration is None:
            raise WorkerError("calibrate() first: the search starts with the defaults against themselves")
        return self.calibration

    # Candidates --------------------------------------------------------------------------------------------

    def warm(self, params: dict[str, Any]) -> bool:
        """Whether a candidate of ``params``' environment would start no process: the defaults' (their worker
        lives as long as the search) or the environment whose worker is alive, its factor settled (``enough``
        process pairs: a later round adds none). The search's end is filled with such candidates."""
        if spaces.processes.count(params) > 1:
            return False
        if same_environment(params, self.defaults):
            return True
        key = environment_key(params)
        return key in self.factors and self._env_alive(key)


    def reseed(self, seed: int, *, fresh_factors: bool = True) -> None:
        """A confirmation round's fresh pairs: new window orders, fresh worker processes, and (``fresh_factors``)
        one more fresh process pair for every environment factor, pooled with its earlier ones. A worker that had
        hosted a 2-minute search's arms measured bf16 at 1.45x early and 1.95x at its end (its defaults' arm
        slower as it aged), where the user's fresh processes got 1.6x: what is confirmed is measured in processes
        as new as the user's. A process pair is always two new processes, so a factor's earlier pairs stand and
        each round adds fresh evidence; measured again whole in the first round, the heuristic's factor took 8
        process pairs, 73 s of a 5-minute search. A factor known only as an interval (a resumed search) is reused."""
        self.seed, self._grow = seed, False
        if fresh_factors:
            self._due = set(self.factor_ratios)
        self.close()

    def begin(self, params: dict[str, Any], timeout_s: float) -> object | TrialResult:
        self._count += 1
        trial = _Trial(params, f"c{self._count}", self.seed + 1000 * self._count, time.monotonic())
        deadline = time.monotonic() + timeout_s
        if params == self.defaults and not self._baseline_given:
            trial.baseline = self._baseline_given = True  # the calibration's A/A; later ones are arms like any
            return trial
        try:
            if spaces.processes.count(params) > 1:
                return trial  # fresh process pairs: ``more`` runs them
            return self._begin_paired(trial, deadline)
        except WorkerError as e:
            return self._lost(trial, e, deadline)

    def _begin_paired(self, trial: _Trial, deadline: float) -> _Trial | TrialResult:
        params = trial.params
        if same_environment(params, self.defaults):
            trial.worker = self._use(self._defaults_worker(deadline - time.monotonic()))
            trial.startup_s, self._startup_s = self._startup_s, 0.0
        else:
            key = trial.factor_key = environment_key(params)
            short = self._too_short(key, deadline)
            if short is not None:
                return TrialResult(Status.SKIPPED, error=short, wall_s=time.monotonic() - trial.started)
            trial.factor = self._factor(key, params, trial, deadline)
            trial.worker = self._env_worker(key, params, trial, deadline)
            trial.in_process = params != self._env_defaults(params)
        if not trial.in_process:
            return trial
        compiling = spaces.compilation.compiled(params)
        self.on_phase("compiling" if compiling else "warm-up", trial.name)
        started = time.monotonic()
        status = trial.worker.add_arm(trial.name, params, max(1.0, deadline - time.monotonic()))
        trial.warmup_s += time.monotonic() - started
        trial.cand_status = status
        trial.warnings += status.warnings
        if status.state == "ok":
            return trial
        self._drop(trial)
        if status.state == "no-room":
            # Two models do not fit on this GPU next to each other (``paired``): fresh processes, one model each.
            trial.worker, trial.cand_status = None, None
            trial.warnings.append(f"{status.error or 'two models do not fit on one GPU'}: measured in fresh process "
                                  "pairs instead")
            return trial
        return TrialResult(_status(status.state), error=status.error, wall_s=time.monotonic() - trial.started,
                           warmup_s=trial.warmup_s, startup_s=trial.startup_s, warnings=trial.warnings)

    def _too_short(self, key: str, deadline: float) -> str | None:
        """Why a candidate of another environment is not started: its process pairs (the last one's worker is kept
        for its arms) or its worker's start would outlast ``deadline``, from the starts and pairs measured so far;
        None when it may finish. On an H100 a worker starts in 10-13 s: a heuristic begun with 20 s left ran one
        process pair and was stopped during its worker's start, 20 s of a 50 s search spent on nothing."""
        if not self._start_s or self.calibration is None:
            return None  # nothing measured yet
        least = self.process_pairs[0]
        missing = 0 if key in self.factors else max(0, least - len(self.factor_ratios.get(key, [])))
        pair_s = self._pair_s or self._start_s + 2 * max(4, self.cal.pairs // 2) * self.cal.window_s
        need = missing * pair_s if missing else (0.0 if self._env_alive(key) else self._start_s)
        left = deadline - time.monotonic()
        if need <= left:
            return None
        what = f"{missing} process pair(s)" if missing else "its worker's start"
        return f"not started: another environment needs {what}, about {need:.0f} s; {max(0.0, left):.0f} s were left"

    def _env_defaults(self, params: dict[str, Any]) -> dict[str, Any]:
        """The defaults in ``params``' environment (a key neither sets, e.g. ``membind``, stays unset)."""
        env = {k: params.get(k) for k in ENVIRONMENT_KEYS if k in params or k in self.defaults}
        return {**self.defaults, **env}

    def _factor(self, key: str, params: dict[str, Any], trial: _Trial, deadline: float, *,
                grow: bool = False) -> stats.Interval:
        """Its environment's defaults / the defaults, from fresh process pairs (``across_processes``, one pair at a
        time), pooled over the candidates of that environment. In ``begin``: the fewest pairs (``least``), or one
        more in a confirmation round; each later round of the candidate's race adds one (``grow``, from ``more``)
        until the factor is ``enough`` (``process_pair.enough``), from then on cached. So a candidate the race
        stops after its first round costs ``least`` pairs: measured to ``enough`` first, the heuristic took 8
        pairs, 58 s of a 5-minute search, and was then stopped below the incumbent. Never past the trial's
        deadline: a factor cut short for time keeps its pairs for the next candidate of it. Where no worker of the
        environment runs, the last pair's environment side is kept as its worker (``_env_worker``): a start of
        3-5 s saved, for the heuristic and each confirmation round (CNN, 2-vCPU VM)."""
        ratios = list(self.factor_ratios.get(key, []))
        least, most = self.process_pairs
        due = key in self._due and bool(ratios)  # a confirmation round: one more fresh process pair
        if key in self.factors and not due:
            return self.factors[key]
        self._due.discard(key)
        target = len(ratios) + 1 if grow or due else max(least, len(ratios))
        for worker in self._workers():
            self._set_aside(worker)  # the process pairs are timed alone
        before, spent = len(ratios), 0.0
        while len(ratios) < target:
            started = time.monotonic()
            new = len(ratios) - before
            cost = spent / new if new else (self._pair_s if grow else 0.0)
            if cost and deadline - started < 1.5 * cost:
                if len(ratios) < least:
                    trial.warnings.append(f"environment factor from {len(ratios)} process pair(s): time ran out")
                break
            self.on_phase("starting", f"process pair {len(ratios) + 1}: "
                          + ", ".join(environment_differences(self.defaults, params)))
            keep = len(ratios) + 1 == target and not self._env_alive(key)
            run, _, kept = process_pair(self.workload, self.defaults, self._env_defaults(params), self.facts,
                                        self.settings, pairs=max(4, self.cal.pairs // 2),
                                        window_s=self.cal.window_s, seed=trial.seed + len(ratios), keep=keep)
            if kept is not None:
                self._close_env()
                self.env = (key, kept)
            timed = sum(p.base.elapsed_s + p.cand.elapsed_s for p in run.pairs)
            trial.timed_s += timed
            trial.startup_s += time.monotonic() - started - timed
            spent += time.monotonic() - started
            self._pair_s = time.monotonic() - started
            ratios.append(run.ratio.median)
            self.factor_ratios[key] = list(ratios)
        interval = stats.log_mean_interval(ratios) if ratios else _NOTHING
        if ratios and enough(ratios, self.cal.half_width, least=least, most=most):
            self.factors[key] = interval
        return interval

    def _env_worker(self, key: str, params: dict[str, Any], trial: _Trial, deadline: float) -> PairedWorker:
        """The worker of this environment, with its defaults arm: kept from the previous candidate, or new."""
        if self._env_alive(key):
            assert self.env is not None
            return self._use(self.env[1])
        self._close_env()
        self.on_phase("starting", "a worker of " + ", ".join(environment_differences(self.defaults, params)))
        started = time.monotonic()
        worker = PairedWorker(self.workload, self._env_defaults(params), self.facts, self.settings)
        self.env = (key, worker)
        self._use(worker)
        worker.start(max(1.0, deadline - time.monotonic()))
        trial.startup_s += time.monotonic() - started
        started = time.monotonic()
        self._add(worker, DEFAULTS, self._env_defaults(params), deadline - time.monotonic())
        trial.warmup_s += time.monotonic() - started
        return worker

    def _env_alive(self, key: str) -> bool:
        """Whether the worker of environment ``key`` runs (kept from a candidate, or its last process pair's)."""
        return self.env is not None and self.env[0] == key and self.env[1].proc is not None \
            and self.env[1].proc.poll() is None

    def _workers(self) -> list[PairedWorker]:
        return [w for w in (self.worker, self.env[1] if self.env else None) if w is not None]

    def _use(self, worker: PairedWorker) -> PairedWorker:
        """``worker`` runs; the other one (if any) is set aside, so its threads take nothing from it."""
        for other in self._workers():
            if other is not worker:
                self._set_aside(other)
        worker.thaw()
        return worker

    def _set_aside(self, worker: PairedWorker) -> None:
        """Frozen; on CUDA its allocator's unused cache returned to the device first: a frozen process keeps
        its memory, beside which another process's larger batch ran out of memory and read as the batch's."""
        if worker.frozen is None and self.defaults.get("device") == "cuda" and worker.proc is not None \
                and worker.proc.poll() is None:
            worker.empty_cache()
        worker.freeze()

    @staticmethod
    def _add(worker: PairedWorker, name: str, params: dict[str, Any], timeout_s: float) -> ArmStatus:
        status = worker.add_arm(name, params, max(1.0, timeout_s))
        if status.state != "ok":
            raise WorkerError(f"arm {name!r} failed ({status.state}): {status.error}")
        return status

    def more(self, handle: object, n: int, timeout_s: float) -> stats.Interval:
        trial = self._trial(handle)
        if trial.failed is None and not trial.baseline:
            deadline = time.monotonic() + timeout_s
            try:
                key, trial.rounds = trial.factor_key, trial.rounds + 1
                if key is not None and trial.rounds > 1 and self._grow and key not in self.factors \
                        and trial.worker is not None:  # a later round of the race: one more process pair
                    trial.factor = self._factor(key, trial.params, trial, deadline, grow=True)
                if trial.worker is None:
                    self._fresh_pairs(trial, n, deadline)
                elif trial.in_process:
                    self._pairs(trial, n, deadline)
            except WorkerError as e:
                trial.failed = self._lost(trial, e, deadline)
        trial.interval = self._interval(trial)
        return trial.interval

    def loss(self, handle: object) -> float | None:
        """The candidate's quality-guard loss, once taken (at the study's sample count, in its first windows or
        its first fresh process): the race stops a candidate the guard will reject (``SearchLoop._race``). None
        before, and for a candidate that is its environment's defaults (the model and data of the defaults')."""
        trial = self._trial(handle)
        if trial.fresh:
            return trial.fresh[0][1].loss
        return trial.cand_status.loss if trial.in_process and trial.cand_status is not None else None

    def _pairs(self, trial: _Trial, n: int, deadline: float) -> None:
        assert trial.worker is not None
        self.on_phase("paired windows", f"{trial.name}: {n} more pair(s)")
        self._use(trial.worker)
        run = trial.worker.run_pairs(trial.base, trial.name, n, self.cal.window_s,
                                     seed=trial.seed + len(trial.records),
                                     timeout_s=max(1.0, deadline - time.monotonic()))
        trial.records += run.pairs
        trial.base_status, trial.cand_status = run.base, run.cand
        trial.timed_s += sum(p.base.elapsed_s + p.cand.elapsed_s for p in run.pairs)
        failed = run.cand if run.cand.state != "ok" else run.base if run.base.state != "ok" else None
        if failed is not None:
            status = _status(failed.state) if failed is run.cand else Status.CRASH
            trial.failed = TrialResult(status, error=f"arm {failed.arm}: {failed.error}")

    def _fresh_pairs(self, trial: _Trial, n: int, deadline: float) -> None:
        """Fresh trial processes of the candidate and of the defaults, alternated: at least ``FRESH_PAIRS``."""
        count = max(1, min(n, FRESH_PAIRS - len(trial.fresh))) if len(trial.fresh) < FRESH_PAIRS else 1
        rng = random.Random(trial.seed + len(trial.fresh))
        for worker in self._workers():
            self._set_aside(worker)  # timed alone, as the process pairs
        for _ in range(count):
            self.on_phase("starting", f"{trial.name}: fresh process pair {len(trial.fresh) + 1}")
            runs: dict[str, TrialResult] = {}
            for side in (["base", "cand"] if rng.random() < 0.5 else ["cand", "base"]):
                params = self.defaults if side == "base" else trial.params
                runs[side] = run_trial(self.workload, params, self.facts, self.settings,
                                       timeout_s=max(1.0, deadline - time.monotonic()))
                trial.startup_s += runs[side].startup_s or 0.0
                trial.warmup_s += runs[side].warmup_s or 0.0
                trial.timed_s += runs[side].timed_s or 0.0
                if runs[side].status != Status.OK:
                    failed = runs[side]
                    trial.failed = failed if side == "cand" else TrialResult(
                        Status.CRASH, error=f"the defaults failed in a fresh process: {failed.error}")
                    return
            trial.fresh.append((runs["base"], runs["cand"]))
            trial.warnings += [w for w in runs["cand"].warnings if w not in trial.warnings]

    def _interval(self, trial: _Trial) -> stats.Interval:
        """The candidate's speedup over the defaults so far, amortised over ``train_steps``."""
        if trial.baseline:
            return self.cal.aa.amortised
        if trial.worker is None:
            ratios = [c.objective / b.objective for b, c in trial.fresh if c.objective and b.objective]
            return stats.log_mean_interval(ratios) if ratios else _NOTHING
        if not trial.in_process:
            return trial.factor or _NOTHING
        if not trial.records or trial.base_status is None or trial.cand_status is None:
            return _NOTHING
        inner = stats.compare(trial.records, trial.base_status, trial.cand_status,
                              train_steps=self.settings.train_steps, margin=self.cal.margin).amortised
        return combine(trial.factor, inner) if trial.factor is not None else inner

    def end(self, handle: object) -> TrialResult:
        trial = self._trial(handle)
        try:
            return self._end(trial)
        finally:
            self._drop(trial)

    def _end(self, trial: _Trial) -> TrialResult:
        if trial.failed is not None:
            return replace(trial.failed, wall_s=time.monotonic() - trial.started, startup_s=trial.startup_s,
                           warmup_s=trial.warmup_s, timed_s=trial.timed_s, warnings=trial.warnings)
        if trial.worker is None and not trial.baseline:
            return self._end_fresh(trial)
        worker = self.worker if trial.baseline else trial.worker
        arm = DEFAULTS if trial.baseline or not trial.in_process else trial.name
        assert worker is not None
        self.on_phase("evaluating", trial.name)
        try:
            self._use(worker)
            status = worker.evaluate(arm)
        except WorkerError as e:
            return replace(self._lost(trial, e, time.monotonic() + 300.0), wall_s=time.monotonic() - trial.started)
        if status.state != "ok":
            return TrialResult(_status(status.state), error=status.error, wall_s=time.monotonic() - trial.started)
        interval = trial.interval or self._interval(trial)
        if trial.baseline:
            noise = self.noise
            trial.startup_s, self._startup_s = self._startup_s, 0.0
            trial.timed_s = noise.timed_s if noise else 0.0
            trial.started = time.monotonic() - (noise.wall_s if noise else 0.0)
        method = ("in-process pairs" if trial.factor is None else
                  "process pairs x in-process pairs" if trial.in_process else "process pairs")
        rates = [p.cand.rate for p in trial.records]
        return TrialResult(
            Status.OK, samples_per_s=statistics.median(rates) if rates else status.step_samples / (status.step_s or 1),
            objective=1.0 if trial.baseline else interval.median,  # the defaults against themselves: 1 by definition
            speedup_low=interval.low, speedup_high=interval.high, method=method,
            pairs=interval.count, compile_s=status.compile_s, startup_s=trial.startup_s, warmup_s=trial.warmup_s,
            timed_s=trial.timed_s, loss=status.loss, loss_samples=status.loss_samples,
            peak_memory_bytes=status.peak_memory_bytes, wall_s=time.monotonic() - trial.started,
            in_effect={**(worker.ready.in_effect if worker.ready else {}), **status.in_effect},
            warnings=[*trial.warnings, *(w for w in status.warnings if w not in trial.warnings)])

    def _end_fresh(self, trial: _Trial) -> TrialResult:
        interval = trial.interval or self._interval(trial)
        runs = [c for _, c in trial.fresh]
        first = runs[0] if runs else TrialResult(Status.CRASH, error="no fresh process pair ran")
        if not runs:
            return replace(first, wall_s=time.monotonic() - trial.started)
        return replace(first, objective=interval.median, speedup_low=interval.low, speedup_high=interval.high,
                       method="fresh process pairs", pairs=interval.count,
                       samples_per_s=statistics.median(r.samples_per_s or 0.0 for r in runs),
                       startup_s=trial.startup_s, warmup_s=trial.warmup_s, timed_s=trial.timed_s,
                       wall_s=time.monotonic() - trial.started, warnings=trial.warnings)

    def _lost(self, trial: _Trial, error: WorkerError, deadline: float) -> TrialResult:
        """A worker that died or did not answer: the trial is a crash, an out-of-memory kill or a timeout (as
        a trial process's exit is classified), and the worker is gone: the next candidate starts another."""
        worker, status, message = trial.worker, Status.CRASH, str(error)
        if time.monotonic() >= deadline - 1.0:
            status = Status.TIMEOUT  # stopped by us (``PairedWorker`` stops the tree of a worker that does not answer)
        elif worker is not None:
            code = worker.proc.poll() if worker.proc is not None else None
            if code == -signal.SIGKILL:  # as ``runner._classify``: only the kernel's OOM killer sends it unasked
                status = Status.OOM
                message = "the paired worker was killed by SIGKILL (the kernel's out-of-memory killer)"
            elif code is not None and code != 0:
                message = f"the paired worker {_ended(code)}: {error}"
        if worker is not None:
            worker.close(timeout_s=1.0)
            if self.env is not None and self.env[1] is worker:
                self.env = None
        trial.worker = None
        return TrialResult(status, error=message, wall_s=time.monotonic() - trial.started,
                           startup_s=trial.startup_s, warmup_s=trial.warmup_s, timed_s=trial.timed_s,
                           warnings=trial.warnings)

    def _drop(self, trial: _Trial) -> None:
        """The candidate's arm leaves its worker (a worker that died meanwhile is simply gone)."""
        worker = trial.worker
        if worker is None or not trial.in_process or trial.name not in worker.arms:
            return
        try:
            self._use(worker)
            worker.drop_arm(trial.name)
        except WorkerError:
            worker.close(timeout_s=1.0)

    @staticmethod
    def _trial(handle: object) -> _Trial:
        if not isinstance(handle, _Trial):
            raise TypeError(f"not a handle of this measurer: {handle!r}")
        return handle

    def _close_env(self) -> None:
        if self.env is not None:
            _, worker, self.env = *self.env, None
            worker.close()

    def close(self) -> None:
        """End every worker (the defaults' and the other environment's)."""
        try:
            self._close_env()
        finally:
            if self.worker is not None:
                self.worker.close()
                self.worker = None


_NOTHING = stats.Interval(0.0, 0.0, 0.0, 0.0, 0)  # no pair yet (or an arm failed before one): slower than anything
