"""False verdicts and detections of today's method and the paired method, in-process half (issue 12).

    python benchmarks/noise.py [--comparisons 20] [--workload cnn] [--rounds 3] [--pairs 16] [--quick]

For the workload (default: the bundled CNN), ``--comparisons`` A/A comparisons (the defaults against
themselves) and as many A/B comparisons (``channels_last=True`` against the defaults), each measured with:
- today's method: a fresh trial process per run (``autotune.trial.run_trial``), ``--rounds`` runs per
  arm, interleaved, judged by the confirmation's rule (``autotune.study.significance.beats``, either direction for
  "different"); its "width" is the rule's noise band (twice ``significance.noise``);
- the paired method: a fresh worker per comparison holding the defaults, an identical copy and the
  candidate; ``--pairs`` pairs of windows (length from the step time, ``trial.paired.choose_window_s``), judged
  by the median ratio's exact 95% interval against the fixed margin (``trial.stats.MIN_MARGIN``).
The two methods alternate comparison by comparison, so a neighbour's load hits both alike (the JSON line
gives the load average at start and end: with other processes on the cores every figure widens). Prints per
method the A/A comparisons found "different" (false positives) and the A/B comparisons detected, the
median interval widths, then one JSON line with every figure. Target: paired <= 1 false in 20 A/A and
>= 18 of 20 detections.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any


def _today(workload: str, base: dict[str, Any], cand: dict[str, Any], facts: Any, rounds: int) -> dict[str, Any]:
    from autotune.study.significance import beats, noise
    from autotune.trial import TrialSettings, run_trial

    runs: dict[str, list[float]] = {"base": [], "cand": []}
    for round_ in range(rounds):
        order = ["base", "cand"] if round_ % 2 == 0 else ["cand", "base"]
        for arm in order:
            result = run_trial(workload, base if arm == "base" else cand, facts, TrialSettings(), timeout_s=600)
            if result.status != "ok":
                raise SystemExit(f"today's trial failed: {result.status} {result.error}")
            runs[arm].append(result.objective)
    ratio = statistics.median(runs["cand"]) / statistics.median(runs["base"])
    faster, slower = beats(runs["base"], runs["cand"]), beats(runs["cand"], runs["base"])
    return {"ratio": ratio, "faster": faster, "different": faster or slower,
            "width": 2 * noise(runs["base"], runs["cand"])}


def _paired(workload: str, base: dict[str, Any], cand: dict[str, Any], facts: Any, pairs: int,
            seed: int) -> dict[str, dict[str, Any]]:
    from autotune.trial import PairedWorker, TrialSettings, compare
    from autotune.trial.paired import choose_window_s

    settings = TrialSettings()
    out = {}
    with PairedWorker(workload, base, facts, settings) as worker:
        statuses = [worker.add_arm(name, params) for name, params in (("base", base), ("copy", base), ("cand", cand))]
        failed = [s for s in statuses if s.state != "ok"]
        if failed:
            raise SystemExit(f"paired arm failed: {failed[0].arm} {failed[0].state} {failed[0].error}")
        window_s = choose_window_s(statuses[0].step_s or 0.0)
        for kind, other in (("aa", "copy"), ("ab", "cand")):
            run = worker.run_pairs("base", other, pairs, window_s, seed=seed)
            c = compare(run.pairs, run.base, run.cand, train_steps=settings.train_steps)
            out[kind] = {"ratio": c.ratio.median, "low": c.ratio.low, "high": c.ratio.high, "verdict": c.verdict,
                         "faster": c.verdict == "faster", "different": c.verdict != "same",
                         "width": c.ratio.width, "window_s": window_s}
    return out


def _summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    return {"false_positives": sum(r["different"] for r in results if r["kind"] == "aa"),
            "detections": sum(r["faster"] for r in results if r["kind"] == "ab"),
            "aa_median_width": statistics.median(r["width"] for r in results if r["kind"] == "aa"),
            "ab_median_width": statistics.median(r["width"] for r in results if r["kind"] == "ab"),
            "ab_median_ratio": statistics.median(r["ratio"] for r in results if r["kind"] == "ab")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comparisons", type=int, default=20)
    parser.add_argument("--workload", default="cnn")
    parser.add_argument("--rounds", type=int, default=3, help="today's runs per arm (the confirmation's default)")
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="2 comparisons, 1 round, 8 pairs: a smoke test")
    args = parser.parse_args(argv)
    if args.quick:
        args.comparisons, args.rounds, args.pairs = 2, 1, 8

    from autotune import probes
    from autotune.search_spaces import SpaceContext, defaults
    from autotune.workload import load_workload

    facts = probes.probe()
    batch = load_workload(args.workload).batch_size
    base = {**defaults(facts, SpaceContext(default_batch_size=batch, conv=True)), "device": "cpu",
            "reference_batch": batch}
    cand = {**base, "channels_last": True}
    today: list[dict[str, Any]] = []
    paired: list[dict[str, Any]] = []
    started, load_before = time.monotonic(), os.getloadavg()
    for index in range(args.comparisons):
        for kind, other in (("aa", base), ("ab", cand)):
            today.append({"kind": kind, **_today(args.workload, base, other, facts, args.rounds)})
            print(f"{index:2d} today  {kind}: ratio {today[-1]['ratio']:.3f} different={today[-1]['different']}",
                  flush=True)
        for kind, result in _paired(args.workload, base, cand, facts, args.pairs, seed=index).items():
            paired.append({"kind": kind, **result})
            print(f"{index:2d} paired {kind}: ratio {result['ratio']:.3f} [{result['low']:.3f}, {result['high']:.3f}] "
                  f"{result['verdict']}", flush=True)
    figures = {"today": _summary(today), "paired": _summary(paired)}
    n = args.comparisons
    for method, s in figures.items():
        print(f"{method:7s} A/A different: {s['false_positives']}/{n}   A/B detected: {s['detections']}/{n}   "
              f"median width A/A {s['aa_median_width']:.3f}, A/B {s['ab_median_width']:.3f}   "
              f"median A/B ratio {s['ab_median_ratio']:.3f}")
    passed = figures["paired"]["false_positives"] <= max(1, n // 20) and figures["paired"]["detections"] >= 0.9 * n
    print(json.dumps({"benchmark": "noise", "workload": args.workload, "comparisons": n, "rounds": args.rounds,
                      "pairs": args.pairs, "wall_s": round(time.monotonic() - started, 1),
                      # the machine's load (1, 5, 15 min) at start and end: neighbours' work shows in every figure
                      "loadavg": [load_before, os.getloadavg()], **figures,
                      "runs": {"today": today, "paired": paired}, "passed": passed}))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
