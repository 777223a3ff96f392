"""A search's time: durations on the command line (``parse_duration``) and how the budget is spent.

The policy: a trial is estimated at 1.2x the median wall time of the finished trials of its kind that were
not pruned: all candidates (``estimate_s``), per compile mode when the trial compiles, those that started
processes (``started_estimate_s``) or those that started none (``in_process_estimate_s``; the search loop
picks the kind, ``Turns.next_estimate_s``); a trial may take 5x its estimate (at least 60 s) within
what is left (``limits.timeout_s``); and time is kept for the confirmation and the claim at the end
(``reserve.reserve_s``), so the search stops early enough to confirm its candidates and state its claim.
"""
from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..measure import (
    PROCESS_PAIRS,
    Noise,
    first_pairs,
    first_rounds_s,
    in_one_process,
    started_processes,
)
from ..trial.spec import Status
from .records import BASELINE, CONFIRM, Attr, StudyAttr

if TYPE_CHECKING:
    import optuna


_PART = re.compile(r"(\d+(?:\.\d+)?)([hms])")
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0}


@dataclass
class Budget:
    """A search's time, the one clock its modules read: ``clock`` (monotonic seconds: ``time.monotonic``, or a
    replay's, which adds the recorded time of what it answered), when the search began (``started``) and its
    ``deadline`` (infinite without a budget). Built once (``start``) and shared by the loop, the guard and the
    confirmation; what is kept for the confirmation is priced from the study (``reserve_s``)."""

    deadline: float
    clock: Callable[[], float] = time.monotonic
    started: float = 0.0

    @classmethod
    def start(cls, budget_s: float | None, clock: Callable[[], float] = time.monotonic) -> Budget:
        """A search that begins now with ``budget_s`` seconds (None: no time limit)."""
        now = clock()
        return cls(now + budget_s if budget_s else math.inf, clock, now)

    def now(self) -> float:
        return self.clock()

    def left(self, deadline: float | None = None) -> float:
        """Seconds until ``deadline`` (default: the search's)."""
        return (self.deadline if deadline is None else deadline) - self.clock()

    def spent(self) -> float:
        """Seconds since the search began."""
        return self.clock() - self.started

    @staticmethod
    def wall() -> float:
        """The wall clock, comparable between the workers of a study on several hosts (not the budget's)."""
        return time.time()


def parse_duration(text: str) -> float:
    """Seconds in a duration string: ``90s``, ``30m``, ``1h30m``, ``2h``, or plain seconds (``45``).

    >>> parse_duration("1h30m")
    5400.0
    """
    cleaned = text.strip().lower()
    negative = cleaned.startswith("-")  # read as a duration, then refused as one: it must be more than zero
    cleaned = cleaned.removeprefix("-")
    if re.fullmatch(r"\d+(\.\d+)?", cleaned):
        seconds = float(cleaned)
    else:
        parts = _PART.findall(cleaned)
        if not parts or "".join(n + u for n, u in parts) != cleaned or len({u for _, u in parts}) != len(parts):
            raise UsageError(f"bad duration {text!r}: use e.g. 90s, 30m, 1h30m")
        seconds = sum(float(n) * _UNIT[u] for n, u in parts)
    if seconds <= 0 or negative:
        raise UsageError(f"bad duration {text!r}: it must be more than zero")
    return seconds


def estimate_s(study: optuna.Study, compile_mode: str | None = None) -> float | None:
    """How long one full trial will likely take: 1.2x the median wall time (start-up, compile and
    warm-up included) of the finished candidates that were not pruned (not the baseline: its A/A is the
    calibration, longer than a candidate's first round). With ``compile_mode``, of the trials compiled that
    way only (compiling takes far longer than the timed steps). Before any candidate: a first round of pairs
    at the calibration's window length, twice over for the rest; None without a calibration."""
    found = _median_wall_s(study, lambda a: a.get(Attr.STATUS) != Status.PRUNED and a.get(Attr.ROLE) != BASELINE
                           and (compile_mode is None or a.get(Attr.PARAMS, {}).get("compile_mode") == compile_mode))
    if found is not None:
        return found
    if compile_mode not in (None, "none"):
        return None
    return _first_rounds_s(study)


def _median_wall_s(study: optuna.Study, keep: Callable[[dict[str, Any]], bool], once: bool = False) -> float | None:
    """1.2x the median wall time of the study's trials whose user attributes ``keep`` takes, ``once``: less the time
    each spent once (``TrialResult.once_s``); None if none."""
    walls = sorted(t.user_attrs[Attr.WALL_S] - (once and t.user_attrs.get("once_s") or 0.0)
                   for t in study.get_trials(deepcopy=False) if Attr.WALL_S in t.user_attrs and keep(t.user_attrs))
    return 1.2 * walls[len(walls) // 2] if walls else None


def _first_rounds_s(study: optuna.Study) -> float | None:
    """A candidate's trial before any was measured, from the study's calibration (``measure.first_rounds_s``); None
    without a calibration."""
    noise = recorded_noise(study)
    return None if noise is None else first_rounds_s(noise)


def started_estimate_s(study: optuna.Study) -> float | None:
    """How long a candidate that starts processes (another environment's process pairs, ``processes`` > 1)
    likely takes: 1.2x the median wall time of the finished candidates, not pruned, that started some; before
    any, its first process pairs (``first_process_pairs_s``; script mode's, ``first_rounds_s``), else
    ``estimate_s``. The median of all candidates falls once the defaults' worker (or script mode's long-lived copy)
    has measured a few cheap ones, and would let such a trial start with too little time left before the time kept
    for the confirmation."""
    found = _median_wall_s(study, lambda a: a.get(Attr.STATUS) != Status.PRUNED and a.get(Attr.ROLE) not in (
        BASELINE, CONFIRM) and started_processes(a.get("method"), a.get("startup_s")))
    if found is not None:
        return found
    noise = recorded_noise(study)
    first = None if noise is None else first_rounds_s(noise) if noise.round_pairs else first_process_pairs_s(noise)
    return first if first is not None else estimate_s(study)


def first_process_pairs_s(noise: Noise) -> float | None:
    """Another environment's first ``PROCESS_PAIRS[0]`` fresh process pairs, each two workers' starts with their
    arms built and settled, as the calibration's (``Noise.start_s``), and a factor's windows; None where the
    calibration did not record its start. Read from the cheap candidates measured before it, a process pair would
    be priced as an arm."""
    if noise.start_s is None:
        return None
    return PROCESS_PAIRS[0] * (2 * noise.start_s + 2 * first_pairs(noise.pairs) * noise.window_s)


def in_process_estimate_s(study: optuna.Study) -> float | None:
    """How long a candidate that starts no process likely takes (a ``warm`` environment's, not compiled): 1.2x
    the median wall time of the finished candidates, not pruned, that started none and did not compile, less what
    each spent once (script mode's long-lived copy's start, which the next candidate does not pay); before any, as
    ``estimate_s`` before any candidate. The median of all candidates, raised by process pairs, would overstate it
    many times over and leave the budget's end unused."""
    found = _median_wall_s(study, lambda a: a.get(Attr.STATUS) == Status.OK
                           and a.get(Attr.ROLE) not in (BASELINE, CONFIRM) and in_one_process(a.get("method"))
                           and not started_processes(a.get("method"), a.get("startup_s"))
                           and (a.get(Attr.PARAMS, {}).get("compile_mode") or "none") == "none", once=True)
    return found if found is not None else _first_rounds_s(study)


def recorded_noise(study: optuna.Study) -> Noise | None:
    """The study's calibration (``StudyAttr.NOISE``), or None."""
    recorded = study.user_attrs.get(StudyAttr.NOISE)
    return Noise.stored(recorded) if recorded else None


__all__ = ["Budget", "estimate_s", "first_process_pairs_s", "in_process_estimate_s", "parse_duration",
           "recorded_noise", "started_estimate_s"]
