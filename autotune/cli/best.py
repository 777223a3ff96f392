"""``autotune best``: show the stored best recipe."""
from __future__ import annotations

import argparse
import json

from ._common import add_storage, console, find_recipe, params_table


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("best", help="show the best recipe stored (latest, or of a study/workload)")
    p.add_argument("--recipe", default=None, metavar="ID|FILE", help="a recipe id or an exported file")
    p.add_argument("--study", default=None, metavar="NAME")
    p.add_argument("--workload", default=None, metavar="W")
    p.add_argument("--json", action="store_true", help="print the recipe as JSON")
    add_storage(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    recipe = find_recipe(args)
    if args.json:
        print(json.dumps(recipe.to_dict(), indent=2, sort_keys=True))
        return 0
    out = console()
    out.print(params_table(recipe.params, f"recipe {recipe.id} — workload {recipe.workload}, study {recipe.study}"))
    if recipe.speedup is not None:
        out.print(
            f"{recipe.speedup:.2f}x PyTorch defaults ({recipe.samples_per_s:.1f} vs "
            f"{recipe.baseline_samples_per_s:.1f} samples/s); loss {recipe.loss:.4f} vs {recipe.baseline_loss:.4f}"
        )
    out.print(f"hardware {recipe.fingerprint}, created {recipe.created}")
    for note in recipe.notes:
        out.print(f"note: {note}")
    return 0
