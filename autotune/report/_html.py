"""The report as one self-contained HTML file: plotly's JavaScript inline once, no network needed to open it."""
from __future__ import annotations

import html
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..recipe import format_place, format_speedup, matmul_dtype
from . import _figures

if TYPE_CHECKING:
    from plotly.graph_objects import Figure

    from ..recipe import Recipe
    from ._data import ReportData, Row

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0; } td, th { padding: 0.25em 0.7em; text-align: left; }
th { background: #f0f0f0; } tr:nth-child(even) td { background: #fafafa; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; } .note { color: #555; }
.num { text-align: right; font-variant-numeric: tabular-nums; }
"""
TOP = 10  # trials in the table of the fastest
DATA_BOUND = 0.2  # a share of the step spent waiting for data that the report calls large, naming the knobs


def _e(value: Any) -> str:
    return html.escape(str(value))


def _knobs(changed: dict[str, Any]) -> str:
    return _e(", ".join(f"{k}={v}" for k, v in sorted(changed.items())) or "(the defaults)")


def speed(row: Row | None) -> str:
    """``1.42x [1.30-1.55]``, or ``1.42x`` for a trial measured before paired measurement (no interval)."""
    return "-" if row is None else format_speedup(row.speedup, row.low, row.high)


def place(data: ReportData, row: Row) -> str:
    """``41 GFLOP/s = 20% of the float32 matmul peak (205 GFLOP/s)``, or ``-`` where the FLOP were not counted."""
    return _e(format_place(row.samples_per_s, data.flop_per_sample, data.matmul_gflops, row.dtype) or "-")


def _recipe_place(data: ReportData, recipe: Recipe, row: Row, defaults: bool = False) -> str:
    """Where the recipe's (or beside it, the defaults') samples/s stand against the machine's matmul peak; a recipe
    stored without its rates: its trial's (``row``)."""
    rate = (recipe.baseline_samples_per_s if defaults else recipe.samples_per_s) or row.samples_per_s
    dtype = "float32" if defaults else matmul_dtype(recipe.params)
    return _e(format_place(rate, data.flop_per_sample, data.matmul_gflops, dtype) or "-")


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


class _Plots:
    """Figures as HTML divs; the first carries plotly.js (``include_plotlyjs=True``), the others use it."""

    def __init__(self) -> None:
        self.count = 0

    def div(self, figure: Figure | None, missing: str) -> str:
        if figure is None:
            return f'<p class="note">{_e(missing)}</p>'
        self.count += 1
        return figure.to_html(full_html=False, include_plotlyjs=self.count == 1, div_id=f"plot-{self.count}",
                              config={"displaylogo": False})


def render(data: ReportData, now: datetime | None = None) -> str:
    """The report's HTML text."""
    plots = _Plots()
    measure = ("paired: each trial's speedup over the defaults, measured in alternating windows, with its interval"
               if data.paired else "samples/s of each trial on its own (a study measured before paired measurement: "
               "speedups are ratios to the baseline's samples/s, without an interval)")
    parts = [
        f"<h1>autotune report: study {_e(data.study)}</h1>",
        f"<p>workload <b>{_e(data.workload)}</b>, hardware {_e(data.fingerprint)} ({_e(data.cpu_set or '-')}); "
        f"{len(data.trials)} trials, {len(data.confirmations)} confirmation runs; written "
        f"{_e((now or datetime.now().astimezone()).strftime('%Y-%m-%d %H:%M:%S %Z'))}.</p>",
        f'<p class="note">Measurement: {_e(measure)}.</p>',
        "<h2>The machine</h2>", f"<pre>{_e(data.probe)}</pre>",
        "<h2>Baseline and best</h2>", _summary(data),
        "<h2>Fastest trials</h2>", _top(data),
        "<h2>Optimisation history</h2>", plots.div(_figures.history(data), "No trial has a measured speed yet."),
        "<h2>Per-knob effect</h2>",
        plots.div(_figures.knob_effects(data), "No knob took more than one value in the feasible trials."),
        "<h2>Parameter importances</h2>", f'<p class="note">{_e(data.importance_note)}</p>',
        plots.div(_figures.importances(data), "") if data.importances else "",
        "<h2>Measured noise of this machine</h2>", _noise(data),
        "<h2>Where a step's time goes</h2>", _steps(data),
        plots.div(_figures.steps(data), "") if _figures.stepped(data) else "",
        "<h2>Infeasible and failed trials</h2>", _failures(data),
        "<h2>Where the budget went</h2>", _budget(data),
        plots.div(_figures.budget(data), "No trial recorded its timings."),
    ]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>autotune report: {_e(data.study)}</title><style>{STYLE}</style></head>\n"
            f"<body data-plots=\"{plots.count}\">\n" + "\n".join(parts) + "\n</body></html>\n")


def _summary(data: ReportData) -> str:
    base, best, recipe = data.baseline, data.best, data.recipe
    if base is None:
        return '<p class="note">The baseline (PyTorch defaults) has not completed: nothing to compare with.</p>'
    rows = [["PyTorch defaults", f"trial {base.number}", speed(base), place(data, base), "(the defaults)"]]
    if best is not None and best.number != base.number:
        rows.append(["best trial", f"trial {best.number}", speed(best), place(data, best), _knobs(best.changed)])
    if recipe is not None and recipe.speedup is not None and best is not None and best.number != base.number:
        # the stored recipe's own figures, as the console and ``autotune best`` state them: not the search trial's
        # (a busy start's trial read 3.9 GFLOP/s where the recipe's confirmation read 82)
        rows = [["PyTorch defaults", f"trial {base.number}", "1.00x", _recipe_place(data, recipe, base, True),
                 "(the defaults)"],
                ["the recipe", f"trial {best.number}", _e(recipe.speedup_text), _recipe_place(data, recipe, best),
                 _knobs(best.changed)]]
    text = _table(["", "trial", "speedup", "against the machine's limit", "differs from the defaults"], rows)
    if recipe is not None and recipe.speedup is not None:
        speedup = format_speedup(recipe.speedup, recipe.speedup_low, recipe.speedup_high)
        claim = f" ({recipe.claim_text})" if recipe.claim_text else ""
        run = f"; {recipe.run_text}" if recipe.run_text else ""
        text += (f"<p>Stored recipe {_e(recipe.id)}: <b>{_e(speedup)}</b> the defaults' speed{_e(claim)}{_e(run)}; "
                 "how it was chosen:</p>")
        text += "".join(f'<p class="note">{_e(note)}</p>' for note in recipe.notes)
    else:
        text += '<p class="note">No recipe stored for this study yet (the search has not finished).</p>'
    return text


def _top(data: ReportData) -> str:
    ok = sorted((t for t in data.trials if t.outcome == "ok" and t.speedup is not None),
                key=lambda t: -(t.speedup or 0.0))
    if not ok:
        return '<p class="note">No feasible trial yet.</p>'
    rows = [[str(t.number), _e(t.role), speed(t), place(data, t), f"{t.wall_s:.1f} s", _knobs(t.changed)]
            for t in ok[:TOP]]
    return _table(["trial", "role", "speedup", "against the machine's limit", "wall time", "differs from the defaults"],
                  rows)


def _noise(data: ReportData) -> str:
    n = data.noise
    if n is None:
        return ('<p class="note">Not measured: this study was searched before the A/A calibration '
                "(paired measurement) existed.</p>")
    low, high = n.aa[1], n.aa[2]
    # the noise line's own figures, as the console and ``autotune best`` print them (a busy start's A/A range of
    # 151% read beside a noise line of other figures)
    within = (["identical arms, their largest difference a window pair", f"{n.within:.1%}"] if n.within is not None
              else ["identical arms, their range (A/A, max - min)", f"{n.spread:.1%}"])
    rows = [["the defaults against themselves (A/A)", f"{n.aa[0]:.3f}x [{low:.3f}-{high:.3f}]"], within,
            *([["a process pair's ratio between fresh processes (standard deviation)", f"{n.between:.1%}"]]
              if n.between is not None else []),
            ["margin one worker's interval must clear (2% over rounds and your runs)", f"{n.margin:.1%}"],
            ["window", f"{n.window_s:.2f} s"], ["pairs per first round", _e(n.pairs)]]
    return f"<p>{_e(n.note())}.</p>" + _table(["", ""], rows)


def _steps(data: ReportData) -> str:
    """Each recipe's step split into its parts (shares of its timed windows), what waiting for data costs and
    which knobs act on it, and each profiled recipe's top operators."""
    shown = _figures.stepped(data)
    if not shown:
        return ('<p class="note">Not measured: on a GPU, or a study searched before the breakdown existed.</p>')
    parts = list(dict.fromkeys(p for _, row in shown for p in row.phases or {}))
    rows = [[_e(name), *(f"{(row.phases or {}).get(p, 0.0):.1%}" for p in parts),
             f"{1e6 / (row.samples_per_s or 1.0):.0f} µs"] for name, row in shown]
    text = _table(["", *parts, "a sample"], rows)
    waits = [(name, (row.phases or {}).get("data", 0.0)) for name, row in shown]
    heavy = [f"{name} {share:.0%}" for name, share in waits if share >= DATA_BOUND]
    if heavy:
        text += (f'<p>Waiting for data takes a large share of the step ({_e(", ".join(heavy))}): the DataLoader\'s '
                 "num_workers, pin_memory, prefetch_factor and persistent_workers act on it (searched as the "
                 "input knobs), and so does a cheaper dataset (decoding or augmenting once, ahead of training).</p>")
    profiled = [(name, row.operators) for name, row in shown if row.operators]
    if profiled:
        text += ("<p>The top entries by their own time in a short torch.profiler run, each a share of all entries' "
                 "own time: operators, and torch's own scopes (the DataLoader's next, the optimizer's step) where "
                 "their Python runs (a candidate is profiled when it is the fastest yet):</p>")
        names = list(dict.fromkeys(op for _, ops in profiled for op in ops or {}))
        text += _table(["operator or scope", *(name for name, _ in profiled)],
                       [[f"<code>{_e(op)}</code>", *(f"{ops[op]:.1%}" if op in (ops or {}) else "-"
                                                     for _, ops in profiled)] for op in names])
    return text


def _failures(data: ReportData) -> str:
    """The trials that were not ok, with their reasons; samples of a recipe measured before are counted, not listed
    (a long search has many: the in-process turn gives way after 5 in a row)."""
    bad = [t for t in data.trials if t.outcome not in ("ok", "not measured")]
    repeats = sum(1 for t in data.trials if t.outcome == "not measured")
    said = (f'<p class="note">{repeats} sample(s) repeated a recipe measured before: not measured again, the '
            "earlier trial's measurement stands.</p>") if repeats else ""
    if not bad:
        return '<p class="note">None.</p>' + said
    rows = [[str(t.number), _e(t.role), _e(t.outcome), _e(t.status), _e(t.reason or "-"), _knobs(t.changed)]
            for t in bad]
    return _table(["trial", "role", "outcome", "status", "reason", "differs from the defaults"], rows) + said


def _budget(data: ReportData) -> str:
    parts = _figures.budget_parts(data)
    total = sum(parts.values())
    rows = [[_e(name), f"{seconds:.1f} s", f"{seconds / total:.0%}" if total else "-"]
            for name, seconds in parts.items()]
    return _table(["part", "time", "share"], rows)


def write(data: ReportData, path: str | Path) -> Path:
    """Write the report to ``path`` (its folder must exist); returns the path."""
    from ..files import write_whole

    return write_whole(path, render(data))


__all__ = ["render", "speed", "write"]
