"""The report's plots (plotly figures) from its data: history, per-knob effect, importances, where the time went."""
from __future__ import annotations

import html
import math
from collections import defaultdict
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..recipe import format_speedup
from ..search_spaces import RUN_KEYS

if TYPE_CHECKING:
    from plotly.graph_objects import Figure

    from ._data import ReportData, Row

COLORS = {"ok": "#1f77b4", "infeasible": "#d62728", "baseline": "#2ca02c"}


def _t(value: Any) -> str:
    """A study's text as plotly's labels take it: plotly draws a few HTML tags of its own (a link among them), so
    a stored knob name, value or role is escaped."""
    return html.escape(str(value))


def _error_bars(rows: list[Row]) -> dict[str, Any] | None:
    if not any(r.low is not None and r.high is not None for r in rows):
        return None
    return {"type": "data", "symmetric": False,
            "array": [(r.high - r.speedup) if r.high is not None and r.speedup is not None else 0 for r in rows],
            "arrayminus": [(r.speedup - r.low) if r.low is not None and r.speedup is not None else 0 for r in rows]}


def history(data: ReportData) -> Figure | None:
    """Each measured trial's speedup (with its interval where paired), the best so far, the defaults at 1, and what
    the recipe states (a busy start's demo stated 1.72x beside a history whose best so far never left 1.0)."""
    import plotly.graph_objects as go

    shown = [t for t in data.trials if t.speedup is not None and t.outcome in ("ok", "infeasible")]
    if not shown:
        return None
    fig = go.Figure()
    for outcome in ("ok", "infeasible"):
        rows = [t for t in shown if t.outcome == outcome]
        if rows:
            fig.add_trace(go.Scatter(
                x=[t.number for t in rows], y=[t.speedup for t in rows], mode="markers", name=outcome,
                marker={"color": COLORS[outcome], "size": 9, "symbol": "circle" if outcome == "ok" else "x"},
                error_y=_error_bars(rows), text=[_label(t) for t in rows], hovertemplate="%{text}<extra></extra>"))
    best, line = 0.0, []
    for t in shown:
        if t.outcome == "ok":
            best = max(best, t.speedup or 0.0)
        line.append(best or None)
    fig.add_trace(go.Scatter(x=[t.number for t in shown], y=line, mode="lines", name="best so far",
                             line={"shape": "hv", "color": "#ff7f0e"}))
    fig.add_hline(y=1.0, line_dash="dash", line_color="gray", annotation_text="PyTorch defaults")
    stated = data.recipe.speedup if data.recipe is not None else None
    if stated and stated != 1.0:  # what the recipe states (its own pairs), which no search trial's reading is
        fig.add_hline(y=stated, line_dash="dot", line_color="#2ca02c",
                      annotation_text=f"the recipe: {format_speedup(stated, None, None)} (stated)")
    fig.update_layout(title="Optimisation history", xaxis_title="trial", yaxis_title="speedup over the defaults (x)",
                      height=420, margin={"t": 50})
    return fig


def _label(t: Row) -> str:
    knobs = ", ".join(f"{_t(k)}={_t(v)}" for k, v in sorted(t.changed.items())) or "defaults"
    return f"trial {t.number} ({_t(t.role)}): {format_speedup(t.speedup, t.low, t.high)}<br>{knobs}"


def knob_effects(data: ReportData) -> Figure | None:
    """The speedup per value of each knob that took several values, from the feasible measured trials."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    ok = [t for t in data.trials if t.outcome == "ok" and t.speedup is not None]
    by_knob: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for t in ok:
        for knob, value in t.params.items():
            if knob not in RUN_KEYS:
                by_knob[_t(knob)][_t(value)].append(t.speedup or 0.0)
    knobs = sorted(k for k, values in by_knob.items() if len(values) > 1)
    if not knobs:
        return None
    cols = min(3, len(knobs))
    rows = math.ceil(len(knobs) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=knobs)
    for i, knob in enumerate(knobs):
        values = sorted(by_knob[knob].items())
        xs = [v for v, speeds in values for _ in speeds]
        ys = [s for _, speeds in values for s in speeds]
        fig.add_trace(go.Box(x=xs, y=ys, name=knob, boxpoints="all", showlegend=False, marker_color=COLORS["ok"]),
                      row=i // cols + 1, col=i % cols + 1)
    fig.update_layout(title="Per-knob effect: speedup over the defaults per value (feasible trials)",
                      height=max(320, 260 * rows), margin={"t": 80})
    return fig


def importances(data: ReportData) -> Figure | None:
    import plotly.graph_objects as go

    if not data.importances:
        return None
    items = sorted(data.importances.items(), key=lambda kv: kv[1])
    fig = go.Figure(go.Bar(x=[v for _, v in items], y=[_t(k) for k, _ in items], orientation="h"))
    fig.update_layout(title="Parameter importances (Optuna)", xaxis_title="importance",
                      height=max(260, 40 * len(items) + 120), margin={"t": 50})
    return fig


def budget(data: ReportData) -> Figure | None:
    """Where the time went, summed over every trial (confirmation runs included) and the noise calibration."""
    import plotly.graph_objects as go

    parts = budget_parts(data)
    if not any(parts.values()):
        return None
    fig = go.Figure(go.Bar(x=list(parts), y=[round(v, 1) for v in parts.values()],
                           text=[f"{v:.1f} s" for v in parts.values()], textposition="auto"))
    fig.update_layout(title="Where the budget went", yaxis_title="seconds", height=360, margin={"t": 50})
    return fig


def budget_parts(data: ReportData) -> dict[str, float]:
    """Seconds per part: start-up, warm-up/compile, timed windows, evaluation and the rest of each trial
    (its wall time less the others), and the A/A noise calibration."""
    parts = dict.fromkeys(("start-up", "warm-up/compile", "timed", "evaluation and other"), 0.0)
    for t in [*data.trials, *data.confirmations]:
        known = [t.startup_s or 0.0, t.warmup_s or 0.0, t.timed_s or 0.0]
        parts["start-up"] += known[0]
        parts["warm-up/compile"] += known[1]
        parts["timed"] += known[2]
        parts["evaluation and other"] += max(0.0, t.wall_s - sum(known))
    if data.noise is not None and data.noise.wall_s:
        parts["noise calibration"] = data.noise.wall_s
    return parts


def stepped(data: ReportData) -> list[tuple[str, Row]]:
    """The recipes whose step's parts were measured, as the report names them: the defaults, and the best. A
    sample's time is the recipe's own measurement where it has one (the rates its stated speedup is from, beside
    the defaults'), the parts' shares its search trial's: a busy start's step table read 3.7x beside a stated
    1.72x, from the search trials' rates."""
    recipe = data.recipe
    own = (recipe.baseline_samples_per_s, recipe.samples_per_s) if recipe is not None else (None, None)
    rows = [("PyTorch defaults", data.baseline, own[0])]
    if data.best is not None and data.baseline is not None and data.best.number != data.baseline.number:
        rows.append((f"best (trial {data.best.number})", data.best, own[1]))
    return [(name, replace(row, samples_per_s=rate) if rate else row) for name, row, rate in rows
            if row is not None and row.phases and row.samples_per_s]


def steps(data: ReportData) -> Figure | None:
    """One stacked bar per recipe: a sample's time in microseconds, split into the step's parts."""
    import plotly.graph_objects as go

    shown = stepped(data)
    if not shown:
        return None
    fig = go.Figure()
    for part in dict.fromkeys(p for _, row in shown for p in row.phases or {}):
        micro = [round(1e6 * (row.phases or {}).get(part, 0.0) / (row.samples_per_s or 1.0), 1) for _, row in shown]
        fig.add_trace(go.Bar(y=[_t(name) for name, _ in shown], x=micro, name=_t(part), orientation="h"))
    fig.update_layout(barmode="stack", title="Where a sample's time goes", xaxis_title="microseconds a sample",
                      height=160 + 60 * len(shown), margin={"t": 50})
    return fig


def figures(data: ReportData) -> list[Figure]:
    """Every plot the data allows, in the report's order."""
    return [f for f in (history(data), knob_effects(data), importances(data), steps(data), budget(data))
            if f is not None]


__all__ = ["budget", "budget_parts", "figures", "history", "importances", "knob_effects", "stepped", "steps"]
