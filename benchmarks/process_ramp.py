"""Does a fresh trial process time a start-up ramp? The claim's processes time 3 windows right after 4 warm-up steps
(about 1.3 s of a CNN); a user's run trains for minutes. A ramp that differs between a recipe and the defaults would
bias the claim.

    python benchmarks/process_ramp.py --claims benchmarks/results/claims-zen4-5m-s67.jsonl --runs 0 5 \\
        [--workload cnn] [--repeats 3] [--out ramp.jsonl]

Fresh trial processes (``autotune.trial.runner.run_trial``, as the claim's pairs start them) of the defaults and of
the recipes those claims runs stated, alternated, each timing 24 windows of 8 steps (about 10 s of the CNN on 2
vCPUs). Prints, per process, the median of its first 3 windows (what a claim's process times), of windows 4-8 and of
the rest, each over the process's median, and per recipe the speedup its first 3 windows read over the later
windows' speedup: above 1.00, the claim's short processes would overstate a long run's gain; below, understate it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

FIRST = 3  # the windows a claim's process times (``TrialSettings.windows``)
LATER = 8  # windows from here on are the steady part


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--claims", required=True, help="a benchmarks/claims.py JSON-lines file: the recipes")
    parser.add_argument("--runs", type=int, nargs="+", default=[0], help="which of its runs' recipes")
    parser.add_argument("--workload", default="cnn")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes of each recipe")
    parser.add_argument("--out", default=None, help="append every process's windows here (JSON lines)")
    args = parser.parse_args(argv)

    from autotune import probes
    from autotune import search_spaces as spaces
    from autotune.trial import TrialSettings, run_trial
    from autotune.workloads import load_workload

    facts = probes.probe()
    batch = load_workload(args.workload).batch_size
    defaults = spaces.defaults(facts, spaces.SpaceContext(device="cpu", default_batch_size=batch))
    recipes = {"defaults": defaults}
    with open(args.claims) as claims:
        for row in map(json.loads, claims):
            if row.get("workload") == args.workload and row.get("run") in args.runs and row.get("params"):
                recipes[f"run {row['run']}"] = {**defaults, **row["params"]}
    if len(recipes) == 1:
        parser.error(f"no recipe of {args.workload} runs {args.runs} in {args.claims}")
    settings = TrialSettings(measure_steps=24 * 8, windows=24, max_extra_windows=0)
    parts: dict[str, list[tuple[float, float]]] = {name: [] for name in recipes}
    out = open(args.out, "a") if args.out else None
    for repeat in range(args.repeats):
        order = list(recipes) if repeat % 2 == 0 else list(reversed(recipes))
        for name in order:
            load = round(os.getloadavg()[0], 2)
            result = run_trial(args.workload, recipes[name], facts, settings, timeout_s=300)
            windows = result.windows
            if result.status != "ok" or len(windows) <= LATER:
                print(f"{repeat} {name}: {result.status} {result.error}")
                continue
            median = statistics.median(windows)
            first, middle, later = (statistics.median(w) for w in (windows[:FIRST], windows[FIRST:LATER],
                                                                    windows[LATER:]))
            parts[name].append((first, later))
            print(f"{repeat} {name:9s} load {load:.2f}: first {FIRST} {first / median:.2f}, "
                  f"windows {FIRST + 1}-{LATER} {middle / median:.2f}, the rest {later / median:.2f} of its median "
                  f"{median:,.0f} samples/s")
            if out:
                out.write(json.dumps({"workload": args.workload, "recipe": name, "repeat": repeat, "load": load,
                                      "time": time.time(), "windows": windows}) + "\n")
                out.flush()
    base = parts["defaults"]
    for name, got in parts.items():
        if name == "defaults" or not got or not base:
            continue
        early = math.exp(statistics.fmean(math.log(f) for f, _ in got) - statistics.fmean(math.log(f) for f, _ in base))
        steady = math.exp(statistics.fmean(math.log(s) for _, s in got)
                          - statistics.fmean(math.log(s) for _, s in base))
        print(f"{name}: the first {FIRST} windows read {early:.3f}x, the later ones {steady:.3f}x: "
              f"{early / steady:.3f} of the steady speedup")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
