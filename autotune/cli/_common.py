"""Pieces the verbs share: storage flag, recipe lookup, rich console."""
from __future__ import annotations

import argparse
from typing import Any

from ..store import DEFAULT_STORAGE


def add_storage(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--storage", default=DEFAULT_STORAGE, metavar="URL",
        help=f"SQLAlchemy URL of the study and recipe database (default: {DEFAULT_STORAGE}; "
        "postgresql+psycopg://user@host/db to share studies between machines)",
    )


def console(stderr: bool = False) -> Any:
    """Rich's console; written to a file or pipe (CI logs, tests) it is 120 columns wide rather than rich's 80,
    so tables are not wrapped mid-word. ``COLUMNS`` still decides where set."""
    import os
    import sys

    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 120
    return Console(stderr=stderr, highlight=False, width=width)


def find_recipe(args: argparse.Namespace) -> Any:
    """The recipe a verb works on: ``--recipe ID|FILE``, else the latest in the storage (``--study``/``--workload``)."""
    from ..errors import UsageError
    from ..recipe import load_recipe_file
    from ..store import RecipeStore

    source = getattr(args, "recipe", None)
    if source and not source.isdigit():
        return load_recipe_file(source)
    with RecipeStore.open(args.storage) as store:
        if source:
            return store.get(int(source))
        recipe = store.latest(study=getattr(args, "study", None), workload=getattr(args, "workload", None))
    if recipe is None:
        raise UsageError(f"no recipe in {args.storage}: run 'autotune search' first")
    return recipe


def params_table(params: dict[str, Any], title: str) -> Any:
    from rich.table import Table

    table = Table(title=title, show_header=True)
    table.add_column("knob")
    table.add_column("value")
    for key in sorted(params):
        table.add_row(key, str(params[key]))
    return table
