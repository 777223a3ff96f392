"""What ``autotune search`` shows while it runs: the live panel on a terminal, plain lines elsewhere, JSON lines."""
from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from autotune.cli._progress import JsonLines, LiveView, PlainLines
from autotune.search_spaces import SpaceContext
from autotune.study.events import Phase, SearchStarted, TrialFinished, TrialStarted
from autotune.trial import TrialResult

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
DEFAULTS = {"threads": 2, "compile_mode": "none", "batch_size": 32, "device": "cpu", "reference_batch": 32}


def _panel(screen: str, study: str) -> str:
    """The panel as last drawn, without colours, its columns' padding collapsed to one space."""
    return re.sub(r" +", " ", ANSI.sub("", screen).split(f"autotune search: study {study}")[-1])


def paired(speedup: float, low: float, high: float, status: str = "ok") -> TrialResult:
    return TrialResult(status, objective=speedup, speedup_low=low, speedup_high=high, method="in-process pairs",
                       pairs=8, wall_s=10.0)


def scripted(facts, budget_s: float | None = 1800.0) -> list:
    """A paired search as its events come: calibration, the baseline, a faster trial, then one of each outcome
    (infeasible by the quality guard, stopped early, crashed), and a compile trial still running."""
    started = SearchStarted("tiny-v2-x", facts, SpaceContext(default_batch_size=32), budget_s, False, DEFAULTS)
    fast = {**DEFAULTS, "threads": 1}
    compiled = {**DEFAULTS, "compile_mode": "default"}
    return [
        started, Phase("calibrating noise"),
        TrialStarted(0, "baseline", DEFAULTS), TrialFinished(0, "baseline", DEFAULTS, paired(1.0, 0.98, 1.02), None),
        TrialStarted(1, "seed", fast), Phase("paired windows", 1),
        TrialFinished(1, "seed", fast, paired(1.42, 1.30, 1.55), None),
        TrialFinished(2, "search", {**DEFAULTS, "batch_size": 128}, paired(1.8, 1.6, 2.0),
                      "loss 2.1 is +40% over the baseline's 1.5 (limit +5%)"),
        TrialFinished(3, "search", {**DEFAULTS, "threads": 4}, TrialResult("pruned", wall_s=3.0),
                      "slower than the defaults"),
        TrialFinished(4, "search", {**DEFAULTS, "threads": 3}, TrialResult("crash", wall_s=1.0), "killed by SIGSEGV"),
        TrialStarted(5, "search", compiled), Phase("compiling", 5),
    ]


def test_the_live_panel_shows_time_trial_phase_settings_best_and_counts(facts) -> None:
    now = [100.0]
    out = Console(file=io.StringIO(), force_terminal=True, width=140, color_system="standard")
    view = LiveView(out, clock=lambda: now[0])
    events = scripted(facts)
    view(events[0])
    assert view.live is not None and view.live.is_started
    for event in events[1:-1]:
        view(event)
    now[0] += 65.0
    view(events[-1])
    screen = out.file.getvalue()  # type: ignore[attr-defined]
    assert "\x1b[" in screen  # drawn for a terminal: colours and cursor moves to redraw the panel
    last = _panel(screen, "tiny-v2-x")
    assert "│ time 1m05s of 30m00s, 28m55s left │" in last
    assert "│ trial 5 search: compiling │" in last
    assert "│ settings compile_mode=default │" in last
    assert "│ best so far trial 1: 1.42x [1.30-1.55] the defaults' speed, threads=1 │" in last
    assert "│ trials 2 ok, 1 stopped early, 1 infeasible, 1 failed │" in last
    # the finished trials stay above the panel, one line each, with their reason
    assert "trial   2 search     ok          1.80x [1.60-2.00]" in ANSI.sub("", screen)
    assert "[loss 2.1 is +40% over the baseline's 1.5 (limit +5%)]" in ANSI.sub("", screen)
    view.close()
    assert view.live is None


def test_an_old_study_shows_speedups_over_the_baseline_without_interval(facts) -> None:
    out = Console(file=io.StringIO(), force_terminal=True, width=140)
    view = LiveView(out, clock=lambda: 0.0)
    started = SearchStarted("old", facts, SpaceContext(default_batch_size=32), None, True, DEFAULTS)
    for event in (started, TrialFinished(0, "baseline", DEFAULTS, TrialResult("ok", objective=100.0), None),
                  TrialFinished(1, "search", {**DEFAULTS, "threads": 1}, TrialResult("ok", objective=150.0), None)):
        view(event)
    last = _panel(out.file.getvalue(), "old")  # type: ignore[attr-defined]
    assert "│ time 0s (no time limit) │" in last
    assert "│ best so far trial 1: 1.50x the defaults' speed, threads=1 │" in last
    view.close()


def test_plain_lines_and_json_lines_from_the_same_events(facts) -> None:
    now = [0.0]
    out = Console(file=io.StringIO(), width=200)  # not a terminal
    plain, stream = PlainLines(out, clock=lambda: now[0]), io.StringIO()
    as_json = JsonLines(stream)
    for event in scripted(facts):
        now[0] += 1.0
        plain(event)
        as_json(event)
    lines = out.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert lines[:2] == ["study tiny-v2-x on cpu, budget 30m00s",
                         "PyTorch defaults: batch_size=32 compile_mode=none threads=2"]
    assert "[1s] calibrating noise" in lines and "[11s] trial 5: compiling" in lines
    assert "[10s] trial 5 search started: compile_mode=default" in lines
    assert not any("paired windows" in line for line in lines)  # a phase of every trial: not worth a log line
    assert sum(line.startswith("trial ") for line in lines) == 5  # one per finished trial
    objects = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [o["event"] for o in objects] == ["search_started", "phase", "trial_started", "trial_finished",
                                             "trial_started", "phase", "trial_finished", "trial_finished",
                                             "trial_finished", "trial_finished", "trial_started", "phase"]
    assert objects[6]["result"]["speedup_low"] == 1.30 and objects[6]["outcome"] == "ok"
    assert [o["outcome"] for o in objects[7:10]] == ["infeasible", "stopped early", "failed"]
    assert objects[9]["reason"] == "killed by SIGSEGV"


@pytest.mark.slow
def test_a_search_not_on_a_terminal_prints_plain_lines(live_search) -> None:
    folder, out = live_search
    assert "\x1b[" not in out.stdout  # no colour, no cursor moves: a log reads as it was written
    lines = out.stdout.splitlines()
    assert re.fullmatch(r"study sleepy-\S+ on cpu, budget 1m00s", lines[0]), lines[0]
    assert lines[1].startswith("PyTorch defaults: ")
    assert re.fullmatch(r"\[\d+s\] trial 0 baseline started: \(defaults\)", lines[2]), lines[2]
    assert re.fullmatch(r"\[\d+s\] trial 0: calibrating noise \(the defaults against themselves, in one process\)",
                        lines[3]), lines[3]  # the long phases have a line each
    assert re.fullmatch(r"trial   0 baseline   ok +1\.00x \[\d\.\d\d-\d\.\d\d\] .*", lines[4]), lines[4]
    assert re.fullmatch(r"\[\d+s\] trial 1 \S+ started: .+", lines[5]), lines[5]
    report = Path(lines[-1].removeprefix("report: "))
    assert lines[-1].startswith("report: ") and report.is_file() and report.parent == folder


# --json's live test is the search that readers poll (tests/test_read_while_searching.py).


def test_one_process_pairs_unbounded_interval_is_strict_json_and_said_in_words(facts) -> None:
    """One process pair gives no interval (``stats.log_mean_interval``: 0 to infinity): the JSON line holds null,
    which jq and ``JSON.parse`` read (Python's ``Infinity`` they refuse), and the log line says so in words."""
    one = TrialResult("ok", objective=0.97, speedup_low=0.0, speedup_high=float("inf"), method="process pairs",
                      pairs=1, wall_s=12.0)
    event = TrialFinished(1, "search", {**DEFAULTS, "threads": 1}, one, None)
    stream, out = io.StringIO(), Console(file=io.StringIO(), width=200)
    JsonLines(stream)(event)
    PlainLines(out, clock=lambda: 0.0)(event)

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    line = json.loads(stream.getvalue(), parse_constant=refuse)
    assert (line["result"]["speedup_low"], line["result"]["speedup_high"]) == (0.0, None)
    assert "0.97x [no interval: one measurement]" in out.file.getvalue()  # type: ignore[attr-defined]


def test_a_warning_logged_under_the_live_panel_is_printed_above_it(facts) -> None:
    import logging
    import sys

    out = Console(file=io.StringIO(), force_terminal=True, width=140)
    handler = logging.StreamHandler(sys.stderr)  # as the CLI's logging.basicConfig sets it up
    before = handler.stream
    logging.getLogger().addHandler(handler)
    try:
        view = LiveView(out, clock=lambda: 0.0)
        view(scripted(facts)[0])
        logging.getLogger("autotune.study.loop").warning("trial 3 was left running by a search that died")
        assert "trial 3 was left running by a search that died" in out.file.getvalue()  # type: ignore[attr-defined]
        view.close()
        assert handler.stream is before  # as it was once the panel is gone
    finally:
        logging.getLogger().removeHandler(handler)


def test_the_panels_title_prints_a_studys_name_as_text() -> None:
    """A study's name is the user's or a shared store's: a string title is read as markup, escapes and all."""
    from autotune.cli._progress import Board, render

    out = Console(file=io.StringIO(), force_terminal=False, width=120)
    out.print(render(Board(study="[red]x[/red]\x1b]0;pwned\x07")))
    screen = out.file.getvalue()  # type: ignore[attr-defined]
    assert "autotune search: study [red]x[/red]]0;pwned" in screen and "\x1b" not in screen and "\x07" not in screen
