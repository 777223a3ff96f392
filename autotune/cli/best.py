"""``autotune best``: show the stored best recipe, marking the knobs it changes from PyTorch's defaults."""
from __future__ import annotations

import argparse
import sys

from ..errors import one_line
from ._common import add_storage, console, find_recipe, foreign_preload, knobs, params_table, to_json, when


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "best", help="show the best recipe stored (latest, or of a study/workload)",
        description="Show a recipe's knobs; those that differ from PyTorch's defaults (its study's baseline trial, "
        "or the defaults on this machine) are marked '*' with the default beside; its speedup, and its GFLOP/s as a "
        "share of the machine's measured matmul peak where the search counted the workload's FLOP. Reads the "
        "storage only.",
    )
    p.add_argument("--recipe", default=None, metavar="ID|FILE", help="a recipe id or an exported file")
    p.add_argument("--study", default=None, metavar="NAME")
    p.add_argument("--workload", default=None, metavar="W")
    p.add_argument("--json", action="store_true", help="print the recipe as JSON (every key, as stored)")
    add_storage(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..recipe import format_note
    from ..study.summaries import pytorch_defaults

    recipe, preload = find_recipe(args), foreign_preload(args.recipe)  # what sourcing the file would do
    if args.json:
        print(to_json(recipe.to_dict(), indent=2, sort_keys=True))
        if preload:
            print(f"autotune best: warning: {one_line(preload)}", file=sys.stderr)
        return 0
    defaults, source = pytorch_defaults(recipe, args.storage)
    out = console()
    source = one_line(source)  # it may name a stored study: one line, as every stored text below
    out.print(params_table(recipe.params, one_line(f"recipe {recipe.id} — workload {recipe.workload}, study "
                                                   f"{recipe.study}"), defaults))
    if defaults is None:
        out.print(f"PyTorch's defaults: {source}", markup=False, soft_wrap=True)
    else:
        changed = [k for k, v in knobs(recipe.params).items() if k in defaults and defaults[k] != v]
        out.print(f"* {len(changed)} knob(s) differ from PyTorch's defaults ({source})", markup=False, soft_wrap=True)
    if recipe.speedup is not None:
        speeds = (f" ({recipe.samples_per_s:.1f} vs {recipe.baseline_samples_per_s:.1f} samples/s)"
                  if recipe.samples_per_s is not None and recipe.baseline_samples_per_s is not None else "")
        losses = (f"; loss {recipe.loss:.4f} vs {recipe.baseline_loss:.4f}"
                  if recipe.loss is not None and recipe.baseline_loss is not None else "")
        claim = f" ({recipe.claim_text})" if recipe.claim_text else ""
        out.print(f"{recipe.speedup_text}{claim} PyTorch defaults{speeds}{losses}", markup=False, soft_wrap=True)
    if recipe.run_text:
        out.print(recipe.run_text, markup=False, soft_wrap=True)
    if recipe.place_text:
        out.print(f"at {recipe.place_text}", markup=False, soft_wrap=True)
    out.print(f"hardware {one_line(recipe.fingerprint or '-')}, created {when(recipe.created)}", markup=False)
    for note in [*recipe.notes, *filter(None, [format_note(recipe)])]:
        out.print(f"note: {one_line(note)}", markup=False, soft_wrap=True)
    if preload:
        out.print(f"warning: {one_line(preload)}", markup=False, soft_wrap=True)
    return 0
