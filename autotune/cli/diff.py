"""``autotune diff A B``: two recipes side by side: the knobs that differ and the speeds each measured."""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..errors import one_line
from ._common import add_storage, console, foreign_preload, knobs, recipe_from, when

if TYPE_CHECKING:
    from ..recipe import Recipe

_MISSING = "(not set)"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "diff", help="compare two recipes (ids or files): the knobs that differ and their measured speeds",
        description="Example: autotune diff 3 best.env. Shows the knobs whose values differ and each recipe's "
        "measured samples/s, its baseline's and its speedup. Speeds measured on other hardware or for another "
        "workload are not comparable: that is said. Reads the storage only.",
    )
    p.add_argument("a", metavar="A", help="a recipe id or an exported file (.env or .json)")
    p.add_argument("b", metavar="B", help="the recipe to compare it with")
    add_storage(p)
    p.set_defaults(func=run)


def differing(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The knobs (run settings left out) whose values differ: knob -> (A's value, B's value)."""
    a, b = knobs(a), knobs(b)
    return {k: (a.get(k, _MISSING), b.get(k, _MISSING)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)
            or (k in a) != (k in b)}


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    a, b = recipe_from(args.a, args.storage), recipe_from(args.b, args.storage)
    out = console()
    table = Table(title=f"{a.label} vs {b.label}")
    for column in ("", "A: " + a.label, "B: " + b.label):
        table.add_column(column)
    for name, show in (("workload", lambda r: r.workload), ("study", lambda r: r.study or "-"),
                       ("hardware", lambda r: r.fingerprint or "?"), ("created", lambda r: when(r.created)),
                       ("samples/s", lambda r: _speed(r.samples_per_s)),
                       ("defaults' samples/s", lambda r: _speed(r.baseline_samples_per_s)),
                       ("speedup", lambda r: r.speedup_text)):
        table.add_row(name, show(a), show(b))
    changed = differing(a.params, b.params)
    table.add_section()
    for knob, (value_a, value_b) in changed.items():
        table.add_row(knob, str(value_a), str(value_b), style="bold")
    out.print(table)
    same = len(knobs(a.params).keys() & knobs(b.params).keys()) - sum(
        1 for va, vb in changed.values() if _MISSING not in (va, vb))
    out.print(f"{len(changed)} knob(s) differ, {same} the same", markup=False)
    for why in _not_comparable(a, b):
        out.print(f"note: {why}", markup=False, soft_wrap=True)
    for preload in filter(None, map(foreign_preload, (args.a, args.b))):  # what sourcing it would do
        out.print(f"warning: {one_line(preload)}", markup=False, soft_wrap=True)
    return 0


def _speed(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _not_comparable(a: Recipe, b: Recipe) -> list[str]:
    notes = []
    if a.fingerprint != b.fingerprint:
        notes.append(f"measured on different hardware ({a.fingerprint} vs {b.fingerprint}): compare speedups, "
                     "not samples/s")
    if a.workload != b.workload:
        notes.append(f"different workloads ({a.workload} vs {b.workload}): their speeds are not comparable")
    return notes
