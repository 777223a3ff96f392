"""Where an arm's timed steps go: waiting for the next batch (the DataLoader's ``next()`` and the move to the
device), the forward pass with the loss, the backward pass, and the optimizer's step, timed by the clock around
each part and an optimizer step pre-hook between the last two. The rest of the windows' time (the loop's own,
the loss check) is ``other``: a breakdown that leaves much unexplained says so.

CPU only: a GPU runs behind the host, and timing its parts needs a synchronisation between them that changes
the step it times (CUDA events would not); there the breakdown is not measured.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

PARTS = ("data", "forward", "backward", "optimizer")
TOP = 8  # operators a profile names
# A profile's steps at most: its trace grows with every operator run, and summing it took minutes for 2 s of a tiny
# MLP's 1-ms steps (thousands of them); a GRU's 2-s profile of 50 steps of 6,000 operators each took 20 s to sum.
# Each step is now a profile of its own, summed at once (``profiled``).
PROFILE_STEPS = 50
MERGED = "backward+optimizer"  # an optimizer whose step runs no step hooks (a replaced ``step``): not told apart


class Phases:
    """Seconds per part over the timed steps; ``add`` takes the stamps of one micro-step."""

    def __init__(self, optimizer: Any = None, enabled: bool = False) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(PARTS, 0.0)
        self.enabled = enabled  # False: not measured (a GPU's)
        self.timing = False  # only the windows' steps count
        self._stepped_at: float | None = None
        hook = getattr(optimizer, "register_step_pre_hook", None) if enabled else None
        self._handle = hook(self._optimizer_starts) if hook is not None else None

    def start(self) -> None:
        self.timing = self.enabled

    def stop(self) -> None:
        self.timing = False

    def _optimizer_starts(self, *_: Any) -> None:
        self._stepped_at = time.perf_counter()

    def add(self, started: float, loaded: float, forward_done: float, done: float, stepped: bool) -> None:
        """One micro-step: its batch loaded at ``loaded``, its loss at ``forward_done``, done at ``done``."""
        if not self.timing:
            self._stepped_at = None
            return
        self.seconds["data"] += loaded - started
        self.seconds["forward"] += forward_done - loaded
        if not stepped:
            self.seconds["backward"] += done - forward_done
        elif self._stepped_at is not None:
            self.seconds["backward"] += self._stepped_at - forward_done
            self.seconds["optimizer"] += done - self._stepped_at
        else:
            self.seconds[MERGED] = self.seconds.get(MERGED, 0.0) + done - forward_done
        self._stepped_at = None

    def shares(self, windows_s: float) -> tuple[tuple[str, float], ...] | None:
        """Each part's share of the windows' time, and ``other`` (what no part explains); None before a window.

        >>> p = Phases(enabled=True); p.start(); p.add(0.0, 0.1, 0.4, 0.9, False)
        >>> p.shares(1.0)
        (('data', 0.1), ('forward', 0.3), ('backward', 0.5), ('optimizer', 0.0), ('other', 0.1))
        """
        if windows_s <= 0 or not self.enabled:
            return None
        parts = tuple((part, round(seconds / windows_s, 4)) for part, seconds in self.seconds.items())
        return (*parts, ("other", round(max(0.0, 1.0 - sum(s for _, s in parts)), 4)))

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()


def top_operators(averages: Any, top: int = TOP) -> tuple[tuple[str, float], ...]:
    """The ``top`` operators of a profile (``torch.profiler``'s ``key_averages()``) by their own time on the CPU,
    each with its share of all operators' own time: where a step's compute goes, by kernel."""
    return _ranked(_own(averages), top)


def _own(averages: Any) -> dict[str, float]:
    """Each operator's own CPU time in a profile's ``key_averages()``."""
    return {event.key: float(event.self_cpu_time_total) for event in averages if event.self_cpu_time_total > 0}


def _ranked(own: dict[str, float], top: int = TOP) -> tuple[tuple[str, float], ...]:
    total = sum(own.values())
    if total <= 0:
        return ()
    ranked = sorted(own.items(), key=lambda item: -item[1])[:top]
    return tuple((name, round(seconds / total, 4)) for name, seconds in ranked)


def profiled(step: Callable[[], Any], seconds: float) -> tuple[tuple[str, float], ...]:
    """``step()`` under torch's profiler for about ``seconds``: its top operators (``top_operators``). Each step is
    a profile of its own, summed at once, while the rest of ``seconds`` holds one more at the last one's price (at
    most ``PROFILE_STEPS``): a trace's summing grows faster than its steps (six steps summed together took 1.8
    times six single ones), so a profile of many steps priced from one overran its time 1.5-3 times."""
    start = time.perf_counter()
    totals: dict[str, float] = {}
    for _ in range(PROFILE_STEPS):
        began = time.perf_counter()
        for key, own in _profiled(step).items():
            totals[key] = totals.get(key, 0.0) + own
        now = time.perf_counter()
        if now - start + (now - began) > seconds:
            break
    return _ranked(totals)


def _profiled(step: Callable[[], Any]) -> dict[str, float]:
    """One step under torch's profiler: each operator's own time (``_own``)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        step()
    return _own(profiler.key_averages())
