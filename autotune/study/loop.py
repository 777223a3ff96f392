"""The ask-measure-tell loop of a search: the race, the budget, known out-of-memory batches, Ctrl-C.

Every value told to Optuna is a speedup over PyTorch's defaults, measured in pairs of windows
(``autotune.measure.PairedMeasurer``; live: ``autotune.measure.LiveMeasurer``). The baseline
trial IS the noise calibration: the defaults against themselves (objective 1.0, the A/A's interval, its
loss the quality guard's baseline), recorded in the study (``StudyAttr.MEASURE``, ``StudyAttr.NOISE``). A
measurer sees it as ``calibrate``, then ``begin(defaults)`` and ``end`` with no ``more`` between: its result
is the A/A's (a replayed grid answers the same way).
Each candidate then RACES the incumbent (the best feasible median so far): a first round of
``max(4, noise.pairs // 2)`` pairs, more rounds while it may still beat the incumbent and its interval is wider
than the noise's half width, at most ``3 x noise.pairs``; it stops early when it is slower than the defaults with
confidence or its interval lies below the incumbent's or above it, at a look whose interval reached the confidence
it asked (``race.Race``). A stopped candidate is COMPLETE with its median (the sampler learns from it) and says why
it stopped (``Attr.RACE``). What a measured trial is (guard, knobs in effect, infeasible) is ``verdict``'s.

Each trial is asked, measured and told while this host's trial lock is held
(``autotune.trial.lock.host_lock``): a worker waiting for the lock holds no RUNNING trial whose
heartbeat would go stale; a thread records the heartbeat while the trial is measured (``liveness``).
"""
from __future__ import annotations

import logging
import math
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from .. import search_spaces as spaces
from ..errors import TrialError
from ..measure import Interval, Noise, PairedMeasurer, environment_key, own_copies, race_round_s
from ..trial.lock import LockBusy, host_lock
from ..trial.spec import Status, TrialResult
from . import limits, oom_limits, reserve, verdict
from .budget import Budget
from .events import Phase, Progress, TrialStarted
from .guard import Guard, below_defaults
from .liveness import claim, fail_orphans, heartbeat
from .race import NO_PAIRS, SLOWER, Race
from .records import (
    BASELINE,
    CONFIRM,
    MEASURED,
    PAIRED,
    SEARCH,
    Attr,
    StudyAttr,
    enqueued,
    environment_factors,
    records,
)
from .seeds import Seed, enqueue_next_seed
from .skips import not_started
from .turns import Turns, fresh_processes

if TYPE_CHECKING:
    import optuna

    from ..probes import Facts
    from .options import SearchOptions

log = logging.getLogger(__name__)

MAX_SKIPS = 25  # consecutive samples of batch sizes known to run out of memory, measured recipes, or not started


class SearchLoop:
    """Runs trials until the budget, the trial count or the space runs out; records each at once."""

    def __init__(
        self, study: optuna.Study, workload: str, facts: Facts, ctx: spaces.SpaceContext,
        run_settings: dict[str, Any], options: SearchOptions, budget: Budget, notify: Progress,
        seeds: list[Seed] | None = None, measurer: PairedMeasurer | None = None, outside_sampler: bool = False,
    ) -> None:
        self.study, self.workload, self.facts, self.ctx = study, workload, facts, ctx
        self.run_settings, self.options, self.budget, self.notify = run_settings, options, budget, notify
        self.defaults = {**spaces.defaults(facts, ctx), **run_settings}  # the baseline's params
        self.current: int | None = None  # the trial being measured, for the phase events
        # Ctrl-C or SIGTERM in your runs: the recipe is stored first (``claim._pairs``), then it is raised
        self.interrupted: KeyboardInterrupt | None = None
        if measurer is None:
            from ..measure import LiveMeasurer

            measurer = LiveMeasurer(workload, self.defaults, facts, options.settings, seed=options.seed,
                                    on_phase=self.phase, busy=options.busy_limit)
        self.measurer = measurer
        if not measurer.user_processes:  # no claim about your runs: no time kept for it (``reserve.claim_s``)
            self.options = options = replace(options, claim_pairs=0)
        self.guard = Guard(study, options, measurer, budget, options.settings.seed, self.phase)
        self.noise: Noise | None = None
        self.baseline_error: str | None = None
        self.turns = Turns(study, facts, ctx, self.options, budget, self.defaults, seeds or [], measurer,
                           run_settings, notify, outside_sampler)  # which trial goes next, and when
        # the calibration's end (and the baseline's), on the budget's clock and the wall clock (``searching``)
        self.searching_from: tuple[float, float] | None = None

    def phase(self, name: str, detail: str = "") -> None:
        """What the measurement is doing now (``events.Phase``), for the live display."""
        self.notify(Phase(name, self.current, detail))

    def timeout_s(self, params: dict[str, Any], remaining: float, estimate: float | None) -> float:
        """The trial's time limit (``limits.timeout_s``)."""
        return limits.timeout_s(self.study, self.options, params, remaining, estimate)

    def reserve_s(self, estimate: float | None) -> float:
        """Time kept for the confirmation (``reserve.reserve_s``), the rounds the time left holds."""
        return reserve.reserve_s(self.study, self.options, estimate, left=self.budget.left())

    def measured(self) -> int:
        """Trials of the study (every worker's, every run's) that count toward ``--trials``."""
        return sum(1 for t in self.study.get_trials(deepcopy=False)
                   if t.user_attrs.get(Attr.ROLE) != CONFIRM and t.user_attrs.get(Attr.STATUS) in MEASURED)

    def run(self) -> str:
        """Returns why it stopped: ``budget``, ``trials``, ``space`` or ``baseline failed``."""
        skips = 0
        while True:
            if self.options.trials is not None and self.measured() >= self.options.trials:
                return "trials"
            if self.budget.left() <= 1:
                return "budget"
            try:
                with host_lock(wait_s=self.budget.left()):
                    if self.options.trials is not None and self.measured() >= self.options.trials:
                        return "trials"  # reached by another worker while this one waited for the lock
                    if not self.calibrated():
                        return "baseline failed"
                    self.prepare()  # before the next trial's estimate: an environment's seed may be due
                    remaining, estimate = self.budget.left(), self.turns.next_estimate_s()
                    available = remaining - self.reserve_s(estimate) if estimate is not None else remaining
                    if remaining <= 1 or (estimate is not None and available < estimate
                                          and not self.turns.fill(available)):
                        self._no_candidate(remaining, estimate)
                        return "budget"
                    stopped, skips, result, role = self._next(skips, estimate)
            except LockBusy as e:  # another search holds it (one stopped with Ctrl-Z, say): the budget ends here
                log.warning("%s: this search ends by its budget", e)
                return "budget"
            if stopped:
                return stopped
            if role == BASELINE and result is not None and result.status != Status.OK:
                self.baseline_error = f"{result.status}: {result.error}"
                return "baseline failed"

    def _no_candidate(self, remaining: float, estimate: float | None) -> None:
        """Say so where the budget ends before the first candidate: the recipe can only keep the defaults."""
        if self.measured() > 1 or not _has_baseline(self.study):
            return
        needs = f"; a candidate needs about {estimate:.0f} s here" if estimate is not None else ""
        log.warning("the budget ends before any candidate is measured: %.0f s left%s: a longer --budget measures "
                    "candidates", max(0.0, remaining), needs)

    def calibrated(self) -> bool:
        """A continued study has its baseline: this search's workers still need the A/A (not a trial)."""
        if self.noise is not None or not _has_baseline(self.study):
            return True
        try:
            self.calibrate(self.budget.left())
        except TrialError as e:
            self.baseline_error = f"the calibration failed: {e}"
            return False
        return True

    def calibrate(self, timeout_s: float) -> Noise:
        """The A/A of the defaults: this machine's noise, recorded in the study (``StudyAttr.NOISE``). The
        environment factors the study's trials recorded are handed to the measurer: a continued search does
        not measure them again."""
        self.noise = self.measurer.calibrate(max(1.0, timeout_s))
        self.searching_from = self.budget.now(), self.budget.wall()
        self.study.set_user_attr(StudyAttr.NOISE, asdict(self.noise))
        factors = self._factors()
        for key, factor in environment_factors(self.study).items():
            factors.setdefault(key, factor)
        return self.noise

    def searching(self, until: float) -> tuple[float, float] | None:
        """The seconds from the calibration's end (the baseline's, its loss included) to ``until`` (the
        confirmation's start, on the budget's clock) and how many of them were candidates' timed windows: every
        candidate begun since, another worker's too (a worker waits for the host lock while another measures);
        None where this search calibrated nothing."""
        if self.searching_from is None:
            return None
        since, wall = self.searching_from
        timed = sum(t.user_attrs.get(Attr.TIMED_S) or 0.0 for t in self.study.get_trials(deepcopy=False)
                    if t.user_attrs.get(Attr.ROLE) not in (BASELINE, CONFIRM)
                    and (t.user_attrs.get(Attr.RUN_STARTED) or 0.0) >= wall)
        return max(0.0, until - since), timed

    def _follow_noise(self) -> None:
        """A measurer that sizes its rounds from what its trials measured (script mode's) changed its noise: the
        budget and the confirmation read the new one (``Noise.round_pairs``)."""
        noise = self.measurer.noise
        if noise is not None and self.noise is not None and noise != self.noise:
            self.noise = noise
            self.study.set_user_attr(StudyAttr.NOISE, asdict(noise))

    def _factors(self) -> dict[str, Interval]:
        """The measurer's environment factors by environment, where it keeps them (``PairedMeasurer.factors``); else
        none."""
        return self.measurer.factors if self.measurer.keeps_factors else {}

    def prepare(self) -> None:
        """Before the next trial is chosen (the host lock held): the trials of a search killed elsewhere failed
        (heartbeat, orphans), so their seeds are free again, then the seeds the measured trials call for and an
        environment's seed that is due (``Turns.ready_next``)."""
        import optuna

        optuna.storages.fail_stale_trials(self.study)
        fail_orphans(self.study)
        self.turns.ready_next()

    def _next(self, skips: int, estimate: float | None) -> tuple[str | None, int, TrialResult | None, str]:
        """Ask the next trial (after ``prepare``) and measure it (the host lock held); a batch size known to run out of
        memory is skipped, so is a precision ruled out by the kernels or by this search (``skips.not_started``), a
        sampled recipe measured before (``verdict.measured_before``), and params no search here asks (``_refused``).
        Returns why to stop (or None), the consecutive skips, the result and the trial's role."""
        if not self.turns.waiting() and self.turns.sampled_turn():
            # Where every trial starts processes (script mode) an in-process trial is no cheaper: Optuna samples the
            # environment too (role ``search``); fixed to the defaults', script mode's samples never changed threads.
            if not fresh_processes(self.measurer):
                self.turns.enqueue_in_process()
        # the combination before the seeds left where its environment's gain was measured: a seed is a guess
        elif not self.turns.enqueue_ahead() and not enqueue_next_seed(self.study, self.turns.seeds) \
                and not self.turns.enqueue_combined() and self.turns.in_process_turn():
            self.turns.enqueue_in_process()
        trial = self.study.ask()
        role = trial.user_attrs.get(Attr.ROLE, SEARCH)
        try:
            params, known = self.turns.asked(spaces.suggest(trial, self.facts, self.ctx)), None
        except ValueError as e:  # Optuna's check of a value enqueued by another hand that the space cannot hold
            if not enqueued(self.study, trial):
                raise
            params, known = {}, f"not run: {e}"
        claim(trial, role, params)
        known = known or self._refused(params)
        known = known or oom_limits.known_oom(self.study.user_attrs.get(StudyAttr.OOM_LIMITS), params)
        known = known or not_started(self.study, role, params, self.options.fixed, self.defaults)
        same = None if known else verdict.measured_before(self.study, params, role)
        if known or same is not None:
            self._not_run(trial, Status.SKIPPED if known else Status.DUPLICATE,
                          known or f"the same recipe as trial {same}, whose measurement stands")
            self.turns.duplicates = self.turns.duplicates + 1 if same is not None else 0
            return ("space" if skips + 1 >= MAX_SKIPS else None), skips + 1, None, role
        self.turns.duplicates = 0
        remaining = self.budget.left()  # the lock may have been waited for
        timeout = max(1.0, min(remaining, self.timeout_s(params, remaining, estimate)))
        own = limits.own_limit_s(self.study, self.options, params, estimate)
        result = self.run_one(trial, role, params, timeout, own_s=own)
        if result.status == Status.SKIPPED:  # the measurer did not start it: its processes would outlast the time
            return ("budget" if skips + 1 >= MAX_SKIPS else None), skips + 1, result, role
        return None, 0, result, role

    def _refused(self, params: dict[str, Any]) -> str | None:
        """Why this search does not measure ``params`` (``search_spaces.refused``: a shared study's trial of another
        hand), None for params its space could have asked."""
        refused = spaces.refused(params, self.facts)
        return f"not run: {'; '.join(refused)}" if refused else None

    def _not_run(self, trial: optuna.Trial, status: Status, why: str) -> None:
        """Record ``trial`` as not run (``status``: skipped or a duplicate) and tell it PRUNED."""
        import optuna

        trial.set_user_attr(Attr.STATUS, str(status))
        trial.set_user_attr(Attr.ERROR, why)
        self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)

    def run_one(self, trial: optuna.Trial, role: str, params: dict[str, Any], timeout: float,
                own_s: float | None = None) -> TrialResult:
        """Measure a claimed trial (the host lock held) and record it; Ctrl-C records it interrupted. ``own_s``: its
        own limit, where ``timeout`` may be the budget's: a timeout short of it is cut, not the candidate's
        (``limits.judged``). Params no search here asks (a stored trial's, confirmed) are recorded not run."""
        if refused := self._refused(params):
            self._not_run(trial, Status.SKIPPED, refused)
            return TrialResult(Status.SKIPPED, error=refused)
        self.notify(TrialStarted(trial.number, role, params))
        self.current = trial.number
        trial.set_user_attr(Attr.RUN_STARTED, self.budget.wall())  # wall clock: comparable between workers
        try:
            with heartbeat(self.study, trial):
                result, why = self._measure(role, params, self.budget.now() + timeout,
                                            bool(trial.user_attrs.get(Attr.AHEAD)))
            if own_s is not None:
                result = limits.judged(result, timeout, own_s)
        except KeyboardInterrupt:
            trial.set_user_attr(Attr.RUN_ENDED, self.budget.wall())
            self.record(trial, role, params, TrialResult(Status.INTERRUPTED, error="stopped by Ctrl-C"))
            raise
        trial.set_user_attr(Attr.RUN_ENDED, self.budget.wall())
        if why:
            trial.set_user_attr(Attr.RACE, why)
        factor = self._factors().get(environment_key(params))
        if factor is not None and environment_key(params) != environment_key(self.defaults):
            trial.set_user_attr(Attr.ENVIRONMENT_FACTOR, factor.to_dict())  # a resumed search reuses it
        self.record(trial, role, params, result)
        return result

    def _measure(self, role: str, params: dict[str, Any], deadline: float,
                 ahead: bool = False) -> tuple[TrialResult, str | None]:
        """The baseline: the calibration; a confirmation: a fixed number of fresh pairs; others race (``_race``)."""
        started, before = self.budget.now(), self._process_pairs(params)
        if role == BASELINE:
            try:
                self.study.set_user_attr(StudyAttr.MEASURE, PAIRED)
                self.calibrate(self.budget.left(deadline))
            except TrialError as e:
                return TrialResult(Status.CRASH, error=f"the calibration failed: {e}"), None
        noise = self.noise
        if noise is None:
            return TrialResult(Status.CRASH, error="no calibration: the baseline did not complete"), None
        handle = self.measurer.begin(params, max(1.0, self.budget.left(deadline)))
        if isinstance(handle, TrialResult):
            return handle, None
        if role == BASELINE:
            return self.measurer.end(handle), None
        if role == CONFIRM:
            pairs = reserve.confirmation_pairs(noise, self.options)
            self.phase("confirming", f"{pairs // noise.pairs} fresh process pairs of {noise.pairs} window pairs"
                       if noise.round_pairs else f"{pairs} fresh pairs in fresh processes")
            return self.measurer.confirm(handle, pairs, max(1.0, self.budget.left(deadline))), None
        return self._race(handle, noise, deadline, params, started, before, role, ahead)

    def _process_pairs(self, params: dict[str, Any]) -> int:
        """The fresh process pairs the measurer ran of ``params``' environment so far (``factor_ratios``)."""
        return len(self.measurer.factor_ratios.get(environment_key(params), ()))

    def _race(self, handle: object, noise: Noise, deadline: float, params: dict[str, Any],
              started: float, before: int, role: str, ahead: bool = False) -> tuple[TrialResult, str | None]:
        """More pairs while the candidate may beat the incumbent and its interval is wide (``race_stop``), never
        into the time its own confirmation will need (``reserve.reserve_s``'s ``racing``: priced from its time since
        ``started`` and the process pairs of its environment run since, beyond the ``before`` held then), nor, for
        an environment's seed, into what its plan counted after it (``Turns.following``: its combination's look and
        rounds, the look of the seed that goes before it), nor, ``ahead`` of a seed's turn, into that seed's
        (``Turns.displaced``)."""
        race = Race(noise, verdict.incumbent(self.study))
        used, why = 0, None
        then, looks_s = self.turns.following(params, role)
        seed, seed_s = self.turns.displaced(bool(then)) if ahead else ([], 0.0)
        kept = {(False, False): "the time its confirmation needs is kept",
                (False, True): "the time its confirmation and its combination need is kept",
                (True, False): "the time its confirmation and the seed it went ahead of need is kept",
                (True, True): "the time its confirmation, the seed it went ahead of and its combination need is kept"}[
            (bool(seed), bool(then))]
        then, looks_s = [*seed, *then], looks_s + seed_s
        counted = 0  # the pairs the measurer's interval holds (a look that adds none ends the race: ``NO_PAIRS``)
        while why is None:
            n = race.pairs(used)
            now, limit = self.budget.now(), deadline
            if used:
                limit = min(deadline, self.budget.deadline - looks_s - reserve.racing_reserve_s(
                    self.study, self.options, params, self.measurer.method(handle, params), wall_s=now - started,
                    timed_s=2 * used * noise.window_s, pairs=self._process_pairs(params) - before,
                    measured=self.measurer.so_far(handle), then=then, left=self.budget.deadline - now - looks_s))
            if used and limit - now < race_round_s(n, noise.window_s):
                why = "the trial's time ran out" if limit == deadline else kept
                break
            left = limit - now
            interval = self.measurer.more(handle, n, max(1.0, left), confidence=race.confidence)
            used, grew, counted = used + n, interval.count > counted, interval.count
            why = (self._over_guard(handle, params) or self._not_in_effect(handle, params)
                   or race.stop(interval, used) or (None if grew else NO_PAIRS))
            if self.guard.interrupted is not None:  # Ctrl-C in its second look: the trial is recorded interrupted
                raise self.guard.interrupted
        # it cannot be the recipe (wholly below the defaults, said or not at the race's confidence: the guard needs
        # no loss of it, ``Guard.of_result``): no training to the guard's samples
        if why == SLOWER or (interval.count and below_defaults(interval.high, noise)):
            self.measurer.skip_loss(handle)
        return self.measurer.end(handle), why

    def _over_guard(self, handle: object, params: dict[str, Any]) -> str | None:
        """Why the quality guard will reject the candidate, once its loss is known (a measurer's ``loss``), or
        None: it cannot be the recipe, so no more pairs."""
        loss = self.measurer.loss(handle)
        if loss is None or not math.isfinite(loss):
            return None
        return self.guard.verdict(params, loss, self.measurer.loss_source(handle))[1]

    def _not_in_effect(self, handle: object, params: dict[str, Any]) -> str | None:
        """The knobs the candidate's process reports not in effect (a measurer's ``in_effect``), or None: it
        measures another recipe than its own and is rejected as such (``verdict``), so no more pairs."""
        in_effect = self.measurer.in_effect(handle)
        return "; ".join(spaces.not_in_effect(params, in_effect or {})) or None

    def record(self, trial: optuna.Trial, role: str, params: dict[str, Any], result: TrialResult) -> None:
        """Store the trial's result and constraints and tell Optuna its value (or state)."""
        self._follow_noise()
        if role == BASELINE:  # its loss, evaluated after the calibration, is not the search's time
            self.searching_from = self.budget.now(), self.budget.wall()
        guarded = None if role == BASELINE else self.guard.of_result(params, result, self.noise)
        if self.guard.interrupted is not None:  # its second look stopped: not judged, measured again by the next search
            result, guarded = TrialResult(Status.INTERRUPTED, error="stopped by Ctrl-C"), None
        if role == CONFIRM and result.status == Status.OK and result.loss is None and own_copies(result):
            guarded = (0.0, None, None)  # script mode's rounds re-measure speed alone: quality was its trial's
        verdict.record(self.study, self.facts, self.options, trial, role, params, result, self.notify, guarded)
        if self.guard.interrupted is not None:  # recorded: the search stops as the interrupt asked
            raise self.guard.interrupted


def _has_baseline(study: optuna.Study) -> bool:
    return any(r.role == BASELINE and r.result.status == Status.OK for r in records(study))


__all__ = ["MAX_SKIPS", "SearchLoop"]
