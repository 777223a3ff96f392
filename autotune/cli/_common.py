"""Pieces the verbs share: storage flag, recipe lookup, rich console."""
from __future__ import annotations

import argparse
import json
import math
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..database import DEFAULT_STORAGE, STORAGE_VARIABLE, default_storage, shown_url
from ..errors import printable
from ..statement_limit import LIMIT_S, LIMIT_VARIABLE

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from ..recipe import Recipe
    from ..store import RecipeStore


def add_storage(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--storage", default=default_storage(), metavar="URL",
        help=f"SQLAlchemy URL of the study and recipe database (default: ${STORAGE_VARIABLE}, else {DEFAULT_STORAGE}; "
        "postgresql+psycopg://user@host/db to share studies between machines, its password from libpq's "
        f"PGPASSWORD or ~/.pgpass; a statement PostgreSQL does not answer within {LIMIT_S:g} s ends the command: "
        f"{LIMIT_VARIABLE}=SECONDS gives it longer)",
    )


def to_json(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` as the verbs print JSON: strict JSON (RFC 8259), a float that is not finite written as
    ``null``. One process pair's interval is unbounded above, which Python writes as ``Infinity``: jq and
    JavaScript's ``JSON.parse`` refuse the line.

    >>> to_json({"speedup_low": 0.0, "speedup_high": float("inf"), "pairs": [1.0, float("nan")]})
    '{"speedup_low": 0.0, "speedup_high": null, "pairs": [1.0, null]}'
    """
    return json.dumps(_finite(value), allow_nan=False, **kwargs)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def console(stderr: bool = False) -> Console:
    """Rich's console, for text a store or a file holds: no markup (a study named ``[/bold]`` is text, not a
    style), and every string it renders (tables, titles, lines) stripped of control characters (``printable``).
    Written to a file or pipe (CI logs, tests) it is 120 columns wide rather than rich's 80, so tables are not
    wrapped mid-word. ``COLUMNS`` still decides where set."""
    import os
    import sys

    from rich.console import Console

    class Plain(Console):
        def render_str(self, text: str, **kwargs: Any) -> Any:
            return super().render_str(printable(text), **{**kwargs, "markup": False})

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 120
    return Plain(stderr=stderr, highlight=False, markup=False, width=width)


def find_recipe(args: argparse.Namespace) -> Recipe:
    """The recipe a verb works on: ``--recipe ID|FILE``, else the latest in the storage (``--study``/``--workload``).
    The storage is opened read-only: looking for a recipe creates no database."""
    from ..errors import UsageError
    from ..recipe import checked
    from ..store import RecipeStore

    source = getattr(args, "recipe", None)
    if source:
        return recipe_from(source, args.storage)
    study, workload = getattr(args, "study", None), getattr(args, "workload", None)
    with RecipeStore.open(args.storage, readonly=True) as store:
        recipe = store.latest(study=study, workload=workload)
        if recipe is None:
            raise UsageError(_no_recipe(store, args.storage, study, workload))
    return checked(recipe)


def recipe_from(source: str, storage: str) -> Recipe:
    """A recipe named on the command line, checked (``recipe.checked``): a stored recipe's id, or an exported file
    (read-only)."""
    from ..recipe import checked
    from ..recipe_file import load_recipe_file
    from ..store import RecipeStore

    if not (source.isascii() and source.isdigit()):
        return load_recipe_file(source)
    with RecipeStore.open(storage, readonly=True) as store:
        return checked(store.get(int(source)))


def foreign_preload(source: str | None) -> str | None:
    """Where ``source`` is an exported env file whose ``LD_PRELOAD`` names a library outside the folders where this
    machine's libraries lie (``probes.preloadable``): the line that says what loading it in bash would preload;
    else None (a stored recipe's id, a JSON file, a file that preloads only this machine's libraries)."""
    from .. import probes
    from ..recipe_file import sourced_preload

    if not source or (source.isascii() and source.isdigit()):
        return None
    strange = [p for p in (sourced_preload(source) or "").split(":") if p and not probes.preloadable(p)]
    if not strange:
        return None
    return (f"{source}: LD_PRELOAD names {strange[0][:120]!r}, not a library where this machine's libraries lie: "
            "loaded in bash the file would preload it; export the recipe here (autotune export --format env)")


def when(moment: datetime | str | None) -> str:
    """A time as the verbs print it: this machine's local time, with its zone (``2025-06-01 14:03:07 CEST``)."""
    if moment is None:
        return "-"
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    local = moment.astimezone()  # a naive time is taken as local already
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname() or local.strftime('%z')}"


def _no_recipe(store: RecipeStore, storage: str, study: str | None, workload: str | None) -> str:
    """Why no recipe matched: an empty database, or the filters, with what the database does hold."""
    if store.latest() is None:
        return f"no recipe in {shown_url(storage)}: run 'autotune search' first"
    asked = " and ".join(f"{what} {value}" for what, value in (("study", study), ("workload", workload)) if value)
    held = [f"{what} with recipes: {_listed(names)}"
            for what, names, given in (("studies", store.studies(), study), ("workloads", store.workloads(), workload))
            if given]
    return f"no recipe for {asked}; {'; '.join(held)}"


def _listed(names: list[str], limit: int = 10) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def knobs(params: dict[str, Any]) -> dict[str, Any]:
    """A recipe's knobs: its params without the run settings every trial of its search shared
    (``search_spaces.RUN_KEYS``: device, reference batch, lr rule, membind), which are not choices."""
    from ..search_spaces import RUN_KEYS

    return {k: v for k, v in params.items() if k not in RUN_KEYS}


def params_table(params: dict[str, Any], title: str, defaults: dict[str, Any] | None = None) -> Table:
    """The knobs of a recipe; with ``defaults``, those that differ are marked ``*`` with the default beside."""
    from rich.table import Table

    table = Table(title=title, show_header=True)
    table.add_column("knob")
    table.add_column("value")
    if defaults is not None:
        table.add_column("PyTorch default")
    shown = knobs(params)
    for key in sorted(shown):
        if defaults is None:
            table.add_row(key, str(shown[key]))
        elif key in defaults and defaults[key] != shown[key]:
            table.add_row(f"* {key}", str(shown[key]), str(defaults[key]), style="bold")
        else:
            table.add_row(f"  {key}", str(shown[key]), "" if key in defaults else "?")
    return table


def command_after_dashes(args: argparse.Namespace) -> list[str]:
    """The command given after ``--`` (``autotune run``, script mode's ``autotune search``), without the ``--``."""
    command: list[str] = args.command
    return command[1:] if command[:1] == ["--"] else command
