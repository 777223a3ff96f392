"""How far from the machine's limit: for the bundled CNN and transformer, a real ``autotune search`` each (5 minutes
by default), and from its study the fraction of this machine's measured matmul peak the defaults and the best
recipe reach (GFLOP/s = samples/s x the workload's FLOP per sample, counted by torch's FlopCounterMode), the share
of their step waiting for data and each part of it, and the defaults' top operators: where the distance goes.

    python benchmarks/limit.py                      # cnn and transformer, 5-minute searches
    python benchmarks/limit.py --budget 2m --workloads transformer

The goal it reports against: the transformer's best recipe at >= 60% of the matmul peak at its precision (on a
CPU); where it is not reached, the table says which operators and which parts of the step hold the time. The
last line printed is one JSON object with the figures.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GOAL = 0.60  # the transformer's best recipe, of the matmul peak at its precision


def _search(workload: str, budget: str, folder: Path) -> dict[str, Any]:
    """One ``autotune search`` in ``folder``; what its study and recipe say of the machine's limit."""
    import optuna

    from autotune.store import RecipeStore
    from autotune.study.records import BASELINE, records

    study = f"limit-{workload}"
    done = subprocess.run([sys.executable, "-m", "autotune", "search", "--workload", workload, "--budget", budget,
                           "--study", study, "--report", str(folder / f"report-{workload}.html")],
                          cwd=folder, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"limit: the search of {workload} failed ({done.returncode}): {done.stderr.strip()[-600:]}")
    url = f"sqlite:///{folder}/studies.db"
    loaded = optuna.load_study(study_name=study, storage=url)
    with RecipeStore.open(url, readonly=True) as store:
        recipe = store.latest(study=study)
    base = next(r for r in records(loaded) if r.role == BASELINE and r.result.status == "ok")
    best = next((r for r in records(loaded) if r.params == recipe.params and r.result.phases), base)
    peaks = recipe.matmul_gflops or {}
    dtype = str(recipe.params.get("amp_dtype") or "float32")
    flop = recipe.flop_per_sample or 0.0
    defaults_gflops = (recipe.baseline_samples_per_s or 0.0) * flop / 1e9
    best_gflops = (recipe.samples_per_s or 0.0) * flop / 1e9
    return {
        "workload": workload, "flop_per_sample": flop, "peaks": peaks, "dtype": dtype,
        "speedup": recipe.speedup, "speedup_low": recipe.speedup_low, "speedup_high": recipe.speedup_high,
        "defaults_gflops": defaults_gflops, "defaults_of_peak": defaults_gflops / peaks["float32"],
        "best_gflops": best_gflops, "best_of_peak": best_gflops / peaks.get(dtype, peaks["float32"]),
        "best_of_fp32_peak": best_gflops / peaks["float32"], "changed": {
            k: v for k, v in recipe.params.items() if base.params.get(k) != v},
        "defaults_phases": base.result.phases, "best_phases": best.result.phases,
        "defaults_operators": base.result.operators, "trial": best.number,
    }


def _parts(phases: dict[str, float] | None) -> str:
    return " ".join(f"{k} {v:.0%}" for k, v in (phases or {}).items()) or "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", default="5m", help="each search's budget (default 5m)")
    parser.add_argument("--workloads", nargs="+", default=["cnn", "transformer"])
    parser.add_argument("--folder", default=None, help="where the searches run and keep their studies and reports "
                        "(default: a temporary folder, removed)")
    args = parser.parse_args(argv)

    from autotune import probes

    facts = probes.probe()
    limits = probes.limits(facts)
    print(f"machine: {facts.cpu.model} ({facts.cpu.allowed.threads} CPUs allowed, {', '.join(facts.cpu.isa[-4:])}); "
          f"{limits.describe()}")
    found = []
    with tempfile.TemporaryDirectory(prefix="autotune-limit-") as temporary:
        folder = Path(args.folder or temporary)
        folder.mkdir(parents=True, exist_ok=True)
        for workload in args.workloads:
            found.append(_search(workload, args.budget, folder))
    print(f"\n{'workload':<12} {'defaults':>22}   {'best recipe':<42} speedup  changed")
    for f in found:
        best = f"{f['best_gflops']:.0f} GFLOP/s = {f['best_of_peak']:.0%} {f['dtype']}"
        if f["dtype"] != "float32":
            best += f" ({f['best_of_fp32_peak']:.0%} float32)"
        print(f"{f['workload']:<12} {f['defaults_gflops']:>4.0f} GFLOP/s = {f['defaults_of_peak']:>4.0%} float32   "
              f"{best:<42} {f['speedup']:.2f}x   {f['changed'] or '(the defaults)'}")
    print("\nwhere a step's time goes (shares of the timed windows), and the defaults' top operators:")
    for f in found:
        print(f"{f['workload']:<12} defaults: {_parts(f['defaults_phases'])}")
        print(f"{'':<12} best:     {_parts(f['best_phases'])}")
        operators = f["defaults_operators"] or {}
        print(f"{'':<12} top ops:  " + ", ".join(f"{name} {share:.0%}" for name, share in list(operators.items())[:5]))
    transformer = next((f for f in found if f["workload"] == "transformer"), None)
    if transformer is not None:
        met = transformer["best_of_peak"] >= GOAL
        print(f"\ngoal: the transformer's best at >= {GOAL:.0%} of the matmul peak at its precision: "
              f"{'met' if met else 'not met'} ({transformer['best_of_peak']:.0%} of {transformer['dtype']}'s, "
              f"{transformer['best_of_fp32_peak']:.0%} of float32's)")
    print(json.dumps({"machine": facts.cpu.model, "limits": limits.to_dict(), "budget": args.budget,
                      "workloads": found}, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
