"""``autotune export``: write the recipe as an env file (``set -a; . ./best.env; set +a``) or JSON."""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ._common import add_storage, find_recipe, printable, to_json

if TYPE_CHECKING:
    from ..recipe import Recipe


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("export", help="write the best recipe as an env file or JSON")
    p.add_argument("--format", choices=("env", "json"), default="env", help="env (default) or json")
    p.add_argument("-o", "--output", default=None, metavar="FILE", help="write here instead of standard output")
    p.add_argument("--recipe", default=None, metavar="ID|FILE", help="a recipe id (default: the latest)")
    p.add_argument("--study", default=None, metavar="NAME")
    p.add_argument("--workload", default=None, metavar="W")
    add_storage(p)
    p.set_defaults(func=run)


def render(recipe: Recipe, fmt: str) -> str:
    """The exported text of a recipe (env or json)."""
    from ..recipe_file import to_env
    from ..trial import launch

    if fmt == "json":
        return to_json(recipe.to_dict(), indent=2, sort_keys=True) + "\n"
    # environment-level knobs (affinity, library paths, NCCL) resolve on this machine, as 'autotune run' does
    plan = launch.for_recipe(recipe, [], {})
    for warning in plan.warnings:
        print(f"autotune export: warning: {printable(warning)}", file=sys.stderr)
    return to_env(recipe, plan.env, plan.cpus, plan.membind)


def run(args: argparse.Namespace) -> int:
    from ..files import write_whole

    text = render(find_recipe(args), args.format)
    if args.output is None:
        sys.stdout.write(text)
        return 0
    write_whole(args.output, text)  # a link named -o is replaced, never followed to overwrite its target
    print(f"wrote {args.output}", file=sys.stderr)
    return 0
