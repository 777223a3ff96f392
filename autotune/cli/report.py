"""``autotune report``: a study as one self-contained HTML file (opens offline: plotly is inline)."""
from __future__ import annotations

import argparse

from ..errors import one_line
from ._common import add_storage, printable, recipe_from, shown_url


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "report", help="write a study's report as one self-contained HTML file",
        description="Write one HTML file that opens offline (plotly inline): the machine's probe summary, the "
        "defaults against the best with the speedup and its interval, the fastest trials, the optimisation "
        "history, each knob's effect, parameter importances, the measured noise, infeasible and failed trials "
        "with their reasons, and where the budget went. Reads the storage only. Without --study or --recipe: "
        "the most recently active study.",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--study", default=None, metavar="NAME")
    which.add_argument("--recipe", default=None, metavar="ID|FILE", help="the study of a recipe id or exported file")
    p.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="where to write it (default: report-STUDY.html)")
    add_storage(p)
    p.set_defaults(func=run)


def default_path(study: str) -> str:
    """``report-STUDY.html`` in the working folder, the study's name made a plain file name (it comes from a store:
    ``x/../../escaped`` must not name a file elsewhere)."""
    from ..files import safe_name

    return f"report-{safe_name(study)}.html"


def run(args: argparse.Namespace) -> int:
    from ..errors import UsageError
    from ..report import write_report
    from ..study.summaries import summaries

    study = args.study
    if args.recipe:
        recipe = recipe_from(args.recipe, args.storage)
        if not recipe.study:
            raise UsageError(f"{recipe.label} names no study: give --study NAME")
        study = recipe.study
    if study is None:
        found = summaries(args.storage)
        if not found:
            raise UsageError(f"no study in {shown_url(args.storage)}: run 'autotune search' first")
        study = found[0].name
    path = write_report(args.storage, study, args.output or default_path(study))
    print(printable(f"report of study {one_line(study)} written to {path}"))  # a stored name: no line of its own
    return 0
