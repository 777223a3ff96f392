"""``autotune recipes``: the recipes in the storage, newest first (read-only)."""
from __future__ import annotations

import argparse

from ._common import add_storage, console, shown_url, to_json, when


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "recipes", help="list the stored recipes (id, workload, study, hardware, speedup, when)",
        description="List the recipes stored by searches, newest first; 'autotune best --recipe ID' shows one, "
        "'autotune diff A B' compares two. Reads the storage only.",
    )
    p.add_argument("--study", default=None, metavar="NAME", help="only this study's recipes")
    p.add_argument("--workload", default=None, metavar="W", help="only this workload's recipes")
    p.add_argument("--json", action="store_true", help="print a JSON list of the recipes (every key, as stored)")
    add_storage(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from ..recipe import problems
    from ..store import RecipeStore

    with RecipeStore.open(args.storage, readonly=True) as store:
        found = [r for r in store.all() if args.study in (None, r.study) and args.workload in (None, r.workload)]
    if args.json:
        print(to_json([r.to_dict() for r in found], indent=2, sort_keys=True))
        return 0
    out = console()
    if not found:
        filters = " for these filters" if args.study or args.workload else ""
        out.print(f"no recipe in {shown_url(args.storage)}{filters}: run 'autotune search' first", markup=False)
        return 0
    table = Table(title=f"recipes in {shown_url(args.storage)}")
    for column in ("id", "workload", "study", "hardware", "samples/s", "speedup", "created"):
        table.add_column(column, justify="right" if column in ("id", "samples/s", "speedup") else "left",
                         no_wrap=column == "speedup")
    for r in found:
        if problems(r):  # listed, not shown as a speed: 'autotune best --recipe ID' says what no search writes
            table.add_row(str(r.id), str(r.workload), str(r.study or "-"), str(r.fingerprint or "?"), "-", "refused",
                          "-")
            continue
        table.add_row(str(r.id), r.workload, r.study or "-", r.fingerprint or "?",
                      "-" if r.samples_per_s is None else f"{r.samples_per_s:.1f}",
                      r.speedup_text, when(r.created))
    out.print(table)
    return 0
