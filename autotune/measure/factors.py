"""Environment factors of the live measurer (``LiveMeasurer``'s part that measures across processes): an
environment's defaults against the search's defaults, in fresh process pairs (``process_pair``), pooled over the
candidates of that environment until ``enough``, one pair of its own in each confirmation round."""
from __future__ import annotations

import re
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..trial.spec import Status
from . import stats
from .candidate import NOTHING, LiveTrial, environment_defaults, round_factor
from .environment import environment_differences
from .measurer import PairedMeasurer, first_pairs
from .paired_worker import Calibration, WorkerError
from .process_pair import HopelessEnvironment, enough, process_pair
from .runs import PairFailed, RunPair, sequential

if TYPE_CHECKING:
    from ..probes import Facts
    from ..trial.spec import TrialSettings
    from .pool import PhaseHook, WorkerPool


CUT_FACTOR = "environment factor from {} process pair(s): time ran out"  # a trial's warning, read by ``cut_pairs``
_CUT = re.compile(r"environment factor from (\d+) process pair")


def cut_pairs(warnings: Iterable[str]) -> list[int]:
    """The process pairs of each environment factor a trial's ``warnings`` say was cut short for time
    (``CUT_FACTOR``)."""
    return [int(m.group(1)) for w in warnings if (m := _CUT.search(w))]


class EnvironmentFactors(PairedMeasurer):
    """The factors' state and measurement (``factors``: environment key -> its factor; ``factor_ratios``:
    environment key -> one ratio per process pair run); ``LiveMeasurer`` holds the workers, settings and
    calibration they use."""

    keeps_factors = True
    user_processes = True

    workload: str
    facts: Facts
    settings: TrialSettings
    pool: WorkerPool
    calibration: Calibration | None
    process_pairs: tuple[int, int]
    on_phase: PhaseHook

    def __init__(self, defaults: dict[str, Any]) -> None:
        PairedMeasurer.__init__(self, defaults)
        self._confirming = False  # after ``reseed``: each round's factors are its own process pairs
        self._round_factors: dict[str, stats.Interval] = {}  # this confirmation round's, by environment key
        self._pair_s = 0.0  # the last process pair's wall time
        self.hopeless: dict[str, HopelessEnvironment] = {}  # environment key -> how its first steps gave up

    @property
    def cal(self) -> Calibration:
        if self.calibration is None:
            raise WorkerError("calibrate() first: the search starts with the defaults against themselves")
        return self.calibration

    def missing_pairs(self, key: str) -> int:
        """How many of its fewest process pairs environment ``key``'s factor still lacks. At 0 a candidate's
        ``begin`` adds none (while it is not ``enough``, a later round of its race adds one where the trial's time
        holds it): waiting for it to settle priced the fastest environment's combination, an arm in its live
        worker, as a trial that starts processes, and near a short search's end it no longer fitted."""
        return 0 if key in self.factors else max(0, self.process_pairs[0] - len(self.factor_ratios.get(key, ())))

    def _too_short(self, key: str, deadline: float) -> str | None:
        """Why a candidate of another environment is not started: its process pairs (the last one's worker is kept
        for its arms) or its worker's start would outlast ``deadline``, from the starts and pairs measured so far;
        None when it may finish. A confirmation round is admitted by the confirmation's own estimate
        (``budget.rounds_s``, which also sized the time kept for it): judged here again by another estimate, the
        last round of a tight budget was skipped, its gain left unconfirmed."""
        if not self.pool.start_s or self.calibration is None or self._confirming:
            return None  # nothing measured yet, or the confirmation's to judge
        missing = self.missing_pairs(key)
        windows = 2 * first_pairs(self.cal.pairs) * self.cal.window_s
        # before a pair ran: its two workers, each started and its arm built and settled as the calibration's was
        first = 2 * self.noise.start_s if self.noise is not None and self.noise.start_s else self.pool.start_s
        pair_s = self._pair_s or first + windows
        need = missing * pair_s if missing else (0.0 if self.pool.env_alive(key) else self.pool.start_s)
        left = deadline - time.monotonic()
        if need <= left:
            return None
        what = f"{missing} process pair(s)" if missing else "its worker's start"
        return f"not started: another environment needs {what}, about {need:.0f} s; {max(0.0, left):.0f} s were left"

    def _factor(self, key: str, params: dict[str, Any], trial: LiveTrial, deadline: float, *,
                grow: bool = False) -> stats.Interval:
        """Its environment's defaults / the defaults, from fresh process pairs (``across_processes``, one pair at a
        time), pooled over the candidates of that environment. In ``begin``: the fewest pairs (``least``),
        or in a confirmation round that round's own (``_round_factor``); each later round of the candidate's
        race adds one (``grow``, from ``more``) until the factor is ``enough`` (``process_pair.enough``),
        from then on cached, so a candidate the race stops after its first round costs ``least`` pairs.
        Never past the trial's deadline: a factor cut short for time keeps its pairs for the next candidate
        of it. Where no worker of the environment runs, the last pair's environment side is kept as its
        worker (``WorkerPool.keep``): one worker start saved."""
        if key in self.hopeless:  # its first steps were far slower in an earlier trial: no candidate of it can win
            raise HopelessEnvironment(self.hopeless[key].slower, self.hopeless[key].status, earlier=True)
        if self._confirming:
            return self._round_factor(key, params, trial)
        ratios = list(self.factor_ratios.get(key, []))
        least, most = self.process_pairs
        if key in self.factors:
            return self.factors[key]
        target = len(ratios) + 1 if grow else max(least, len(ratios))
        self.pool.set_all_aside()  # the process pairs are timed alone
        before, spent = len(ratios), 0.0
        while len(ratios) < target:
            started = time.monotonic()
            new = len(ratios) - before
            cost = spent / new if new else (self._pair_s if grow else 0.0)
            if cost and deadline - started < 1.5 * cost:
                if len(ratios) < least:
                    trial.warnings.append(CUT_FACTOR.format(len(ratios)))
                break
            ratios.append(self._process_pair(key, params, trial, last=len(ratios) + 1 == target,
                                             seed=trial.seed + len(ratios)))
            spent += time.monotonic() - started
            self.factor_ratios[key] = list(ratios)
        interval = stats.log_mean_interval(ratios) if ratios else NOTHING
        if ratios and enough(ratios, self.cal.half_width, most=most):  # settled by its pilot's spread
            self.factors[key] = interval
        return interval

    def _process_pair(self, key: str, params: dict[str, Any], trial: LiveTrial, *, last: bool, seed: int) -> float:
        """One fresh process pair of ``params``' environment against the defaults: its ratio. ``last``: where no
        worker of the environment runs, its side is kept as that worker (``WorkerPool.keep``). An environment
        whose first steps are far slower than the defaults' (``HopelessEnvironment``) is remembered: every later
        candidate of it is stopped at once."""
        started = time.monotonic()
        self.on_phase("starting", f"process pair {len(self.factor_ratios.get(key, [])) + 1}: "
                      + ", ".join(environment_differences(self.defaults, params)))
        try:
            run, _, kept = process_pair(
                self.workload, self.defaults, environment_defaults(params, self.defaults), self.facts, self.settings,
                pairs=first_pairs(self.cal.pairs), window_s=self.cal.window_s, seed=seed,
                keep=last and not self.pool.env_alive(key), reference_s=self.cal.s_per_sample)
        except HopelessEnvironment as e:
            self.hopeless[key] = e
            trial.startup_s += time.monotonic() - started
            raise
        if kept is not None:
            self.pool.keep(key, kept)
        timed = sum(p.base.elapsed_s + p.cand.elapsed_s for p in run.pairs)
        trial.timed_s += timed
        trial.startup_s += time.monotonic() - started - timed
        self._pair_s = time.monotonic() - started
        return run.ratio.median

    def _round_factor(self, key: str, params: dict[str, Any], trial: LiveTrial) -> stats.Interval:
        """A confirmation round's factor for ``key``: one fresh process pair of this round (``round_factor``), run
        whenever the confirmation admitted the round (``_too_short``)."""
        if key not in self._round_factors:
            self.pool.set_all_aside()
            earlier = self.factor_ratios.get(key, [])
            ratio = self._process_pair(key, params, trial, last=True, seed=trial.seed + 7 * len(earlier))
            self._round_factors[key] = round_factor(ratio, earlier, self.factors.get(key))
        return self._round_factors[key]

    def user_pair(self, params: dict[str, Any], seed: int, timeout_s: float) -> RunPair:
        """One pair of your runs (``measure.runs``): a fresh trial process of the defaults and one of the recipe
        ``params``, each alone as ``autotune run`` starts your training (``trial.runner.run_trial``: the recipe's
        environment, ``apply()`` inside, one model, the heap as a plain process has it), one after the other in an
        order drawn from ``seed``, within ``timeout_s``. The search's own workers are ended first: your run has the
        machine to itself."""
        from ..trial.runner import run_trial

        self.pool.close()
        deadline = time.monotonic() + timeout_s

        def alone(side: str) -> tuple[float, float]:
            left, whose = deadline - time.monotonic(), "the defaults'" if side == "base" else "the recipe's"
            if left <= 0.0:
                raise PairFailed(f"no time left for {whose} run")
            run = run_trial(self.workload, self.defaults if side == "base" else params, self.facts, self.settings,
                            timeout_s=left)
            if run.status != Status.OK or not run.samples_per_s:
                raise PairFailed(f"{whose} run: {run.status}: {run.error}")
            return run.samples_per_s, run.timed_s or 0.0
        return sequential(seed, alone)
