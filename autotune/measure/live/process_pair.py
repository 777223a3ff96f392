"""Environment knobs compared across processes: two live workers, alternated, over several process pairs.

Knobs that must be set before torch starts (threads, affinity, OpenMP runtime, allocator) cannot share a
process, so their comparison needs two. A ``ProcessPair`` is two live ``PairedWorker``s, one per environment
configuration, each holding that environment's in-process defaults (one arm). Which worker starts and warms up
first, and which side runs first in each pair, are drawn from a seeded generator (a fixed order biases even an
A/A across processes), and the idle worker is FROZEN (``autotune.measure.freeze``: SIGSTOP of its whole tree),
so its spinning OpenMP threads and prefetching DataLoader workers take nothing from the one being timed. A
pair's ratio is the candidate worker's rate / the baseline worker's.

Two identical processes still differ by a factor that lasts their whole life, larger than the windows' noise.
So one process pair gives one ratio (the median of its windows'), and ``across_processes`` repeats over fresh
process pairs (the geometric mean of their ratios, a Student-t interval over them: ``stats.log_mean_interval``)
until as many ran as the first pairs' spread says an interval within ``±half_width`` takes (``needed``: a two-stage
rule, at least ``least``, at most ``most``): noisier machines get more, and no comparison stops on a width the
later pairs happened to reach.

    >>> result = across_processes("cnn", defaults, {**defaults, "threads": 1}, facts, settings)  # doctest: +SKIP
    >>> result.verdict, result.ratio.low, result.ratio.high                                     # doctest: +SKIP
    ('slower', 0.55, 0.63)
"""
from __future__ import annotations

import contextlib
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Literal

from .. import stats
from ..environment import DEFAULTS
from ..hopeless import HOPELESS
from ..protocol import ArmStatus, PairRecord, WindowsRun
from ..worker.arms import choose_window_s
from .paired_worker import PairedWorker, WorkerError

Side = Literal["base", "cand"]
PROCESS_PAIRS = (3, 8)  # the fewest and most fresh process pairs an environment comparison runs (``enough``)
PILOT = 3  # the first pairs, whose spread alone sets how many a comparison takes (``needed``)
SETTLED = 5  # no comparison is settled on its width before this many pairs
ARM = DEFAULTS  # each worker's one arm; a kept worker goes on with it as its environment's defaults arm


class HopelessEnvironment(WorkerError):
    """The candidate environment's arm gave up in its warm-up (``hopeless``): a step ``slower`` times the
    defaults' time per sample. The pair ends there: none of its windows, nor more process pairs, would run.
    ``earlier``: found in an earlier trial's process pair, raised again for a later candidate of it."""

    def __init__(self, slower: float, status: ArmStatus, earlier: bool = False) -> None:
        super().__init__(f"a step took {slower:.0f}x the defaults' time per sample")
        self.slower, self.status, self.earlier = slower, status, earlier


@dataclass(frozen=True)
class ProcessPairRun:
    """The windows of one process pair: ``pairs[i].cand.rate / pairs[i].base.rate`` is a pair's ratio."""

    base: ArmStatus
    cand: ArmStatus
    pairs: tuple[PairRecord, ...]  # ``first``: the side ("base" or "cand") whose window ran first
    pids: tuple[int, int]  # the two workers' process ids (gone once the pair is closed)
    started: tuple[Side, Side] = ("base", "cand")  # the order the workers started and warmed up in

    @property
    def ratio(self) -> stats.Interval:
        return stats.median_interval([p.ratio for p in self.pairs])


class ProcessPair:
    """Two live workers with different environments, run alternately; use as a context manager (leaving
    it continues both and ends them, whatever happened: Ctrl-C, a timeout, a failed arm). ``seed`` draws
    which worker starts first. ``reference_s``: the defaults' seconds per sample (the search's calibration); with
    it the candidate's arm is judged by the hopeless rule in its warm-up (``start``). ``deadline`` (monotonic): no
    wait on a worker outlasts it (a worker that hangs at its start would wait out each wait's own limit)."""

    def __init__(self, workload: str, base_params: dict[str, Any], cand_params: dict[str, Any], facts: Any,
                 settings: Any, *, seed: int = 0, python: str = sys.executable,
                 reference_s: float | None = None, deadline: float | None = None) -> None:
        self.reference_s, self.deadline = reference_s, deadline
        first: Side = "base" if random.Random(seed).random() < 0.5 else "cand"
        self.started: tuple[Side, Side] = ("base", "cand") if first == "base" else ("cand", "base")
        self.params: dict[Side, dict[str, Any]] = {"base": base_params, "cand": cand_params}
        self.workers: dict[Side, PairedWorker] = {
            side: PairedWorker(workload, params, facts, settings, python=python, keep_heap=False)
            for side, params in self.params.items()}
        self.status: dict[Side, ArmStatus] = {}

    def left(self, most: float) -> float:
        """A wait's limit: ``most``, and no later than the deadline (a second at least)."""
        return most if self.deadline is None else max(1.0, min(most, self.deadline - time.monotonic()))

    def __enter__(self) -> ProcessPair:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start both workers side by side (importing torch times nothing), freeze both once ready, then, in the
        drawn order, build and warm each one's arm and freeze it again: one warms up while the other is stopped.
        With ``reference_s``, the candidate's warm-up stops at a step far slower than the defaults' (``HOPELESS``),
        and the pair raises ``HopelessEnvironment`` before any window: an environment 50x slow costs its workers'
        start and a step, not process pairs of windows."""
        for side in self.started:
            self.workers[side].launch()
        for side in self.started:
            self.workers[side].wait_ready(self.left(120.0))
        for worker in self.workers.values():
            worker.freeze()
        for side in self.started:
            worker = self.workers[side]
            worker.thaw()
            reference = self._reference_s() if side == "cand" and self.reference_s else None  # judged where asked
            status = worker.add_arm(ARM, self.params[side], self.left(300.0), give_up=HOPELESS if reference else None,
                                    reference_s=reference)
            if status.state != "ok":
                raise WorkerError(f"the {side} worker's arm failed ({status.state}): {status.error}")
            self.status[side] = status
            worker.freeze()
        slower = self._gave_up()
        if slower is not None:
            raise HopelessEnvironment(slower, self.status["cand"])

    def _reference_s(self) -> float | None:
        """The candidate is judged against the defaults' seconds per sample: their worker's warm-up where it warmed
        first (measured now, as the candidate will be), else the search's calibration (``reference_s``)."""
        base = self.status.get("base")
        return (base.s_per_sample if base is not None else None) or self.reference_s

    def _gave_up(self) -> float | None:
        """How many times slower than the defaults the candidate's arm gave up, where it did (None: it did not).
        Judged against the calibration because it warmed up first, it is judged again against the defaults' worker
        that warmed up after it: a machine slowed since the calibration slows both, and only a step still
        ``HOPELESS`` times theirs ends the pair."""
        cand, base = self.status.get("cand"), self.status.get("base")
        if cand is None or cand.gave_up is None:
            return None
        if self.started[0] == "cand" and self.reference_s and base is not None and base.s_per_sample:
            again = cand.gave_up * self.reference_s / base.s_per_sample
            return again if again > HOPELESS else None
        return cand.gave_up

    @property
    def window_s(self) -> float:
        """A window long enough for the slower of the two arms."""
        steps = [s.step_s or s.first_step_s or 0.0 for s in self.status.values()]
        return choose_window_s(max(steps), self.params["base"].get("device") or "cpu")

    def windows(self, side: Side, n: int, window_s: float, timeout_s: float | None = None) -> WindowsRun:
        """``n`` windows of one worker, the other frozen; frozen again afterwards."""
        worker = self.workers[side]
        worker.thaw()
        try:
            run = worker.run_windows(ARM, n, window_s, self.left(timeout_s or 120.0 + 2 * n * window_s))
        finally:
            worker.freeze()
        self.status[side] = run.status
        return run

    def run(self, n: int, window_s: float, seed: int = 0) -> ProcessPairRun:
        """``n`` pairs of windows, each pair's two workers in an order drawn from ``seed``. Stops at the first
        failure of an arm: its status says why."""
        rng, records = random.Random(f"pairs:{seed}"), []  # not the start order's stream: both drawn freely
        for _ in range(n):
            order: list[Side] = ["base", "cand"] if rng.random() < 0.5 else ["cand", "base"]
            runs = {side: self.windows(side, 1, window_s) for side in order}
            if any(len(r.windows) != 1 for r in runs.values()):
                break
            records.append(PairRecord(order[0], runs["base"].windows[0], runs["cand"].windows[0]))
        pids = tuple(w.ready.pid if w.ready else -1 for w in self.workers.values())
        return ProcessPairRun(self.status["base"], self.status["cand"], tuple(records), (pids[0], pids[1]),
                              self.started)

    def close(self) -> None:
        """Continue both (a stopped process cannot act on its end), ask both to quit, then wait for each to end:
        they end side by side."""
        for worker in self.workers.values():
            worker.ask_to_quit()
        with contextlib.ExitStack() as stack:
            for worker in self.workers.values():
                stack.callback(worker.close)

    def detach(self, side: Side) -> PairedWorker:
        """Take one worker out of the pair: ``close`` leaves it running (frozen, as the pair left it)."""
        return self.workers.pop(side)


@dataclass(frozen=True)
class AcrossProcesses:
    """An environment comparison over several process pairs."""

    runs: tuple[ProcessPairRun, ...]
    ratio: stats.Interval  # geometric mean of the process pairs' median ratios; t-interval over process pairs
    verdict: stats.Verdict
    margin: float
    window_s: float

    @property
    def per_process(self) -> tuple[float, ...]:
        return tuple(run.ratio.median for run in self.runs)


def needed(ratios: list[float], half_width: float, *, least: int = SETTLED, most: int = 8,
           confidence: float = stats.CONFIDENCE) -> int:
    """How many process pairs a comparison takes (Stein's two-stage rule): the first ``PILOT`` pairs' spread, at the
    t quantile of their degrees of freedom, sets the pairs whose interval is within ``±half_width``; at least
    ``least``, at most ``most`` (``most`` until the pilot ran). Later pairs never change it: a width judged on the
    pairs so far stops where they agree by chance: on processes of two speeds (half of them 0.72x) such a stop from
    three pairs covered 91.9% at 95%, this rule 94.5% (``tests/measure/test_process_pair.py``).

    >>> needed([0.995, 1.0, 1.005], 0.03), needed([0.9, 1.0, 1.1], 0.03), needed([1.0], 0.03)
    (5, 8, 8)
    """
    if len(ratios) < PILOT:
        return most
    spread = statistics.stdev(math.log(r) for r in ratios[:PILOT])
    t = stats.t_quantile(1 - (1 - confidence) / 2, PILOT - 1)
    return min(most, max(least, math.ceil((t * spread / math.log1p(half_width)) ** 2)))


def enough(ratios: list[float], half_width: float, *, least: int = SETTLED, most: int = 8,
           confidence: float = stats.CONFIDENCE) -> bool:
    """Whether ``ratios`` (one per process pair) suffice: as many as their pilot says (``needed``).

    >>> enough([0.995, 1.0, 1.005] * 2, 0.03), enough([0.995, 1.0, 1.005], 0.03), enough([0.9, 1.1] * 4, 0.05)
    (True, False, True)
    """
    return len(ratios) >= needed(ratios, half_width, least=least, most=most, confidence=confidence)


def process_pair(workload: str, base_params: dict[str, Any], cand_params: dict[str, Any], facts: Any,
                 settings: Any, *, pairs: int = 8, window_s: float | None = None, seed: int = 0,
                 python: str = sys.executable, keep: bool = False, reference_s: float | None = None,
                 deadline: float | None = None) -> tuple[ProcessPairRun, float, PairedWorker | None]:
    """One process pair's ``pairs`` pairs of windows (of ``window_s``, else the pair's own ``window_s``): its run,
    the window length and, with ``keep``, its candidate's worker, not ended: frozen, its heap fixed from now on
    (``PairedWorker.fix_heap``), its one arm ``ARM``, for in-process arms of that environment (a search's
    environment worker: a worker's start saved). WorkerError when an arm failed; ``HopelessEnvironment`` when
    the candidate's first steps were far slower than the defaults' ``reference_s`` (``ProcessPair.start``); no wait
    past ``deadline``."""
    kept = None
    try:
        with ProcessPair(workload, base_params, cand_params, facts, settings, seed=seed, python=python,
                         reference_s=reference_s, deadline=deadline) as pair:
            window_s = window_s or pair.window_s
            run = pair.run(pairs, window_s, seed=seed)
            if keep and run.pairs:
                kept = pair.detach("cand")
        if not run.pairs:
            failed = run.base if run.base.state != "ok" else run.cand
            raise WorkerError(f"an arm failed across processes ({failed.state}): {failed.error}")
        if kept is not None:
            kept.thaw()
            kept.fix_heap(pair.left(30.0))
            kept.freeze()
    except BaseException:  # Ctrl-C or a failure after the worker left the pair: it ends as the pair's did
        if kept is not None:
            kept.close(timeout_s=1.0)
        raise
    return run, window_s, kept


def across_processes(workload: str, base_params: dict[str, Any], cand_params: dict[str, Any], facts: Any,
                     settings: Any, *, pairs: int = 8, window_s: float | None = None, least: int = SETTLED,
                     most: int = 8,
                     half_width: float = 0.03, margin: float = stats.MIN_MARGIN,
                     confidence: float = stats.CONFIDENCE, seed: int = 0,
                     python: str = sys.executable) -> AcrossProcesses:
    """Compare two environments over fresh process pairs until ``enough`` of them ran (see the module)."""
    runs: list[ProcessPairRun] = []
    while not enough([r.ratio.median for r in runs], half_width, least=least, most=most, confidence=confidence):
        run, window_s, _ = process_pair(workload, base_params, cand_params, facts, settings, pairs=pairs,
                                        window_s=window_s, seed=seed + len(runs), python=python)
        runs.append(run)
    interval = stats.log_mean_interval([r.ratio.median for r in runs], confidence)
    return AcrossProcesses(tuple(runs), interval, stats.verdict(interval, margin), margin, window_s or 0.0)
