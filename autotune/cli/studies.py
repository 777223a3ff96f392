"""``autotune studies``: the studies in the storage, newest activity first (read-only)."""
from __future__ import annotations

import argparse

from ..recipe import format_speedup
from ._common import add_storage, console, shown_url, to_json, when


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "studies", help="list the studies in the storage (workload, hardware, trials, best speedup, when)",
        description="List the studies of the storage: workload, hardware fingerprint, measured trials (and "
        "running ones), best speedup over PyTorch's defaults (the stored recipe's; marked '?' where it is not "
        "confirmed: the best single measurement so far, or a recipe whose speedup is provisional, the search's own "
        "or stored before autotune kept its claim), when it was last active (--json: also when it began). "
        "Reads the storage only, also while a search writes to it.",
    )
    p.add_argument("--json", action="store_true", help="print a JSON list (times in ISO 8601 with their zone)")
    add_storage(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from ..study.summaries import summaries

    found = summaries(args.storage)
    if args.json:
        print(to_json([s.to_dict() for s in found], indent=2))
        return 0
    out = console()
    if not found:
        out.print(f"no study in {shown_url(args.storage)}: run 'autotune search' first", markup=False)
        return 0
    table = Table(title=f"studies in {shown_url(args.storage)}")
    for column in ("study", "workload", "hardware", "trials", "best speedup", "recipe", "last active"):
        table.add_column(column, justify="right" if column in ("trials", "best speedup", "recipe") else "left",
                         overflow="fold", no_wrap=column in ("hardware", "best speedup"))
    for s in found:
        trials = f"{s.trials}" + (f" (+{s.running} running)" if s.running else "")
        speedup = format_speedup(s.speedup, s.speedup_low, s.speedup_high) + ("" if s.confirmed or s.speedup is None
                                                                               else " ?")
        table.add_row(s.name, s.workload or "?", s.fingerprint or "?", trials, speedup,
                      "-" if s.recipe is None else str(s.recipe), when(s.last))
    out.print(table)
    if any(s.speedup is not None and not s.confirmed for s in found):
        out.print("?: not confirmed side by side with the defaults over two rounds of fresh processes (the best single "
                  "measurement so far; or the recipe's claim: 'autotune best' says it)", markup=False)
    return 0
