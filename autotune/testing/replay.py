"""``ReplayMeasurer``: the ``PairedMeasurer`` that answers a search from a recorded paired grid (``grid``).

The search runs against the grid's file (``search(..., measurer=ReplayMeasurer(grid, seed))``) with its real sampler,
seeding, race and confirmation, in seconds instead of hours, and every seed sees the same machine.

Replay draws, it does not invent: each ``begin`` of a combination shuffles its recorded ratios with a generator seeded
by the search's seed, the combination and how often it was begun, and ``more(n)`` hands out the next ``n``. When the
recorded ratios run out, ``more`` adds nothing: an interval never claims more pairs than were measured. The recorded
measurements are split at random by the replay's seed (``GridConfig.split``; recorded in time order, a split by order
hands one side a VM's minutes-long speed state): the search draws from half the ratios and from as many of the
environment's process pairs as a live first round runs (at most half); the confirmation (after ``reseed``) from the
other ratios and the process pairs held out, so the measurements that chose a candidate take no part in confirming it
and the winner's curse shows. A live confirmation's rounds are each new; here each round draws from what earlier
rounds left of the held-out ratios, and one held-out process pair no round took, so no measurement counts twice; a
round that finds nothing left is ``skipped`` (the recording held no more; not the budget's cut). The search's
environment factor is the geometric mean of its process pairs with its Student-t interval, a round's its one held-out
pair with their spread (``candidate.round_factor``), each combined with the in-process ratios as live
(``candidate.combine``); a trial's wall holds the process pairs charged to its environment, and a factor counts every
pair charged to its environment, as live. As the live measurer, the defaults themselves are the baseline trial, whose
speedup is the calibration's A/A, and the defaults of another environment are measured by their factor alone. A
combination recorded as failed (``oom``, ``nan``, ``crash``) fails the same way: at ``begin`` when it failed before
its first pair, at ``end`` when it failed later. A combination that is not in the grid is a ``GridMiss`` (the
benchmark's fixed knobs and the grid disagree): a bug of the caller, not a trial's failure.

    >>> grid = RecordedGrid.load("benchmarks/grids/cnn-paired.json")               # doctest: +SKIP
    >>> m = ReplayMeasurer(grid, seed=0)                                            # doctest: +SKIP
    >>> h = m.begin({**grid.defaults, "channels_last": True}, 60.0)                 # doctest: +SKIP
    >>> m.more(h, 8, 60.0).median, m.end(h).method                                  # doctest: +SKIP
    (1.16, 'in-process pairs')
"""
from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ..measure import Interval, Noise, PairedMeasurer, environment_differences, environment_keys, first_pairs, stats
from ..measure import environment_key as env_key
from ..measure.environment import ACROSS, FACTOR, IN_PROCESS
from ..measure.hopeless import far_slower_result
from ..measure.live.process_pair import needed
from ..trial.spec import Status, TrialResult
from .grid import GridConfig, RecordedGrid, knob_value

BASELINE = "baseline"  # a handle's kind beside the live measurer's methods (``candidate``): the calibration's A/A


@dataclass
class _Handle:
    config: GridConfig
    order: list[float]  # its recorded ratios, shuffled for this begin
    kind: str = IN_PROCESS  # or ACROSS, or FACTOR (its environment's defaults: the factor alone), or BASELINE
    confirming: bool = False  # drawn from the measurements the search did not see
    drawn: list[float] = field(default_factory=list)
    held: float | None = None  # confirming in another environment: this round's process pair, one held out
    looks: int = 0  # calls to ``more``: a search's race rounds
    env: str = ""  # another environment's (``environment_key``), where its process pairs were charged
    pairs_s: float = 0.0  # its environment's process pairs or worker start charged: a live trial's wall holds them
    pairs: int = 0  # of which process pairs (their windows are timed, the rest is start-up, as live's)


class ReplayMeasurer(PairedMeasurer):
    """A ``PairedMeasurer`` over a ``RecordedGrid`` (see the module docstring); ``seed``: the search's. The recording
    machine's kernel speeds and matmul peaks are not in the grid: this one's do not apply (``machine_speeds``,
    ``machine_limits``)."""

    machine_speeds = False
    machine_limits = False

    def __init__(self, grid: RecordedGrid, seed: int = 0, clock: ReplayClock | None = None) -> None:
        PairedMeasurer.__init__(self, grid.defaults)
        self.grid, self.seed = grid, seed
        self.split_seed = seed  # the split between search and confirmation: the replay's, kept by ``reseed``
        self.clock = clock  # charged the recorded time of what it answers, where given
        self.begun: dict[tuple[Any, ...], int] = {}
        self.confirming = False  # after ``reseed``: the held-out half of every combination's measurements
        # held out, not yet drawn, by combination: no pair counts in two rounds (a bootstrap repeated them)
        self.unused: dict[tuple[Any, ...], tuple[list[float], list[float]]] = {}
        # as live: process pairs charged by environment, the worker kept (``alive``), a round's one pair (``paid``)
        self.looked, self.paid, self.alive = dict[str, int](), set[str](), ""

    def calibrate(self, timeout_s: float) -> Noise:
        """The grid's noise, charged its wall; a worker's start (``start_s``) where it has none and a process pair
        was recorded, as a live calibration measures one (priced from its wall, a round's start reads too short)."""
        n = self.grid.noise
        self.charge(float(n.get("wall_s") or 0.0))
        start = n.get("start_s") if n.get("start_s") is not None or not self._pair_s else self.start_s()
        return Noise(**{**n, "aa": tuple(n["aa"]), "start_s": start})

    def reseed(self, seed: int) -> None:
        self.seed, self.confirming, self.paid, self.alive = seed, True, set(), ""  # fresh workers

    def warm(self, params: dict[str, Any]) -> bool:
        """As live (``LiveMeasurer.warm``): the defaults' environment, or the one whose worker is alive, looked at."""
        return not environment_differences(self.defaults, params) or env_key(params) == self.alive

    def start_s(self) -> float:
        """A worker's start, its arm built and settled: half a recorded process pair beyond its factor's windows."""
        return max(0.0, (self._pair_s - self._pair_windows_s) / 2)

    @property
    def _pair_s(self) -> float:
        """One recorded process pair's time (0 where none was recorded)."""
        return float(self.grid.recorded.get("process_pair_s") or 0.0)

    @property
    def _pair_windows_s(self) -> float:
        """A process pair's windows, as live's factor times them (``first_pairs`` window pairs of its calibration's)."""
        noise = self.grid.noise
        return 2 * first_pairs(int(noise.get("pairs") or 0)) * float(noise.get("window_s") or 0.0)

    def begin(self, params: dict[str, Any], timeout_s: float) -> object | TrialResult:
        config = self.grid.find(params)
        key = self.grid.key(config.params)
        times = self.begun[key] = self.begun.get(key, 0) + 1
        if config.state != "ok" and not config.ratios:
            return self._failed(config)
        order, held_out = config.split(self.confirming, self.split_seed)
        rng = random.Random(f"{self.seed}:{key}:{times}")  # str seeds are stable across runs (sha512)
        if self.confirming:  # a round: what is left of the held-out half, none drawn by an earlier round
            order, held_out = self.unused.setdefault(key, (rng.sample(order, len(order)),
                                                            rng.sample(held_out, len(held_out))))
            kind = self._kind(config)
            if not order and kind in (IN_PROCESS, ACROSS) or not held_out and kind in (ACROSS, FACTOR):
                return TrialResult(Status.SKIPPED, error="the recording holds no more held-out measurements of this "
                                                     "combination: no round beyond those it held")
        rng.shuffle(order)
        handle = _Handle(config, order if not self.confirming else list(order), self._kind(config), self.confirming)
        env = env_key(params)
        if handle.kind in (ACROSS, FACTOR):
            done = self.paid if self.confirming else self.looked
            pairs = 0 if env in done else 1 if self.confirming else len(config.split(False, self.split_seed)[1])
            need = pairs * self._pair_s
            if not pairs and env != self.alive:
                need = self.start_s()  # its factor (or the round's) stands; its worker is started again
            # as live (``EnvironmentFactors.too_short``): not started, nothing charged; a round is the confirmation's
            if need > timeout_s and not self.confirming:
                return TrialResult(Status.SKIPPED, error=f"not started: another environment needs {pairs} process "
                                   f"pair(s) or its worker's start, about {need:.0f} s; {timeout_s:.0f} s were left")
        self.charge(config.warmup_s)
        if handle.kind in (ACROSS, FACTOR):  # its environment's process pairs (the search's, or a round's one)
            # each round takes one held-out pair no round took (one fixed pair made every round agree)
            handle.held = held_out.pop() if self.confirming and held_out else None
            self.charge(need)
            handle.pairs_s, handle.pairs = need, pairs
            if self.confirming:
                self.paid.add(env)
            else:
                handle.env = env  # its later race rounds may add pairs (``more``)
                self.looked.setdefault(env, pairs)
            self.alive = env
        return handle

    def charge(self, seconds: float) -> None:
        """Advance the search's clock by the recorded time of what was answered (nothing without a clock)."""
        if self.clock is not None:
            self.clock.charge(seconds)

    def _kind(self, config: GridConfig) -> str:
        in_process = set(self.grid.searched).difference(environment_keys())  # read once, not once a knob
        if any(knob_value(config.params, k) != knob_value(self.grid.defaults, k) for k in in_process):
            return IN_PROCESS if not config.process_pair_factors else ACROSS
        return BASELINE if not config.process_pair_factors else FACTOR

    def method(self, handle: object, params: dict[str, Any]) -> str:
        kind = self._handle(handle).kind
        return IN_PROCESS if kind == BASELINE else kind

    def more(self, handle: object, n: int, timeout_s: float, confidence: float = stats.CONFIDENCE) -> Interval:
        h = self._handle(handle)
        h.looks += 1  # a later race round adds a pair while the search's pairs (its pilot) ask for more: live's grow
        if h.looks > 1 and h.env and self.looked[h.env] < needed(h.config.split(False, self.split_seed)[1],
                                                                  self.grid.noise["half_width"]):
            self.looked[h.env] += 1
            self.charge(self._pair_s)
            h.pairs_s, h.pairs = h.pairs_s + self._pair_s, h.pairs + 1
        if h.kind in (IN_PROCESS, ACROSS):
            drawn = h.order[len(h.drawn):len(h.drawn) + n]
            h.drawn.extend(drawn)
            if h.confirming:  # taken from the held-out pool: no later round draws them
                pool = self.unused[self.grid.key(h.config.params)][0]
                for ratio in drawn:
                    pool.remove(ratio)
            self.charge(len(drawn) * (h.config.window_s + max(h.config.window_s, h.config.step_s or 0.0)))
        return self._interval(h, confidence)

    def _interval(self, h: _Handle, confidence: float = stats.CONFIDENCE) -> Interval:
        if h.kind == BASELINE:
            median, low, high = self.grid.noise["aa"]
            pairs = self.grid.recorded.get("aa_pairs") or len(h.config.ratios)  # the defaults' copy: as many
            return Interval(median, low, high, stats.CONFIDENCE, int(pairs))
        if h.kind == FACTOR:
            return h.config.environment(h.confirming, confidence, h.held, self.split_seed) or _NOTHING
        return h.config.speedup(h.drawn, h.confirming, confidence, h.held, self.split_seed) if h.drawn else _NOTHING

    def end(self, handle: object) -> TrialResult:
        h = self._handle(handle)
        c = h.config
        timed = self.grid.noise.get("timed_s", 0.0) if h.kind == BASELINE else \
            len(h.drawn) * (c.window_s + max(c.window_s, c.step_s or 0.0))
        # as live's: a process pair's windows are timed, the rest of what its environment was charged is start-up
        pair_windows = min(h.pairs_s, h.pairs * self._pair_windows_s)
        startup, timed, wall = h.pairs_s - pair_windows, timed + pair_windows, c.warmup_s + timed + h.pairs_s
        if c.state != "ok":
            return replace(self._failed(c), warmup_s=c.warmup_s, startup_s=startup, timed_s=timed, wall_s=wall)
        if h.kind in (IN_PROCESS, ACROSS) and not h.drawn:
            return TrialResult(Status.CRASH, error="no pair was drawn: the race asked for none, or none was recorded")
        iv = self._interval(h)
        # a factor's pairs as live counts them: all charged to its environment, more than the search's share holds
        pairs = max(iv.count, self.looked.get(h.env, 0)) if h.kind == FACTOR and h.env else iv.count
        return TrialResult(Status.OK, objective=iv.median, speedup_low=iv.low, speedup_high=iv.high,
                           confidence=iv.confidence, method=IN_PROCESS if h.kind == BASELINE else h.kind,
                           pairs=pairs, loss=c.loss, loss_samples=c.loss_samples, compile_s=c.compile_s,
                           warmup_s=c.warmup_s, startup_s=startup, timed_s=timed, wall_s=wall,
                           spread=_spread(h.drawn), data_wait=c.data_wait)

    def close(self) -> None:
        pass

    @staticmethod
    def _handle(handle: object) -> _Handle:
        if not isinstance(handle, _Handle):
            raise TypeError(f"not a handle of this ReplayMeasurer: {handle!r}")
        return handle

    @staticmethod
    def _failed(config: GridConfig) -> TrialResult:
        if config.state == "gave_up":  # far slower in its warm-up: as the live search records it, not a failure
            return far_slower_result(None, [config.error or ""])
        state = config.state if config.state in {s.value for s in Status} else Status.CRASH.value
        return TrialResult(Status(state), error=config.error, loss=config.loss, loss_samples=config.loss_samples)


_NOTHING = Interval(0.0, 0.0, 0.0, 0.0, 0)  # no pair yet: slower than anything (as the live measurer's)


class ReplayClock:
    """The search's clock during a replay: real time plus the recorded time charged (``charge``), so a 2-minute replay
    runs out of budget where a 2-minute search would (read through ``Budget.start(budget_s, clock.monotonic)``);
    ``frozen``: the recorded time alone, the same decisions every run (the search's own time moves one near a limit)."""

    def __init__(self, frozen: bool = False) -> None:
        self.charged, self.frozen_at = 0.0, (time.monotonic() if frozen else None)

    def monotonic(self) -> float:
        return (time.monotonic() if self.frozen_at is None else self.frozen_at) + self.charged

    def charge(self, seconds: float) -> None:
        self.charged += max(0.0, seconds)


def _spread(ratios: list[float]) -> float | None:
    if len(ratios) < 2:
        return None
    centre = statistics.median(ratios)
    return (max(ratios) - min(ratios)) / centre if centre > 0 and math.isfinite(centre) else None


__all__ = ["ReplayClock", "ReplayMeasurer"]
