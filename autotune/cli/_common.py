"""Pieces the verbs share: storage flag, recipe lookup, rich console."""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..store import DEFAULT_STORAGE

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from ..recipe import Recipe
    from ..store import RecipeStore


def add_storage(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--storage", default=DEFAULT_STORAGE, metavar="URL",
        help=f"SQLAlchemy URL of the study and recipe database (default: {DEFAULT_STORAGE}; "
        "postgresql+psycopg://user@host/db to share studies between machines)",
    )


def console(stderr: bool = False) -> Console:
    """Rich's console; written to a file or pipe (CI logs, tests) it is 120 columns wide rather than rich's 80,
    so tables are not wrapped mid-word. ``COLUMNS`` still decides where set."""
    import os
    import sys

    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 120
    return Console(stderr=stderr, highlight=False, width=width)


def find_recipe(args: argparse.Namespace) -> Recipe:
    """The recipe a verb works on: ``--recipe ID|FILE``, else the latest in the storage (``--study``/``--workload``).
    The storage is opened read-only: looking for a recipe creates no database."""
    from ..errors import UsageError
    from ..recipe import load_recipe_file
    from ..store import RecipeStore

    source = getattr(args, "recipe", None)
    if source and not source.isdigit():
        return load_recipe_file(source)
    study, workload = getattr(args, "study", None), getattr(args, "workload", None)
    with RecipeStore.open(args.storage, readonly=True) as store:
        if source:
            return store.get(int(source))
        recipe = store.latest(study=study, workload=workload)
        if recipe is None:
            raise UsageError(_no_recipe(store, args.storage, study, workload))
    return recipe


def _no_recipe(store: RecipeStore, storage: str, study: str | None, workload: str | None) -> str:
    """Why no recipe matched: an empty database, or the filters, with what the database does hold."""
    if store.latest() is None:
        return f"no recipe in {storage}: run 'autotune search' first"
    asked = " and ".join(f"{what} {value}" for what, value in (("study", study), ("workload", workload)) if value)
    held = [f"{what} with recipes: {_listed(names)}"
            for what, names, given in (("studies", store.studies(), study), ("workloads", store.workloads(), workload))
            if given]
    return f"no recipe for {asked}; {'; '.join(held)}"


def _listed(names: list[str], limit: int = 10) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def params_table(params: dict[str, Any], title: str) -> Table:
    from rich.table import Table

    table = Table(title=title, show_header=True)
    table.add_column("knob")
    table.add_column("value")
    for key in sorted(params):
        table.add_row(key, str(params[key]))
    return table
