"""The search's ``PairedMeasurer`` on this machine: ``LiveMeasurer``, candidates measured against the defaults in
live worker processes (``autotune.measure.live.pool``), across processes where their environment differs."""
from __future__ import annotations

import contextlib
import logging
import statistics
import time
from dataclasses import replace
from typing import Any

from ... import search_spaces as spaces
from ...trial.spec import Status, TrialResult
from .. import sizing, stats
from ..environment import (
    ACROSS,
    DEFAULTS,
    FACTOR,
    IN_PROCESS,
    environment_defaults,
    environment_differences,
    environment_key,
    same_environment,
)
from ..hopeless import HOPELESS
from ..measurer import BUSY, LossReading, Noise, PairedMeasurer, too_busy
from ..protocol import ArmStatus
from ..runs import RunPair, trial_pair, trial_run_s
from ..worker.arms import WINDOW_FLOOR_S, choose_window_s
from .candidate import LiveTrial, hopeless_environment, hopeless_result, reported, status_of
from .factors import EnvironmentFactors
from .paired_worker import Calibration, WorkerError, calibrated
from .pool import PhaseHook, WorkerPool, lost
from .process_pair import PROCESS_PAIRS, HopelessEnvironment

log = logging.getLogger(__name__)
WARM_UP_SLACK_S = 10.0  # an eager arm's build and first kernels, beyond its warm-up steps (``_warm_up_limit_s``)
PROFILE_S = 2.0  # the defaults under torch's profiler after the calibration (a faster candidate: half; 0: none)


class LiveMeasurer(PairedMeasurer):
    """The search's ``PairedMeasurer`` on this machine, with every capability (the second look's ``losses`` too):
    - ``calibrate``: the defaults' worker started and calibrated once (an A/A: ``Noise``);
    - a candidate of the defaults' environment is an arm in that worker, paired with the defaults arm;
    - another environment: its factor (its in-process defaults / the defaults, over fresh process pairs,
      ``across_processes``) measured once per environment per search and cached (``factors``, which a
      resumed search may fill from its trials; a confirmation round measures one pair of its own), x its
      in-process ratio in a worker of that environment, kept alive while consecutive candidates use it (one at
      most besides the defaults'; the idle one is frozen): the environment's side of its last process pair,
      its heap fixed from then on (``process_pair.process_pair``'s ``keep``), where no worker of it runs;
    - ``processes`` > 1 (a worker holds one process), or two models that do not fit on one GPU: fresh
      trial processes, alternated with fresh runs of the defaults, ``FRESH_PAIRS`` pairs or more, ratio
      interval by ``stats.log_mean_interval``;
    - the first ``begin(defaults)`` after ``calibrate`` is the baseline trial: ``end`` gives the A/A's interval
      and the defaults arm's loss (no pairs run).
    A failed arm is a ``TrialResult`` (oom, nan, crash); a dead or hung worker a crash or timeout, and the
    worker is started again for the next candidate."""

    second_look = True
    keeps_factors = True
    user_processes = True

    def __init__(self, workload: str, defaults: dict[str, Any], facts: Any, settings: Any, *,
                 calibration_pairs: int = 16, half_width: float = 0.03, window_s: float | None = None,
                 process_pairs: tuple[int, int] = PROCESS_PAIRS, seed: int = 0,
                 on_phase: PhaseHook | None = None, busy: float = BUSY, profile_s: float = PROFILE_S) -> None:
        self.workload, self.defaults, self.facts, self.settings = workload, defaults, facts, settings
        self.calibration_pairs, self.half_width, self.window_s = calibration_pairs, half_width, window_s
        self.process_pairs, self.seed, self.busy, self.profile_s = process_pairs, seed, busy, profile_s
        self.operators: dict[str, float] | None = None  # the defaults' top operators (``phases.top_operators``)
        self._fastest = 1.0  # the fastest candidate's median so far: a faster one is profiled
        self.on_phase: PhaseHook = on_phase or (lambda name, detail: None)
        self.pool = WorkerPool(workload, defaults, facts, settings, lambda name, detail: self.on_phase(name, detail))
        self.calibration: Calibration | None = None
        PairedMeasurer.__init__(self, defaults)
        self.environments = EnvironmentFactors(workload, defaults, facts, settings, self.pool, process_pairs,
                                               lambda name, detail: self.on_phase(name, detail), self.factors,
                                               self.factor_ratios)  # the factors it measures across processes
        self._count, self._baseline_given = 0, False
        self.warm_up_slack_s = WARM_UP_SLACK_S

    @property
    def cal(self) -> Calibration:
        return calibrated(self.calibration)

    # The defaults' worker --------------------------------------------------------------------------------

    def calibrate(self, timeout_s: float) -> Noise:
        started, timeout_s = time.monotonic(), min(timeout_s, 86_400.0)  # no budget: a day is as good
        self.on_phase("calibrating noise", "the defaults against themselves, in one process")
        worker = self.pool.defaults_worker(timeout_s, with_arm=False)
        status = self.pool.add(worker, DEFAULTS, self.defaults, timeout_s)
        start_s, device = time.monotonic() - started, self.defaults.get("device") or "cpu"
        window, pairs, profile_s = sizing.calibration(
            timeout_s, start_s, self.profile_s, self.calibration_pairs,
            choose_window_s(status.step_s or status.first_step_s or 0.0, device),
            WINDOW_FLOOR_S.get(device, WINDOW_FLOOR_S["cpu"]), self.window_s)
        for attempt in range(2):  # a machine too busy to calibrate is given a second chance, in what the share left
            cal = worker.calibrate(DEFAULTS, self.defaults, pairs=pairs, half_width=self.half_width, window_s=window,
                                   seed=self.seed + attempt)
            busy = too_busy(cal.aa.amortised, self.busy)
            if busy is None:
                break
            self.on_phase("calibrating noise", f"{busy}: once more")
            left = sizing.CALIBRATION_SHARE * timeout_s - (time.monotonic() - started) - profile_s
            pairs = max(6, min(pairs, int(left / (2 * window))))
        if busy is not None:
            raise WorkerError(f"{busy} twice: rank no recipe on it; try again when the machine is quieter")
        # A budget-sized race: a candidate's most pairs (3 x pairs, two windows each) within a quarter of the time.
        affordable = max(8, int(timeout_s / (4 * 3 * 2 * cal.window_s)))
        if cal.pairs > affordable:
            cal = replace(cal, pairs=affordable)
        self.calibration = cal
        if profile_s > 0:
            self.operators = self._profile(worker, DEFAULTS, profile_s, cal.step_s, "defaults")
            self.pool.defaults_worker(timeout_s, with_arm=True)  # the same, unless the profile stopped it
        self.noise = Noise.from_calibration(cal, wall_s=time.monotonic() - started, start_s=start_s, run_s=trial_run_s(
            start_s, cal.step_s, self.settings, self.defaults.get("batch_per_rank") or 1, status.settle_steps))
        return self.noise

    def _profile(self, worker: Any, arm: str, seconds: float, step_s: float, who: str) -> dict[str, float] | None:
        """``arm``'s top operators (``phases.profiled``), for the report only: where it fails, a warning and None (a
        worker it stopped is started again when next needed)."""
        self.on_phase("profiling", f"{who}: the top operators")
        try:
            return dict(worker.profile(arm, seconds, step_s).operators) or None
        except WorkerError as e:
            log.warning("the profile of %s failed (%s): the report shows no top operators for it", who, e)
            return None

    def _profile_fastest(self, trial: LiveTrial, worker: Any, arm: str, median: float) -> dict[str, float] | None:
        """The top operators of a search's candidate faster than all before it (as the best nearly always is)."""
        seconds = min(self.profile_s / 2, trial.deadline - time.monotonic() - 1.0)
        if self.environments.confirming or median <= self._fastest or seconds <= 0:
            return None
        self._fastest = median
        return self._profile(worker, arm, seconds, 0.0, f"{trial.name}, the fastest yet")

    # Candidates --------------------------------------------------------------------------------------------

    def warm(self, params: dict[str, Any]) -> bool:
        """Whether a candidate of ``params``' environment would start no process for its first look: the defaults'
        (their worker lives as long as the search) or an environment whose worker is alive and whose factor lacks
        none of its fewest process pairs (``EnvironmentFactors.missing_pairs``): the search prices these cheap and
        fills its end."""
        if spaces.processes.count(params) > 1:
            return False
        if same_environment(params, self.defaults):
            return True
        key = environment_key(params)
        environments = self.environments
        return not environments.missing_pairs(key) and key not in environments.hopeless and self.pool.env_alive(key)

    def reseed(self, seed: int) -> None:
        """A confirmation round's fresh pairs: new window orders, fresh worker processes (what is confirmed is
        measured in processes as new as the user's), and for every environment a factor of this round's own: one
        fresh process pair, never pooled with those that chose the candidate
        (``EnvironmentFactors.confirmation_round``)."""
        self.seed = seed
        self.environments.confirmation_round()
        self.close()

    def begin(self, params: dict[str, Any], timeout_s: float) -> object | TrialResult:
        self._count += 1
        trial = LiveTrial(params, f"c{self._count}", self.seed + 1000 * self._count, time.monotonic())
        deadline = trial.deadline = time.monotonic() + timeout_s
        if params == self.defaults and not self._baseline_given:
            trial.baseline = self._baseline_given = True  # the calibration's A/A; later ones are arms like any
            return trial
        try:
            if spaces.processes.count(params) > 1:
                return trial  # fresh process pairs: ``more`` runs them
            return self._begin_paired(trial, deadline)
        except HopelessEnvironment as e:
            return hopeless_environment(trial, e)
        except WorkerError as e:
            return self._lost(trial, e, deadline)

    def _begin_paired(self, trial: LiveTrial, deadline: float) -> LiveTrial | TrialResult:
        params = trial.params
        if same_environment(params, self.defaults):
            trial.worker = self.pool.use(self.pool.defaults_worker(deadline - time.monotonic(), with_arm=True))
            trial.startup_s, self.pool.startup_s = self.pool.startup_s, 0.0
        else:
            key = trial.factor_key = environment_key(params)
            short = self.environments.too_short(key, deadline, self.calibration, self.noise)
            if short is not None:
                return TrialResult(Status.SKIPPED, error=short, wall_s=time.monotonic() - trial.started)
            trial.factor = self.environments.factor(key, params, trial, deadline, self.calibration)
            if trial.factor.count == 0:  # not one process pair fitted: no speedup to give, not a failed recipe
                return TrialResult(Status.SKIPPED, error="no process pair of its environment fitted in the time left",
                                   wall_s=time.monotonic() - trial.started, warnings=trial.warnings)
            env_defaults = environment_defaults(params, self.defaults)
            trial.worker, startup_s, warmup_s = self.pool.env_worker(
                key, env_defaults, ", ".join(environment_differences(self.defaults, params)), deadline)
            trial.startup_s, trial.warmup_s = trial.startup_s + startup_s, trial.warmup_s + warmup_s
            trial.in_process = params != env_defaults
        if not trial.in_process:
            return trial
        compiling = spaces.compilation.compiled(params)
        self.on_phase("compiling" if compiling else "warm-up", trial.name)
        started = time.monotonic()
        limit = deadline - started if compiling else min(deadline - started, self._warm_up_limit_s())
        try:
            status = trial.worker.add_arm(trial.name, params, max(1.0, limit), give_up=HOPELESS, against=trial.base)
        except WorkerError as e:
            waited = time.monotonic() - started
            if compiling or waited < limit - 1.0 or time.monotonic() >= deadline - 1.0:
                raise  # it died (a crash, out of memory) or the trial's own time ran out: not its speed
            return self._hopeless(trial, None, f"its warm-up had not ended after {waited:.0f} s ({e})", started)
        trial.warmup_s += time.monotonic() - started
        trial.cand_status = status
        trial.warnings += status.warnings
        if status.state == "ok" and status.gave_up is not None:
            return self._hopeless(trial, status, f"a step took {status.gave_up:.0f}x the defaults' time per sample",
                                  started)
        if status.state == "ok":
            return trial
        self._drop(trial)
        if status.state == "no-room":
            # Two models do not fit on this GPU next to each other (``paired``): fresh processes, one model each.
            trial.worker, trial.cand_status = None, None
            trial.warnings.append(f"{status.error or 'two models do not fit on one GPU'}: measured in fresh process "
                                  "pairs instead")
            return trial
        return TrialResult(status_of(status.state), error=status.error, wall_s=time.monotonic() - trial.started,
                           warmup_s=trial.warmup_s, startup_s=trial.startup_s, warnings=trial.warnings)

    def _warm_up_limit_s(self) -> float:
        """How long an eager arm's build and warm-up may take before it counts as far slower (``HOPELESS``): its
        warm-up steps at that many times the defaults' step, twice over (a larger batch's step is longer), and
        ``WARM_UP_SLACK_S`` for the model's build and first kernels."""
        steps = max(1, self.settings.warmup_steps)
        return self.warm_up_slack_s + 2 * HOPELESS * steps * self.cal.step_s

    def _hopeless(self, trial: LiveTrial, status: ArmStatus | None, why: str, started: float) -> TrialResult:
        """A candidate far slower than the defaults in its first steps (``HOPELESS``): stopped there, measured
        slower, no pairs and no loss (it cannot be the recipe). A worker that did not answer in time is ended and
        started again within this trial: its restart is charged to the candidate that caused it."""
        if status is None:
            if trial.worker is not None:
                self.pool.lose(trial.worker)
            trial.worker = None
            if trial.factor_key is None:  # the defaults' worker: started again now, charged here, in its time
                with contextlib.suppress(WorkerError):  # else the next candidate starts it
                    self.pool.defaults_worker(max(1.0, trial.deadline - time.monotonic()), with_arm=True)
        else:
            self._drop(trial)
        return hopeless_result(trial, status, why, time.monotonic() - started if status is None else 0.0)

    def more(self, handle: object, n: int, timeout_s: float, confidence: float = stats.CONFIDENCE) -> stats.Interval:
        trial = self._trial(handle)
        if trial.failed is None and not trial.baseline:
            deadline = time.monotonic() + timeout_s
            try:
                key, trial.rounds = trial.factor_key, trial.rounds + 1
                confirming = self.environments.confirming
                if key is not None and trial.rounds > 1 and not confirming and key not in self.factors \
                        and trial.worker is not None:  # a later round of the race: one more process pair
                    round_s = sizing.race_round_s(n, self.cal.window_s)  # where the round itself still fits after it
                    trial.factor = self.environments.factor(key, trial.params, trial, deadline - round_s,
                                                           self.calibration, grow=True)
                if trial.worker is None:
                    self.pool.set_all_aside()  # timed alone, as the process pairs
                    trial.fresh_pairs(n, self.workload, self.defaults, self.facts, self.settings, deadline,
                                      self.on_phase, self.cal.s_per_sample)
                elif trial.in_process:
                    self._pairs(trial, n, deadline)
            except HopelessEnvironment as e:
                trial.failed = hopeless_environment(trial, e)
            except WorkerError as e:
                trial.failed = self._lost(trial, e, deadline)
        return trial.speedup(self.calibration, self.settings.train_steps, confidence)

    def loss(self, handle: object) -> float | None:
        """The candidate's quality-guard loss, once taken (at the study's sample count, in its first windows or
        its first fresh process): the race stops a candidate the guard will reject (``SearchLoop._race``). None
        before, and for a candidate that is its environment's defaults (the model and data of the defaults')."""
        trial = self._trial(handle)
        if trial.fresh:
            return trial.fresh[0][1].loss
        return trial.cand_status.loss if trial.in_process and trial.cand_status is not None else None

    def in_effect(self, handle: object) -> dict[str, Any] | None:
        """``LiveTrial.in_effect``: the race stops a candidate whose knob did not take (``SearchLoop._race``)."""
        return self._trial(handle).in_effect()

    def losses(self, arms: list[tuple[dict[str, Any], int]], timeout_s: float, *,
               wide: bool = False) -> list[LossReading]:
        """The quality guard's second look (``autotune.study.guard``): ``WorkerPool.losses``."""
        return [LossReading.of(s) for s in self.pool.losses(arms, timeout_s, wide=wide)]

    def _pairs(self, trial: LiveTrial, n: int, deadline: float) -> None:
        assert trial.worker is not None
        self.on_phase("paired windows", f"{trial.name}: {n} more pair(s)")
        self.pool.use(trial.worker)
        run = trial.worker.run_pairs(trial.base, trial.name, n, self.cal.window_s,
                                     seed=trial.seed + len(trial.records),
                                     timeout_s=max(1.0, deadline - time.monotonic()))
        trial.records += run.pairs
        trial.base_status, trial.cand_status = run.base, run.cand
        trial.timed_s += sum(p.base.elapsed_s + p.cand.elapsed_s for p in run.pairs)
        failed = run.cand if run.cand.state != "ok" else run.base if run.base.state != "ok" else None
        if failed is not None:
            status = status_of(failed.state) if failed is run.cand else Status.CRASH
            trial.failed = TrialResult(status, error=f"arm {failed.arm}: {failed.error}")

    def skip_loss(self, handle: object) -> None:
        """The candidate cannot be the recipe (its interval wholly below the defaults): ``end`` does not train it
        to the quality guard's sample count; a loss its windows took already is kept."""
        self._trial(handle).no_loss = True

    def end(self, handle: object) -> TrialResult:
        trial = self._trial(handle)
        try:
            return self._end(trial)
        finally:
            self._drop(trial)

    def _end(self, trial: LiveTrial) -> TrialResult:
        if trial.failed is not None:
            return replace(trial.failed, wall_s=time.monotonic() - trial.started, startup_s=trial.startup_s,
                           warmup_s=trial.warmup_s, timed_s=trial.timed_s, warnings=trial.warnings)
        if trial.worker is None and not trial.baseline:
            return trial.fresh_result(trial.speedup(self.calibration, self.settings.train_steps))
        worker = self.pool.worker if trial.baseline else trial.worker
        arm = DEFAULTS if trial.baseline or not trial.in_process else trial.name
        assert worker is not None
        try:
            if trial.no_loss and not trial.baseline:
                status = (trial.cand_status if trial.in_process else trial.base_status) or ArmStatus(arm, "ok")
            else:
                self.on_phase("evaluating", trial.name)
                self.pool.use(worker)
                # never past the trial's limit: an arm trained to the guard's samples at 17 samples/s took 60 s more
                status = worker.evaluate(arm, timeout_s=max(1.0, min(300.0, trial.deadline - time.monotonic())))
        except WorkerError as e:
            return replace(self._lost(trial, e, trial.deadline), wall_s=time.monotonic() - trial.started)
        if status.state != "ok":
            return TrialResult(status_of(status.state), error=status.error, wall_s=time.monotonic() - trial.started)
        interval = trial.speedup(self.calibration, self.settings.train_steps)
        if trial.baseline:
            noise = self.noise
            trial.startup_s, self.pool.startup_s = self.pool.startup_s, 0.0
            trial.timed_s = noise.timed_s if noise else 0.0
            trial.started = time.monotonic() - (noise.wall_s if noise else 0.0)
        method = IN_PROCESS if trial.factor is None else ACROSS if trial.in_process else FACTOR
        rates = [p.cand.rate for p in trial.records]
        beside = [p.base.rate for p in trial.records] if trial.factor is None else []  # the defaults arm itself
        return TrialResult(
            Status.OK, samples_per_s=statistics.median(rates) if rates else status.step_samples / (status.step_s or 1),
            objective=1.0 if trial.baseline else interval.median,  # the defaults against themselves: 1 by definition
            speedup_low=interval.low, speedup_high=interval.high, confidence=interval.confidence, method=method,
            pairs=interval.count, baseline_samples_per_s=statistics.median(beside) if beside else None,
            compile_s=status.compile_s, startup_s=trial.startup_s, warmup_s=trial.warmup_s,
            timed_s=trial.timed_s, loss=status.loss, loss_samples=status.loss_samples,
            peak_memory_bytes=status.peak_memory_bytes, data_wait=status.data_wait,
            phases=dict(status.phases) if status.phases else None,
            operators=self.operators if trial.baseline else self._profile_fastest(trial, worker, arm, interval.median),
            wall_s=time.monotonic() - trial.started,
            in_effect=reported(worker, status),
            warnings=[*trial.warnings, *(w for w in status.warnings if w not in trial.warnings)])

    def _lost(self, trial: LiveTrial, error: WorkerError, deadline: float) -> TrialResult:
        """A worker that died or did not answer: the trial is a crash, an out-of-memory kill or a timeout (as
        a trial process's exit is classified), and the worker is gone: the next candidate starts another."""
        worker = trial.worker
        status, message = lost(worker, error, deadline)
        if worker is not None:
            self.pool.lose(worker)
        trial.worker = None
        return TrialResult(status, error=message, wall_s=time.monotonic() - trial.started,
                           startup_s=trial.startup_s, warmup_s=trial.warmup_s, timed_s=trial.timed_s,
                           warnings=trial.warnings)

    def _drop(self, trial: LiveTrial) -> None:
        """The candidate's arm leaves its worker (``WorkerPool.drop_arm``); a candidate not in-process has none."""
        self.pool.drop_arm(trial.worker if trial.in_process else None, trial.name)

    def user_pair(self, params: dict[str, Any], seed: int, timeout_s: float) -> RunPair:
        """One pair of your runs (``runs.trial_pair``), the search's own workers ended first: your run has the
        machine to itself."""
        self.pool.close()
        return trial_pair(self.workload, self.defaults, params, self.facts, self.settings, seed, timeout_s)

    @staticmethod
    def _trial(handle: object) -> LiveTrial:
        if not isinstance(handle, LiveTrial):
            raise TypeError(f"not a handle of this measurer: {handle!r}")
        return handle

    def close(self) -> None:
        """End every worker (the defaults' and the other environment's)."""
        self.pool.close()
