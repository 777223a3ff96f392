"""Environment factors of the live measurer (``LiveMeasurer`` holds an ``EnvironmentFactors``): an environment's
defaults against the search's defaults, in fresh process pairs (``process_pair``), pooled over the candidates of
that environment until ``enough``, one pair of its own in each confirmation round."""
from __future__ import annotations

import re
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .. import stats
from ..environment import environment_defaults, environment_differences
from ..measurer import Noise, first_pairs
from .candidate import NOTHING, LiveTrial, round_factor
from .paired_worker import Calibration, calibrated
from .process_pair import HopelessEnvironment, enough, process_pair

if TYPE_CHECKING:
    from ...probes import Facts
    from ...trial.spec import TrialSettings
    from .pool import PhaseHook, WorkerPool

# Past the trial's deadline, a process pair that began in time finishes (its pair is kept for the next candidate):
# twice a pair's time, once one ran, else this long; only a worker that hangs is stopped there.
HUNG_AFTER_S = 30.0


CUT_FACTOR = "environment factor from {} process pair(s): time ran out"  # a trial's warning, read by ``cut_pairs``
_CUT = re.compile(r"environment factor from (\d+) process pair")


def cut_pairs(warnings: Iterable[str]) -> list[int]:
    """The process pairs of each environment factor a trial's ``warnings`` say was cut short for time
    (``CUT_FACTOR``)."""
    return [int(m.group(1)) for w in warnings if (m := _CUT.search(w))]


class EnvironmentFactors:
    """Each environment's factor (``factors``: environment key -> its factor; ``factor_ratios``: environment key ->
    one ratio per process pair run; both the measurer's, which the search reads) and how it is measured; the
    ``LiveMeasurer`` that holds it lends its workers (``pool``) and, with each call, its calibration."""

    def __init__(self, workload: str, defaults: dict[str, Any], facts: Facts, settings: TrialSettings,
                 pool: WorkerPool, process_pairs: tuple[int, int], on_phase: PhaseHook,
                 factors: dict[str, stats.Interval], factor_ratios: dict[str, list[float]]) -> None:
        self.workload, self.defaults, self.facts, self.settings = workload, defaults, facts, settings
        self.pool, self.process_pairs, self.on_phase = pool, process_pairs, on_phase
        self.factors, self.factor_ratios = factors, factor_ratios
        self.confirming = False  # after ``confirmation_round``: each round's factors are its own process pairs
        self._round_factors: dict[str, stats.Interval] = {}  # this confirmation round's, by environment key
        self._pair_s = 0.0  # the last process pair's wall time
        self.hopeless: dict[str, HopelessEnvironment] = {}  # environment key -> how its first steps gave up

    def confirmation_round(self) -> None:
        """From now on each confirmation round measures factors of its own (``_round_factor``)."""
        self.confirming, self._round_factors = True, {}

    def missing_pairs(self, key: str) -> int:
        """How many of its fewest process pairs environment ``key``'s factor still lacks. At 0 a candidate's
        ``begin`` adds none (while it is not ``enough``, a later round of its race adds one where the trial's time
        holds it): waiting for it to settle priced the fastest environment's combination, an arm in its live
        worker, as a trial that starts processes, and near a short search's end it no longer fitted."""
        return 0 if key in self.factors else max(0, self.process_pairs[0] - len(self.factor_ratios.get(key, ())))

    def too_short(self, key: str, deadline: float, cal: Calibration | None, noise: Noise | None) -> str | None:
        """Why a candidate of another environment is not started: its process pairs (the last one's worker is kept
        for its arms) or its worker's start would outlast ``deadline``, from the starts and pairs measured so far;
        None when it may finish, or before the calibration (``cal``, its ``noise``). A confirmation round is admitted
        by the confirmation's own estimate (``reserve.rounds_s``, which also sized the time kept for it): judged here
        again by another estimate, the last round of a tight budget was skipped, its gain left unconfirmed."""
        if not self.pool.start_s or cal is None or self.confirming:
            return None  # nothing measured yet, or the confirmation's to judge
        missing = self.missing_pairs(key)
        windows = 2 * first_pairs(cal.pairs) * cal.window_s
        # before a pair ran: its two workers, each started and its arm built and settled as the calibration's was
        first = 2 * noise.start_s if noise is not None and noise.start_s else self.pool.start_s
        pair_s = self._pair_s or first + windows
        need = missing * pair_s if missing else (0.0 if self.pool.env_alive(key) else self.pool.start_s)
        left = deadline - time.monotonic()
        if need <= left:
            return None
        what = f"{missing} process pair(s)" if missing else "its worker's start"
        return f"not started: another environment needs {what}, about {need:.0f} s; {max(0.0, left):.0f} s were left"

    def factor(self, key: str, params: dict[str, Any], trial: LiveTrial, deadline: float, cal: Calibration | None, *,
               grow: bool = False) -> stats.Interval:
        """Its environment's defaults / the defaults, from fresh process pairs (``across_processes``, one pair at a
        time), pooled over the candidates of that environment. In ``begin``: the fewest pairs (``least``),
        or in a confirmation round that round's own (``_round_factor``); each later round of the candidate's
        race adds one (``grow``, from ``more``) until the factor is ``enough`` (``process_pair.enough``),
        from then on cached, so a candidate the race stops after its first round costs ``least`` pairs.
        Never past the trial's deadline: a factor cut short for time keeps its pairs for the next candidate
        of it. Where no worker of the environment runs, the last pair's environment side is kept as its
        worker (``WorkerPool.keep``): one worker start saved. ``cal``: the measurer's calibration (the pairs' windows,
        the pilot spread that tells ``enough``; None before it, an error where a pair needs it)."""
        if key in self.hopeless:  # its first steps were far slower in an earlier trial: no candidate of it can win
            raise HopelessEnvironment(self.hopeless[key].slower, self.hopeless[key].status, earlier=True)
        if self.confirming:
            return self._round_factor(key, params, trial, calibrated(cal))
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
            ratios.append(self._process_pair(key, params, trial, calibrated(cal), last=len(ratios) + 1 == target,
                                             seed=trial.seed + len(ratios)))
            spent += time.monotonic() - started
            self.factor_ratios[key] = list(ratios)
        interval = stats.log_mean_interval(ratios) if ratios else NOTHING
        if ratios and enough(ratios, calibrated(cal).half_width, most=most):  # settled by its pilot's spread
            self.factors[key] = interval
        return interval

    def _process_pair(self, key: str, params: dict[str, Any], trial: LiveTrial, cal: Calibration, *, last: bool,
                      seed: int) -> float:
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
                pairs=first_pairs(cal.pairs), window_s=cal.window_s, seed=seed,
                keep=last and not self.pool.env_alive(key), reference_s=cal.s_per_sample,
                deadline=trial.deadline + (2 * self._pair_s if self._pair_s else HUNG_AFTER_S))
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

    def _round_factor(self, key: str, params: dict[str, Any], trial: LiveTrial, cal: Calibration) -> stats.Interval:
        """A confirmation round's factor for ``key``: one fresh process pair of this round (``round_factor``), run
        whenever the confirmation admitted the round (``too_short``)."""
        if key not in self._round_factors:
            self.pool.set_all_aside()
            earlier = self.factor_ratios.get(key, [])
            ratio = self._process_pair(key, params, trial, cal, last=True, seed=trial.seed + 7 * len(earlier))
            self._round_factors[key] = round_factor(ratio, earlier, self.factors.get(key))
        return self._round_factors[key]
