"""How close does autotune's search get to the best of an exhaustive grid, with a fraction of its trials?

On a reduced space (threads x amp_dtype x batch_per_rank x channels_last; compile off; every other knob
held at PyTorch's default, in the search by ``--fix``), it measures every combination ``--grid-rounds``
times with the trial runner (rounds interleaved; a combination's score is its median, so the grid's
best is not just its luckiest single run on a noisy machine), then runs ``autotune.search`` with at most
``--fraction`` of the grid's trials (the confirmation runs come on top and are reported), with several sampler
seeds. Every recipe is scored by the *grid's* measurement of the same combination, so all ratios come from one
session of measurements. The grid's best is the fastest combination that passes the same quality guard.

Targets: median best-found >= 0.97 of the grid's best, never below the defaults, at least the heuristic.

    python benchmarks/search_quality.py --workload cnn --seeds 3               # the full run (quiet machine)
    python benchmarks/search_quality.py --workload tiny --seeds 2 --fraction 0.4 --steps 6 --warmup-steps 2 \
        --grid-rounds 1

The last line printed is one JSON object with the figures.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SEARCHED = ("threads", "amp_dtype", "batch_per_rank", "channels_last")


def _grid(facts: Any, ctx: Any) -> list[dict[str, Any]]:
    from autotune import search_spaces as spaces

    threads = sorted({1, spaces.threads.physical_cores(facts), spaces.threads.max_threads(facts)})
    if spaces.threads.max_threads(facts) <= 4:
        threads = list(range(1, spaces.threads.max_threads(facts) + 1))  # every value the search may pick
    axes = [threads, spaces.amp.dtypes(facts, ctx), spaces.batch.sizes(ctx), (False, True) if ctx.conv else (False,)]
    return [dict(zip(SEARCHED, combo, strict=True)) for combo in itertools.product(*axes)]


def _key(params: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(params.get(k) for k in SEARCHED)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="cnn")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--fraction", type=float, default=0.15, help="search trials as a fraction of the grid")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--warmup-steps", type=int, default=4)
    parser.add_argument("--confirm", type=int, default=3, help="confirmation candidates (autotune search --confirm)")
    parser.add_argument("--confirm-rounds", type=int, default=3)
    parser.add_argument("--max-loss-increase", type=float, default=0.05)
    parser.add_argument("--grid-rounds", type=int, default=3, help="measurements of every grid combination")
    args = parser.parse_args(argv)

    from autotune import probes
    from autotune import search_spaces as spaces
    from autotune.study import SearchOptions, run_settings, search, search_context
    from autotune.trial import TrialSettings, run_trial

    facts = probes.probe()
    settings = TrialSettings(warmup_steps=args.warmup_steps, measure_steps=args.steps)
    base_options = SearchOptions(budget_s=None, settings=settings, compile=False,
                                 max_loss_increase=args.max_loss_increase, confirm_top=args.confirm,
                                 confirm_rounds=args.confirm_rounds)
    wl, ctx = search_context(args.workload, facts, base_options)
    defaults = spaces.defaults(facts, ctx)
    run = run_settings(ctx, base_options)
    fixed = {k: v for k, v in defaults.items() if k not in SEARCHED}

    grid = _grid(facts, ctx)
    print(f"grid: {len(grid)} combinations of {', '.join(SEARCHED)} on {args.workload}", flush=True)
    started, runs_of = time.monotonic(), {_key(combo): [] for combo in grid}
    for round_ in range(args.grid_rounds):
        for combo in grid:
            result = run_trial(args.workload, {**defaults, **combo, **run}, facts, settings, timeout_s=600)
            runs_of[_key(combo)].append(result)
            print(f"  round {round_ + 1} {combo}: {result.status} {result.objective or 0:.1f} samples/s "
                  f"loss {result.loss}", flush=True)
    grid_s = time.monotonic() - started
    measured = {k: [r for r in rs if r.status == "ok"] for k, rs in runs_of.items()}
    base_loss = statistics.median(r.loss for r in measured[_key(defaults)])
    feasible = {k: statistics.median(r.objective for r in rs) for k, rs in measured.items() if rs
                and (statistics.median(r.loss for r in rs) - base_loss) / abs(base_loss) <= args.max_loss_increase}
    base_runs = [r.objective for r in measured[_key(defaults)]]
    noise = (max(base_runs) - min(base_runs)) / statistics.median(base_runs)  # the defaults' own spread
    print(f"grid best {max(feasible.values()):.1f} samples/s (median of {args.grid_rounds}); the defaults' "
          f"measurements spread {noise:.0%} ({', '.join(f'{v:.0f}' for v in base_runs)})", flush=True)
    grid_best = max(feasible.values())
    default_score = feasible[_key(defaults)] / grid_best
    heuristic_score = feasible.get(_key({**defaults, **spaces.heuristic(facts, ctx)}), 0.0) / grid_best

    trials = max(1, int(args.fraction * len(grid)))
    runs = []
    for seed in range(args.seeds):
        with tempfile.TemporaryDirectory() as tmp:
            options = SearchOptions(**{**base_options.__dict__, "trials": trials, "seed": seed, "fixed": fixed,
                                       "storage": f"sqlite:///{Path(tmp) / 'studies.db'}", "study": f"quality-{seed}"})
            t0 = time.monotonic()
            outcome = search(args.workload, options=options)
            key = _key(outcome.recipe.params)
            score = feasible.get(key)
            if score is None:  # outside the grid (should not happen in the reduced space): its own measurement
                score = outcome.recipe.samples_per_s or 0.0
            confirms = sum(1 for r in outcome.records if r.role == "confirm")
            runs.append({"seed": seed, "best_found": score / grid_best, "trials": len(outcome.records) - confirms,
                         "confirmation_runs": confirms, "wall_s": time.monotonic() - t0,
                         "recipe": dict(zip(SEARCHED, key, strict=True))})
            print(f"seed {seed}: best-found/grid-best {runs[-1]['best_found']:.3f} with {runs[-1]['trials']} trials "
                  f"+ {confirms} confirmation runs in {runs[-1]['wall_s']:.0f} s: {runs[-1]['recipe']}", flush=True)
    found = [r["best_found"] for r in runs]
    summary = {
        "workload": args.workload, "grid_size": len(grid), "grid_wall_s": round(grid_s, 1),
        "grid_rounds": args.grid_rounds, "grid_best_samples_per_s": round(grid_best, 1),
        "defaults_spread": round(noise, 3), "trials_allowed": trials,
        "best_found_over_grid_best": [round(f, 4) for f in found],
        "median_best_found": round(statistics.median(found), 4),
        "defaults_over_grid_best": round(default_score, 4), "heuristic_over_grid_best": round(heuristic_score, 4),
        "trials_used": [r["trials"] for r in runs], "confirmation_runs": [r["confirmation_runs"] for r in runs],
        "search_wall_s": [round(r["wall_s"], 1) for r in runs],
        "targets_met": statistics.median(found) >= 0.97 and min(found) >= default_score - 1e-9
        and min(found) >= heuristic_score - 1e-9,
    }
    print(f"median best-found/grid-best {summary['median_best_found']:.3f}; defaults {default_score:.3f}; "
          f"heuristic {heuristic_score:.3f}; {trials} trials of {len(grid)}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
