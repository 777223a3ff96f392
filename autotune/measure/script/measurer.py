"""Script mode's measuring engine: ``ScriptMeasurer``, the ``PairedMeasurer`` of ``autotune search -- python train.py``.

Every recipe of a script is a whole process of it, so every comparison is across processes: a candidate is measured
against the defaults over fresh pairs of live copies (``copies.ScriptRun``), each warmed up untimed, then pairs of
windows with the idle copy frozen. A process pair gives one ratio, its windows' median; two identical processes differ
by a factor that lasts their life, so a candidate's interval is the Student-t interval of the logarithms of its process
pairs' ratios, from ``LEAST_PAIRS`` of them on, their spread pooled with the A/A's and the earlier recipes' process
pairs (``stats.pooled_log_mean_interval``: two pairs alone have one degree of freedom). The calibration is the same with
the defaults on both sides (the A/A); its spreads size every later process pair's windows and a confirmation round's
process pairs (``sizing``). A copy that crashes, exits, hangs or never tells a step is the trial's failure, with its
reason; the search goes on.
"""
from __future__ import annotations

import logging
import math
import os
import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...probes import Facts
from ...trial.spec import Status, TrialResult
from .. import sizing, stats
from ..measurer import Noise, PairedMeasurer
from ..runs import WINDOW_PAIRS, RunPair
from ..sizing import LEAST_PAIRS
from . import results
from .copies import WARMUP_STEPS, ScriptRun, alone_pair, copy_plan, failure, start_together, step_s, window_pairs
from .resident import TIME_RAN_OUT, ResidentCopy, fresh_loss, loss_copy_s
from .results import SAME_ARITHMETIC, ScriptTrial, copy_method, failure_status, loss_fields, script_method

log = logging.getLogger(__name__)

CALIBRATION_PAIRS = 3  # process pairs of the A/A, of ``sizing.WINDOWS`` window pairs each
WINDOW_STEPS = 8  # a window holds at least this many of the defaults' steps
MIN_WINDOW_S = 0.5  # 0.3-s windows of the CNN script read identical copies up to 30% apart
STALL_S = 10.0  # a window in which a copy tells no step this long (or 20 windows' time) ends: the copy is hung
MIN_START_S = 20.0  # a copy's start-up and warm-up limit: at least this, else 4x the defaults'


class ScriptMeasurer(PairedMeasurer):
    """The ``PairedMeasurer`` of script mode (see the module docstring): every trial starts its copies but an
    in-place candidate measured in the long-lived copy (``resident``: then not ``fresh_processes``), and a script's
    FLOP are not counted, so no share of the machine's peak is told (``machine_limits``); ``factor_ratios`` holds
    each measured recipe's process pairs' ratios (the A/A's too: how a ratio varies between fresh processes).
    ``folder`` holds each copy's folder; ``min_window_s`` is the shortest window, ``start_limit_s`` a copy's limit
    to its warm-up's end (default: 4x the first copy's ``startup_s``, at
    least ``MIN_START_S``), ``stall_s`` the least a window waits for a step."""

    machine_limits = False
    user_processes = True

    def __init__(self, argv: list[str], defaults: dict[str, Any], facts: Facts, folder: Path, *, workload: str,
                 loss_samples: int, startup_s: float = 0.0, seed: int = 0, env: Mapping[str, str] | None = None,
                 on_phase: Callable[[str, str], None] | None = None, min_window_s: float = MIN_WINDOW_S,
                 start_limit_s: float | None = None, stall_s: float = STALL_S, resident: bool = True) -> None:
        PairedMeasurer.__init__(self, defaults)
        self.argv, self.facts, self.folder = argv, facts, folder
        self.workload, self.loss_samples = workload, loss_samples
        self.env = dict(os.environ if env is None else env)
        self.on_phase = on_phase or (lambda name, detail: None)
        self.rng = random.Random(seed)
        self.start_limit_s = start_limit_s or max(MIN_START_S, 4 * startup_s)
        self.min_window_s, self.stall_s = min_window_s, stall_s
        self.rounds = sizing.RoundShape(sizing.WINDOWS, LEAST_PAIRS, 0.0, 0.0)  # sized by the A/A, then each trial
        self.spread: sizing.Spread | None = None  # from the calibration on
        self.calibration: ScriptTrial | None = None
        self.step_s: float | None = None  # the defaults' optimizer step
        self._count = 0
        self._live: list[ScriptRun] = []
        self.failed_copies: list[Path] = []  # the folders of process pairs where a copy failed: their logs
        # candidates that differ in knobs a running copy can change are measured in one long-lived copy
        self.resident = ResidentCopy(lambda p: copy_plan(argv, p, facts, self.env, workload), dict(defaults),
                                     folder / "long-lived", self.rng) if resident else None
        self.confirming = False  # from the first confirmation round on: every round in fresh process pairs
        self.fresh_processes = not resident  # with the long-lived copy an in-place candidate starts none
        self.in_place_only = resident

    # PairedMeasurer ------------------------------------------------------------------------------------------
    def calibrate(self, timeout_s: float) -> Noise:
        """The defaults against themselves over ``CALIBRATION_PAIRS`` fresh process pairs: the window length (at
        least ``WINDOW_STEPS`` of their steps), the A/A interval and the margin. A copy that fails is a
        ``TrialError`` with its reason (the loop records the baseline as failed)."""
        from ...errors import TrialError

        started = time.monotonic()
        trial = ScriptTrial(dict(self.defaults), baseline=True, deadline=started + timeout_s)
        groups: list[list[float]] = []
        for _ in range(CALIBRATION_PAIRS):
            self.on_phase("calibrating noise", "the defaults against themselves, in fresh pairs of the script")
            groups.append([])
            why = self._process_pair(trial, self.defaults, sizing.WINDOWS, groups[-1])
            if why is not None:
                raise TrialError(why)
        aa = stats.log_mean_interval(trial.medians)
        self.factor_ratios["A/A"] = list(trial.medians)
        assert self.step_s is not None
        window_s, within = self._window_s(), [r for g in groups for r in g]
        wall_s = time.monotonic() - started
        pooled = stats.pooled_log_sd(groups)
        outside = max(0.0, wall_s - trial.timed_s - trial.once_s) / len(groups)  # each pair's, not the A/A's once
        # the spread's pair cost keeps the A/A's once-only time: half of it prices a copy of your runs alone
        # (``alone_s``), whose start is not overlapped with another's as a pair's two are
        self.spread = sizing.Spread(pooled[0] if pooled else 0.0, max(0.0, wall_s - trial.timed_s) / len(groups),
                                    trial.timed_s / max(1, len(within)))
        self.calibration = trial
        # Unlike arms in one process, fresh copies in a drawn order keep no placement: the A/A's width is noise
        self.noise = Noise(window_s, sizing.WINDOWS, 0.03, max(stats.MIN_MARGIN, abs(aa.median - 1.0)),
                           max(within) - min(within), (aa.median, aa.low, aa.high), timed_s=trial.timed_s,
                           wall_s=wall_s, within=max(abs(r - 1) for r in within), aa_pairs=len(within),
                           within_what="identical copies of the script in a process pair",
                           start_s=outside / 2,  # a copy's share of the time a pair takes outside windows
                           run_s=self.spread.alone_s(WINDOW_PAIRS))  # a copy of your runs (``claim_pair_s``)
        self._follow(self.spread.add(trial.medians, sizing.WINDOWS, aa=True))  # the noise's round, sized
        return self.noise

    def _follow(self, shape: sizing.RoundShape) -> None:
        """Later process pairs and rounds take ``shape`` (said where it changes), and so does the noise."""
        if (shape.windows, shape.pairs) != (self.rounds.windows, self.rounds.pairs):
            log.warning("the script's process pairs: %s", shape.note())
        self.rounds = shape
        if self.noise is not None:
            self.noise = replace(self.noise, pairs=shape.windows, round_pairs=shape.windows * shape.pairs)

    def begin(self, params: dict[str, Any], timeout_s: float) -> object | TrialResult:
        deadline = time.monotonic() + timeout_s
        trial = ScriptTrial(dict(params), baseline=params == self.defaults, deadline=deadline, loss_deadline=deadline,
                            skip_loss=self.confirming)  # a confirmation round's loss is nobody's
        if not trial.baseline and not self.confirming and self.resident and self.resident.can_measure(params):
            trial.in_copy = []
        return trial

    def reseed(self, seed: int) -> None:
        """A confirmation round: fresh process pairs, as your runs are; the long-lived copy is no longer needed."""
        self.confirming = True
        if self.resident is not None:
            self.resident.stop()

    def skip_loss(self, handle: object) -> None:
        self._trial(handle).skip_loss = True

    def more(self, handle: object, n: int, timeout_s: float, confidence: float = stats.CONFIDENCE) -> stats.Interval:
        """``n`` window pairs' worth of fresh process pairs (``rounds.windows`` each, ``LEAST_PAIRS`` at least in
        all): the interval over all of the candidate's process pairs so far."""
        trial = self._trial(handle)
        trial.deadline = min(trial.deadline, time.monotonic() + timeout_s)
        if trial.in_copy is not None and self.resident is not None and trial.failed is None:
            return self._more_in_copy(trial, self.resident, trial.in_copy, n, confidence)
        wanted = max(LEAST_PAIRS - len(trial.medians), math.ceil(n / self.rounds.windows))
        for _ in range(wanted):
            if trial.failed is not None or time.monotonic() >= trial.deadline:
                break
            why = self._process_pair(trial, trial.params, self.rounds.windows, [])
            if why is not None and trial.failed is None:
                trial.failed = TrialResult(failure_status(why), error=why)
        return self._interval(trial, confidence)

    def _more_in_copy(self, trial: ScriptTrial, copy: ResidentCopy, pairs: list[tuple[float, float]], n: int,
                      confidence: float) -> stats.Interval:
        """``n`` window pairs in the long-lived copy; where it cannot measure them, fresh process pairs instead."""
        starts, first = copy.run is None, 2 if not pairs and n > 2 else n  # its start; a first look of two pairs
        # its windows stop where its fresh copy for the loss, where it needs one, still fits in a look's limit
        loss_s = loss_copy_s(copy.startup_s, self.loss_samples, pairs) if self._fresh_loss_due(trial) else 0.0
        got, why = copy.window_pairs(trial.params, first, self._window_s(), trial.deadline - loss_s, self.stall_s)
        trial.startup_s += copy.startup_s if starts else 0.0
        trial.once_s += copy.startup_s if starts else 0.0  # the copy's start: the next candidate's trial pays none
        if why is not None and why != TIME_RAN_OUT:  # the copy cannot measure it: fresh process pairs instead
            if copy.failed == why:  # it ended: its log is kept
                self.failed_copies.append(copy.folder)
            trial.once_s, trial.timed_s = time.monotonic() - trial.started, 0.0  # the copy's time: no round's
            trial.in_copy, trial.fallback = None, why
            return self.more(trial, n, max(0.0, trial.deadline - time.monotonic()), confidence)
        looked, fastest = not pairs, max((c for _, c in got), default=0.0)
        pairs.extend(got)
        trial.timed_s += 2 * len(got) * self._window_s()  # its windows, each at least this long
        base = statistics.median(b for b, _ in pairs) if pairs else 0.0
        # far slower in its first look, even its fastest window: no more pairs, no loss; one stalled window alone is
        # no verdict
        slower = (results.far_slower(1 / max(fastest, 1e-12), 1 / base)
                  if looked and got and base > 0 else None)
        if slower is not None:
            trial.failed = results.hopeless_result(slower, in_copy=True)
            return self._interval(trial, confidence)  # none: the race ends, and later calls measure nothing
        if first < n and why is None:
            return self._more_in_copy(trial, copy, pairs, n - first, confidence)
        return stats.serial_median_interval([c / b for b, c in pairs], confidence) if pairs else \
            self._interval(trial, confidence)

    def _changed(self, params: dict[str, Any]) -> list[str]:
        """The knobs ``params`` sets otherwise than the defaults, in order."""
        return sorted(k for k in params if params.get(k) != self.defaults.get(k))

    def _fresh_loss_due(self, trial: ScriptTrial) -> bool:
        """Whether ``end`` takes the in-copy candidate's loss from a fresh copy: its arithmetic differs."""
        same = set(self._changed(trial.params)) <= set(SAME_ARITHMETIC) and self.calibration is not None
        return not trial.skip_loss and not same

    def _end_in_copy(self, trial: ScriptTrial, wall_s: float) -> TrialResult:
        """A candidate measured in the long-lived copy, its loss from a fresh copy where its arithmetic differs."""
        if not trial.in_copy:
            return TrialResult(Status.CRASH, error="no window measured in the long-lived copy", wall_s=wall_s)
        interval = stats.serial_median_interval([c / b for b, c in trial.in_copy])
        warnings, loss = [], None
        if self._fresh_loss_due(trial):
            self._count += 1
            plan = copy_plan(self.argv, trial.params, self.facts, self.env, self.workload)
            loss, start_s = fresh_loss(plan, self.folder / f"{self._count}-loss", self.loss_samples, self.start_limit_s,
                                       trial.loss_deadline, self._stall_s(), self._live, self.failed_copies)
            trial.startup_s += start_s  # a copy started: the share of the budget spent starting copies counts it
            if loss is None:  # the copy exited (its folder is kept) or the trial's time ran out
                why = ("the trial's time ran out: " if time.monotonic() >= trial.loss_deadline else "") + (
                    f"its copy for the loss told none at {self.loss_samples} samples")
                return TrialResult(failure_status(why), error=why, wall_s=time.monotonic() - trial.started)
        elif not trial.skip_loss and self.calibration is not None:  # the same sums: the defaults' loss
            loss = self.calibration.loss
            same = ", ".join(self._changed(trial.params))
            warnings.append(f"its loss is the defaults': {same} changes no arithmetic")
        return TrialResult(
            Status.OK, samples_per_s=statistics.median(c for _, c in trial.in_copy), objective=interval.median,
            speedup_low=interval.low, speedup_high=interval.high, confidence=interval.confidence,
            method=copy_method(len(trial.in_copy)), pairs=len(trial.in_copy),
            baseline_samples_per_s=statistics.median(b for b, _ in trial.in_copy), **loss_fields(loss),
            startup_s=trial.startup_s, timed_s=trial.timed_s, once_s=trial.once_s,
            wall_s=time.monotonic() - trial.started, warnings=warnings)

    def end(self, handle: object) -> TrialResult:
        trial = self._trial(handle)
        wall_s = time.monotonic() - trial.started
        if trial.in_copy is not None and trial.failed is None:
            return self._end_in_copy(trial, wall_s)
        if trial.failed is not None:
            return TrialResult(**{**trial.failed.to_dict(), "wall_s": wall_s, "startup_s": trial.startup_s,
                                  "once_s": trial.once_s})
        if trial.baseline:
            cal = self.calibration
            assert cal is not None and self.noise is not None
            low, high = self.noise.aa[1], self.noise.aa[2]
            return TrialResult(Status.OK, samples_per_s=statistics.median(cal.base_rates), objective=1.0,
                               speedup_low=low, speedup_high=high, method="script process pairs (A/A)",
                               pairs=cal.windows, **loss_fields(cal.loss), startup_s=cal.startup_s,
                               timed_s=cal.timed_s, once_s=cal.once_s, wall_s=self.noise.wall_s,
                               data_wait=cal.waited_s / cal.spans_s if cal.spans_s > 0 else None)
        interval = self._interval(trial)
        if len(trial.medians) >= 2:
            self.factor_ratios[f"trial {len(self.factor_ratios)}"] = list(trial.medians)
            if self.spread is not None:  # its pairs join the spread: an A/A's three that agreed by chance (an
                # input-bound script's read 0.96-1.05, its candidate's rounds 1.25-1.59) sized no round
                self._follow(self.spread.add(trial.medians, max(1, trial.windows // len(trial.medians))))
        if interval.count == 0:
            return TrialResult(Status.CRASH, error="no window measured both copies", wall_s=wall_s)
        return TrialResult(
            Status.OK, samples_per_s=statistics.median(trial.cand_rates), objective=interval.median,
            speedup_low=interval.low, speedup_high=interval.high, confidence=interval.confidence,
            method=script_method(len(trial.medians)), pairs=trial.windows,
            baseline_samples_per_s=statistics.median(trial.base_rates), **loss_fields(trial.loss),
            startup_s=trial.startup_s, timed_s=trial.timed_s, once_s=trial.once_s, wall_s=wall_s,
            warnings=[f"measured in fresh process pairs: {trial.fallback}"] if trial.fallback else [])

    def warm(self, params: dict[str, Any]) -> bool:
        """Whether the long-lived copy measures ``params`` (no copy is started for its windows)."""
        return bool(self.resident and not self.confirming and self.resident.can_measure(params))

    def method(self, handle: object, params: dict[str, Any]) -> str:
        trial = self._trial(handle)
        return copy_method(len(trial.in_copy)) if trial.in_copy is not None else script_method(len(trial.medians))

    def loss(self, handle: object) -> float | None:
        return (self._trial(handle).loss or (0, None, None))[1]

    def so_far(self, handle: object) -> TrialResult | None:
        trial = self._trial(handle)
        return TrialResult(Status.OK, method=self.method(trial, trial.params), pairs=trial.windows or None,
                           wall_s=time.monotonic() - trial.started, timed_s=trial.timed_s, once_s=trial.once_s)

    def loss_source(self, handle: object) -> str | None:
        return (self._trial(handle).loss or (0, None, None))[2]

    def user_pair(self, params: dict[str, Any], seed: int, timeout_s: float) -> RunPair:
        """Copies of your script alone, one after the other, as you run it (``copies.alone_pair``)."""
        self._count += 1
        plans = {side: copy_plan(self.argv, p, self.facts, self.env, self.workload)
                 for side, p in (("base", self.defaults), ("cand", params))}
        return alone_pair(plans, self.folder / f"{self._count}-yours", self._window_s(), WARMUP_STEPS, seed,
                          timeout_s, self._live)

    def close(self) -> None:
        """Stop every live copy (Ctrl-C included: none is left running or frozen)."""
        if self.resident is not None:
            self.resident.stop()
        for run in self._live:
            run.stop()
        self._live.clear()

    # One process pair ----------------------------------------------------------------------------------------
    def _process_pair(self, trial: ScriptTrial, params: dict[str, Any], pairs: int, within: list[float]) -> str | None:
        """Start a fresh pair of copies (the defaults' and ``params``'), warm both up, run ``pairs`` window pairs:
        the pair's median ratio joins ``trial``; its window ratios join ``within``. Returns why it failed, or
        None. Both copies are stopped whatever happens."""
        self._count += 1
        # only the candidate's copy takes the loss, once a trial (the calibration's candidate side: the defaults')
        loss_at = self.loss_samples if trial.loss is None and not trial.skip_loss else None
        runs = [ScriptRun(copy_plan(self.argv, p, self.facts, self.env, self.workload),
                          self.folder / f"{self._count}-{role}", loss_samples=loss)
                for p, role, loss in ((self.defaults, "defaults", None), (params, "candidate", loss_at))]
        self._live.extend(runs)
        base, cand = runs
        try:
            started = time.monotonic()
            limit = min(self.start_limit_s, max(1.0, trial.deadline - time.monotonic()))
            # Which copy starts and warms up first is drawn: a fixed order biases a ratio across processes
            order = self.rng.sample(runs, len(runs))
            start_together(order, limit)
            for run in order:  # the first steps, one copy at a time: untimed
                if run.exited is None:
                    run.window(0.0, min_steps=WARMUP_STEPS, timeout_s=max(1.0, started + limit - time.monotonic()))
            if any(run.exited is not None for run in runs):
                return self._failure(runs)
            # The candidate is named first: where both fell short, its wait used the limit, and the defaults'
            # copies warmed up in the calibration (a loaded CI machine named the defaults for a script that never
            # stepped).
            for run in (cand, base):
                if len(run.steps) < WARMUP_STEPS:
                    whose = "the defaults'" if run is base else "the candidate's"
                    short = f"{whose} copy told {len(run.steps)} of {WARMUP_STEPS} steps"
                    if limit < self.start_limit_s:  # the trial's time, not the script, set the limit
                        return f"the trial's time ran out: {short} in the {limit:.0f} s left"
                    return self._failure(runs, f"{short} in {limit:.0f} s")
            trial.startup_s += time.monotonic() - started
            once = time.monotonic()
            if self.step_s is None:  # its own steps alone: during the start-up the other copy was importing
                told = len(base.steps)
                base.window(0.0, min_steps=WARMUP_STEPS, timeout_s=limit)
                self.step_s = step_s(base.steps[told:])
            trial.once_s += time.monotonic() - once
            hopeless = results.far_slower(cand.s_per_sample(), base.s_per_sample())
            if hopeless is not None and cand.training_span() < self.min_window_s:
                # steps of milliseconds that stalled once (a preemption) are no verdict: judged over a window
                cand.window(self.min_window_s, min_steps=1, timeout_s=max(self.stall_s, 20 * self.min_window_s))
                if cand.exited is not None:
                    return self._failure(runs)
                hopeless = results.far_slower(cand.s_per_sample(), base.s_per_sample())
            if hopeless is not None:
                trial.failed = results.hopeless_result(hopeless)
                return None
            if cand.loss_samples is not None:  # before the windows: a script's own evaluation (``Tuned.evaluate``)
                once = time.monotonic()
                loss = cand.loss_told(trial.deadline, self._stall_s())  # is in no window, however long it takes
                if isinstance(loss, str):
                    why = loss.replace("its copy", "the candidate's copy", 1)
                    return why if why.startswith("the trial's") else self._failure(runs, why or None)
                trial.loss = loss
                base.train_to(cand.steps[-1].samples, trial.deadline, self._stall_s())  # both at one point
                trial.once_s += time.monotonic() - once
            window_s = self._window_s()
            timed = time.monotonic()
            rates = window_pairs(base, cand, pairs, window_s, self.rng, timeout_s=self._stall_s())
            trial.timed_s += time.monotonic() - timed
            if len(rates) < pairs:
                return self._failure(runs)
            ratios = [c / b for b, c in rates]
            trial.medians.append(statistics.median(ratios))
            trial.windows += len(ratios)
            within.extend(ratios)
            trial.base_rates.append(statistics.median(b for b, _ in rates))
            trial.waited_s, trial.spans_s = trial.waited_s + base.waited_s, trial.spans_s + base.timed_s
            trial.cand_rates.append(statistics.median(c for _, c in rates))
            return None
        finally:
            for run in runs:
                run.stop()
                self._live.remove(run)

    def _failure(self, runs: list[ScriptRun], why: str | None = None) -> str:
        """Why the pair's copies failed (``copies.failure``, or ``why``); their folders are kept for their logs."""
        self.failed_copies.extend(run.folder for run in runs)
        return why or failure(runs)

    def _stall_s(self) -> float:
        return max(self.stall_s, 20 * self._window_s())

    def _window_s(self) -> float:
        return max(self.min_window_s, WINDOW_STEPS * (self.step_s or 0.0))

    def _interval(self, trial: ScriptTrial, confidence: float = stats.CONFIDENCE) -> stats.Interval:
        if len(trial.medians) >= 2:  # the process factor's spread pooled with the A/A's and earlier recipes'
            return stats.pooled_log_mean_interval(trial.medians, list(self.factor_ratios.values()), confidence)
        if trial.medians:  # one process pair: no process's own factor seen, the interval is its median alone
            return stats.Interval(trial.medians[0], 0.0, math.inf, confidence, 1)
        return stats.Interval(math.nan, 0.0, math.inf, confidence, 0)

    @staticmethod
    def _trial(handle: object) -> ScriptTrial:
        if not isinstance(handle, ScriptTrial):
            raise TypeError(f"not a handle of this measurer: {handle!r}")
        return handle
