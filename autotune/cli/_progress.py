"""What ``autotune search`` shows while it runs, from the search's typed events (``autotune.study.events``).

``Board`` keeps what the events told so far (elapsed and left of the budget, the trial and its phase, the best
feasible trial with its speedup and interval, the counts of outcomes); three views print it:

- ``LiveView``: on a terminal, one rich Live panel redrawn as events come and every second (the clock);
- ``PlainLines``: elsewhere (CI, ``| tee``, ``nohup``), one line per event that matters;
- ``JsonLines``: ``--json``, one JSON object per event (``"event"``: its name) for scripts.

Speedups: a paired study's trial values are speedups over the defaults with an interval (``speedup_low``,
``speedup_high``); a study measured before (samples/s, no interval) shows the ratio to the baseline's samples/s.
"""
from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from ..errors import one_line, printable
from ..recipe import format_speedup
from ..search_spaces import BASELINE, RUN_KEYS  # RUN_KEYS: shared by every trial of a search: not a trial's settings
from ..study.events import Event, Phase, SearchDone, SearchStarted, TrialFinished, TrialStarted
from ..study.records import CONFIRM
from ..trial.spec import Status, TrialResult
from ._common import to_json

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.live import Live

PLAIN_PHASES = ("calibrating noise", "compiling", "confirming", "input-bound", "your runs")  # worth a line of a log
OUTCOMES = ("ok", "stopped early", "infeasible", "failed", "cut by the budget")


def outcome(result: TrialResult, reason: str | None) -> str:
    """Which count a finished trial goes to: ok, stopped early (pruned), infeasible (a measured trial the
    quality guard or a knob not in effect rejects; out of memory; NaN loss), cut by the budget (its end stopped it) or
    failed (crash, its own time limit, Ctrl-C)."""
    if result.status == Status.OK:
        return "infeasible" if reason else "ok"
    if result.status == Status.PRUNED:
        return "stopped early"
    if result.status in (Status.OOM, Status.NAN, Status.SKIPPED):
        return "infeasible"
    if result.status == Status.CUT:
        return "cut by the budget"
    return "failed"


def changed(params: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The knobs of ``params`` that differ from PyTorch's defaults (run settings left out)."""
    return {k: v for k, v in params.items() if k not in RUN_KEYS and defaults.get(k) != v}


def knobs_text(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(params.items())) or "(defaults)"


def duration(seconds: float) -> str:
    """``75`` -> ``1m15s``; ``3725`` -> ``1h02m05s``."""
    s = max(0, int(round(seconds)))
    h, m, s = s // 3600, s // 60 % 60, s % 60
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


@dataclass(frozen=True)
class Speedup:
    value: float
    low: float | None = None
    high: float | None = None

    def __str__(self) -> str:
        return format_speedup(self.value, self.low, self.high)


@dataclass
class Board:
    """The search as its events told it so far."""

    clock: Callable[[], float] = time.monotonic
    study: str = ""
    budget_s: float | None = None
    started: float | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    trial: TrialStarted | None = None
    phase: str = ""
    baseline_objective: float | None = None  # samples/s of a study measured before paired measurement
    best: tuple[int, dict[str, Any], Speedup] | None = None
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    confirmation_runs: int = 0
    done: bool = False

    def update(self, event: Event) -> None:
        if isinstance(event, SearchStarted):
            self.study, self.budget_s, self.defaults = event.study, event.budget_s, event.defaults
            self.started = self.clock()
        elif isinstance(event, TrialStarted):
            self.trial, self.phase = event, "confirming" if event.role == CONFIRM else "starting"
        elif isinstance(event, Phase):
            self.phase = event.name
        elif isinstance(event, TrialFinished):
            self._finished(event)
        elif isinstance(event, SearchDone):
            self.trial, self.phase, self.done = None, "done", True

    def _finished(self, event: TrialFinished) -> None:
        self.trial, self.phase = None, ""
        if event.role == CONFIRM:
            self.confirmation_runs += 1
            return
        kind = outcome(event.result, event.reason)
        self.counts[kind] += 1
        r = event.result
        if event.role == BASELINE and r.status == Status.OK and r.method is None and r.speedup_low is None:
            self.baseline_objective = r.objective
        speed = self.speedup(r)
        if kind == "ok" and speed is not None and (self.best is None or speed.value > self.best[2].value):
            self.best = (event.number, event.params, speed)

    def speedup(self, r: TrialResult) -> Speedup | None:
        """A trial's speedup over the defaults: measured paired, or its samples/s over the baseline's."""
        if r.objective is None:
            return None
        if r.speedup_low is not None or r.method is not None:
            return Speedup(r.objective, r.speedup_low, r.speedup_high)
        if self.baseline_objective:
            return Speedup(r.objective / self.baseline_objective)
        return None

    def elapsed(self) -> float:
        return 0.0 if self.started is None else self.clock() - self.started


def render(board: Board) -> RenderableType:
    """The live panel: time, the running trial, the best so far, the counts."""
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    elapsed = board.elapsed()
    if board.budget_s:
        left = max(0.0, board.budget_s - elapsed)
        grid.add_row("time", f"{duration(elapsed)} of {duration(board.budget_s)}, {duration(left)} left")
    else:
        grid.add_row("time", f"{duration(elapsed)} (no time limit)")
    if board.trial is not None:
        t = board.trial
        grid.add_row(f"trial {t.number}", f"{t.role}: {board.phase or 'starting'}")
        grid.add_row("settings", knobs_text(changed(t.params, board.defaults)))
    elif board.phase:
        grid.add_row("now", board.phase)
    if board.best is not None:
        number, params, speed = board.best
        grid.add_row("best so far", f"trial {number}: {speed} the defaults' speed, "
                     f"{knobs_text(changed(params, board.defaults))}")
    else:
        grid.add_row("best so far", "-")
    counts = ", ".join(f"{n} {name}" for name, n in board.counts.items() if n or name != "cut by the budget")
    if board.confirmation_runs:
        counts += f"; {board.confirmation_runs} confirmation run(s)"
    grid.add_row("trials", counts)
    title = Text(one_line(printable(f"autotune search: study {board.study}")))  # a title string is read as markup
    return Panel(grid, title=title, title_align="left", expand=False)


class LiveView:
    """On a terminal: the board in a rich Live panel, redrawn on every event and each second."""

    def __init__(self, out: Console, clock: Callable[[], float] = time.monotonic) -> None:
        self.out, self.board = out, Board(clock=clock)
        self.live: Live | None = None
        self.log_streams: list[tuple[logging.StreamHandler[Any], Any]] = []

    def __call__(self, event: Event) -> None:
        from rich.live import Live

        self.board.update(event)
        if isinstance(event, SearchStarted) and self.live is None:
            stderr = sys.stderr
            self.live = Live(console=self.out, get_renderable=lambda: render(self.board), refresh_per_second=1)
            self.live.start()  # replaces sys.stderr by a proxy that prints above the panel
            self._logs_through(stderr, sys.stderr)
        if isinstance(event, TrialFinished) and event.role != CONFIRM:
            # printed above the panel, where it stays
            self.out.print(finished_line(self.board, event), markup=False, highlight=False, soft_wrap=True)
        if self.live is not None:
            self.live.refresh()
        if isinstance(event, SearchDone):
            self.close()

    def _logs_through(self, stderr: Any, proxy: Any) -> None:
        """The log handlers that write to stderr write through ``proxy`` while the panel is up: a warning
        of the search is printed above the panel instead of through it (a handler keeps the stream it was
        given, so Live's swap of ``sys.stderr`` alone does not reach it)."""
        if proxy is stderr:
            return
        for handler in logging.getLogger().handlers:
            if type(handler) is logging.StreamHandler and handler.stream is stderr:
                self.log_streams.append((handler, handler.setStream(proxy)))

    def close(self) -> None:
        for handler, stream in self.log_streams:
            handler.setStream(stream)
        self.log_streams = []
        if self.live is not None:
            self.live.stop()
            self.live = None


class PlainLines:
    """Not a terminal: one plain line per event that matters (no cursor movement, nothing redrawn)."""

    def __init__(self, out: Console, clock: Callable[[], float] = time.monotonic) -> None:
        self.out, self.board = out, Board(clock=clock)

    def __call__(self, event: Event) -> None:
        self.board.update(event)
        line = None
        if isinstance(event, SearchStarted):
            budget = f"budget {duration(event.budget_s)}" if event.budget_s else "no time limit"
            resumed = " (continued)" if event.resumed else ""
            self.out.print(f"study {event.study}{resumed} on {event.context.device}, {budget}", markup=False)
            line = "PyTorch defaults: " + knobs_text({k: v for k, v in event.defaults.items() if k not in RUN_KEYS})
        elif isinstance(event, TrialStarted):
            line = (f"[{duration(self.board.elapsed())}] trial {event.number} {event.role} started: "
                    f"{knobs_text(changed(event.params, self.board.defaults))}")
        elif isinstance(event, Phase) and event.name in PLAIN_PHASES:
            which = f"trial {event.trial}: " if event.trial is not None else ""
            detail = f" ({event.detail})" if event.detail else ""
            line = f"[{duration(self.board.elapsed())}] {which}{event.name}{detail}"
        elif isinstance(event, TrialFinished):
            line = finished_line(self.board, event)
        if line:
            self.out.print(line, markup=False, soft_wrap=True, highlight=False)

    def close(self) -> None:
        """Nothing to stop."""


def finished_line(board: Board, event: TrialFinished) -> str:
    """One finished trial: status, speed (speedup with interval, or samples/s), time, changed knobs, why."""
    r = event.result
    speed = board.speedup(r)
    if r.speedup_low is not None or r.method is not None:
        shown = f"{speed}" if speed else "-"
    else:
        shown = f"{r.objective:9.1f} samples/s" if r.objective else f"{'-':>9} samples/s"
        shown += f" ({speed})" if speed and event.role != BASELINE else ""
    setup = f" (startup {r.startup_s:.1f}s, warm-up {r.warmup_s:.1f}s)" if r.startup_s and r.warmup_s else ""
    why = f"  [{event.reason}]" if event.reason else ""
    return (f"trial {event.number:3d} {event.role:<10} {r.status:<11} {shown} {r.wall_s:5.1f}s{setup}  "
            f"{knobs_text(changed(event.params, board.defaults))}{why}")


class JsonLines:
    """``--json``: one JSON object per event on ``stream``, ``"event"`` naming it (the final result is written
    by the CLI after the search, as the last line)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def __call__(self, event: Event) -> None:
        data = event_dict(event)
        if data is not None:
            self.emit(data)

    def emit(self, data: dict[str, Any]) -> None:
        self.stream.write(to_json(data, default=str) + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Nothing to stop."""


def event_dict(event: Event) -> dict[str, Any] | None:
    """An event as the JSON object ``--json`` prints; None for ``SearchDone`` (the result line replaces it)."""
    if isinstance(event, SearchStarted):
        return {"event": "search_started", "study": event.study, "fingerprint": event.facts.fingerprint,
                "device": event.context.device, "budget_s": event.budget_s, "resumed": event.resumed,
                "defaults": event.defaults}
    if isinstance(event, TrialStarted):
        return {"event": "trial_started", "number": event.number, "role": event.role, "params": event.params}
    if isinstance(event, Phase):
        return {"event": "phase", "name": event.name, "trial": event.trial, "detail": event.detail}
    if isinstance(event, TrialFinished):
        result = {k: v for k, v in event.result.to_dict().items() if k != "log_tail"}
        return {"event": "trial_finished", "number": event.number, "role": event.role, "params": event.params,
                "outcome": outcome(event.result, event.reason), "reason": event.reason, "result": result}
    return None


__all__ = ["Board", "JsonLines", "LiveView", "PlainLines", "Speedup", "event_dict", "render"]
