"""What a measured recipe's confirmation round costs, read from its result as its measurer wrote it: the search's
budget (``autotune.study.budget``) keeps time for the rounds and prices each before it starts.

A result says how it was measured (``TrialResult.method``): arms of the defaults' worker (``IN_PROCESS``), its
environment's process pairs alone (``FACTOR``: it IS its environment's defaults) or those times an arm in its
environment's worker (``ACROSS``), or script mode's fresh process pairs of copies (``script.results.script_method``)
or its long-lived copy's window pairs (``script.results.copy_method``).
The formats are read here, beside the measurers that write them, so the budget never parses a measurer's words.
"""
from __future__ import annotations

import re

from ..trial.spec import TrialResult
from .environment import ACROSS, FACTOR, IN_PROCESS
from .hopeless import FAR_SLOWER_IN_COPY
from .live.factors import cut_pairs
from .live.process_pair import PROCESS_PAIRS
from .measurer import Noise, first_pairs
from .script.measurer import CALIBRATION_PAIRS
from .script.results import COPY_METHOD, METHOD
from .sizing import LEAST_PAIRS, WINDOWS

IN_PROCESS_METHODS = (IN_PROCESS, ACROSS)  # ``LiveMeasurer._end``'s methods of a candidate with an arm of its own


def in_one_process(method: str | None) -> bool:
    """Whether a result of ``method`` was measured in a process already running: an arm of a worker, or a window
    pair of script mode's long-lived copy (``script.results.copy_method``)."""
    return method in IN_PROCESS_METHODS or (method or "").startswith(COPY_METHOD)


def started_processes(method: str | None, startup_s: float | None) -> bool:
    """Whether a candidate's measuring started processes (a worker, process pairs): its start-up over ``STARTED_S``.
    Not a candidate of script mode's long-lived copy (one stopped there far slower too): the copy's start, once,
    and the fresh copy that takes a candidate's loss are that kind of trial's own time, and priced as process pairs
    they would set another environment's first look at an in-copy trial's time (docs/search.md)."""
    return (startup_s or 0.0) > STARTED_S and not (method or "").startswith(COPY_METHOD) and \
        method != FAR_SLOWER_IN_COPY


STARTED_S = 1.0  # a candidate's start-up longer than this started a process (Python and torch: 1.5 s at least)
_SCRIPT = re.compile(re.escape(METHOD) + r" \((\d+)\)")  # ``script.results.script_method``'s


def first_rounds_s(noise: Noise) -> float:
    """A candidate's trial before any was measured: a first round of pairs at the calibration's window length, twice
    over. Script mode's first round is ``LEAST_PAIRS`` fresh process pairs, each started as the A/A's were: read as
    windows alone, a GPU machine's script (copies that took 25 s a pair to start) began a candidate with 21 s left,
    which ran out before its copies' first steps and was told as a fault of the defaults' copy. A trial's first pair
    also trains its candidate to the loss's samples: counted as the A/A's time spent once (``TrialResult.once_s``,
    which also holds the defaults' step timed alone: the price errs long by it)."""
    if noise.round_pairs and noise.aa_pairs:  # script mode's (``ScriptMeasurer``: its A/A is CALIBRATION_PAIRS)
        pair = _aa_outside_s(noise)
        once = max(0.0, noise.wall_s - noise.timed_s - CALIBRATION_PAIRS * pair)
        return LEAST_PAIRS * _script_pair_s(pair, noise.timed_s, noise.aa_pairs, noise.pairs) + once
    return 2 * (2 * first_pairs(noise.pairs) * noise.window_s)


def _script_pair_s(outside_s: float, timed_s: float, window_pairs: int, a_pair: int) -> float:
    """One script-mode process pair of ``a_pair`` window pairs: ``outside_s`` outside windows (its copies' start,
    warm-up and stop) and the window pairs it runs now, each as long as the ``window_pairs`` measured in ``timed_s``."""
    return outside_s + a_pair * timed_s / max(1, window_pairs)


def _pair_outside_s(wall_s: float, timed_s: float, once_s: float | None, ran: int) -> float:
    """Of ``ran`` measured process pairs, one pair's time outside windows that a round's pair takes again: not what
    the trial spent once (``TrialResult.once_s``: the candidate trained on to the loss's samples, and where it began
    in the long-lived copy, the time spent there)."""
    return max(0.0, wall_s - timed_s - (once_s or 0.0)) / max(1, ran)


def _aa_outside_s(noise: Noise) -> float:
    """A pair's time outside windows as the A/A's pairs took it (``Noise.start_s``: a copy's share)."""
    return 2 * noise.start_s if noise.start_s is not None else _pair_outside_s(noise.wall_s, noise.timed_s, None,
                                                                               CALIBRATION_PAIRS)


def own_copies(result: TrialResult) -> bool:
    """Whether ``result`` was measured in script mode's fresh pairs of copies (a candidate's or the A/A's): no
    environment's worker is started beside them in a round."""
    return (result.method or "").startswith((METHOD, COPY_METHOD))


def round_parts(result: TrialResult, noise: Noise | None, pairs: int, round_: int) -> tuple[float, float]:
    """Round ``round_`` of confirming the recipe measured by ``result``, ``pairs`` window pairs a round
    (``reserve.confirmation_pairs``): (its own time, the time its environment spends on the round whichever
    candidates of it are confirmed). Its own: its in-process pairs' windows (two a pair, at the calibration's
    length, 10% over for whole steps), and for a recipe of the defaults' environment its time outside windows in
    the search once more (its arm built, evaluation); a recipe that IS its environment (method ``FACTOR``) has
    none: its environment's process pair is its measurement. Its environment's: for the defaults', a worker's
    start, as the calibration's (its time outside windows: a worker started, its arms built and settled); for
    another, one fresh process pair (``LiveMeasurer.reseed``), whose environment side goes on as the round's worker
    (``EnvironmentFactors.factor``), which costs what the trial's pairs did, at least a worker's start and the pair's
    windows; a factor the search cut short for time is completed in round 0, counted as ``PROCESS_PAIRS[0]`` pairs
    (completing it costs those, not the fewer pairs the search ran). Recipes of one environment share its part in
    a round (``reserve.reserve_s``).

    Where the calibration recorded its worker's start (``Noise.start_s``), a worker's start is that, and a
    recipe's own time outside windows is its arm's build and warm-up (``warmup_s``): a round evaluates no loss and
    profiles nothing, so the calibration's and the trial's whole time outside windows (the A/A's second arm, the
    defaults' profile, the candidate's loss and profile) would over-price it."""
    outside = max(0.0, result.wall_s - (result.timed_s or 0.0))
    if noise is None:
        return result.wall_s, 0.0
    windows = 2 * pairs * noise.window_s * 1.1
    if noise.start_s is not None:  # a worker started and its defaults' arm built and settled, as measured
        start, arm = noise.start_s, result.warmup_s or 0.0
    else:  # a study calibrated before ``start_s`` was recorded
        start, arm = max(0.0, noise.wall_s - noise.timed_s), outside
    method = result.method or ""
    if method.startswith(COPY_METHOD) and noise.aa_pairs:  # measured in the long-lived copy, confirmed in fresh
        # process pairs as the A/A was: priced from its pairs, each its start and the window pairs a pair has now
        a_pair = max(1, noise.pairs)
        pair_s = _script_pair_s(_aa_outside_s(noise), noise.timed_s, noise.aa_pairs, a_pair)
        return pair_s * max(LEAST_PAIRS, -(-pairs // a_pair)), 0.0
    script = _SCRIPT.fullmatch(method)
    if script:  # script mode: a round is fresh process pairs of copies, each started as the trial's were and
        # running the window pairs a pair has now (``Noise.pairs``: the rounds were resized since, or not)
        ran, a_pair = max(1, int(script.group(1))), max(1, noise.pairs)
        outside = _pair_outside_s(result.wall_s, result.timed_s or 0.0, result.once_s, ran)
        pair_s = _script_pair_s(outside, result.timed_s or 0.0, result.pairs or ran * WINDOWS, a_pair)
        return pair_s * max(LEAST_PAIRS, -(-pairs // a_pair)), 0.0
    if method not in (FACTOR, ACROSS):
        return windows + arm, start
    pair = start + 2 * first_pairs(noise.pairs) * noise.window_s  # ``EnvironmentFactors.factor``'s windows
    # The process pairs the trial ran: all its pairs when the factor was its whole measurement, else at least
    # the fewest (a factor cut short for time says so in a warning and is counted from it).
    ran = (result.pairs or 1) if method == FACTOR else PROCESS_PAIRS[0]
    cut = cut_pairs(result.warnings)
    per_pair = max(pair, outside / max(1, min([ran, *cut])))
    own = 0.0 if method == FACTOR else windows
    return own, per_pair * (PROCESS_PAIRS[0] if cut and round_ == 0 else 1)  # its last pair's worker goes on


__all__ = ["IN_PROCESS_METHODS", "STARTED_S", "first_rounds_s", "in_one_process", "own_copies", "round_parts",
           "started_processes"]
