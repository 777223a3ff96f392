"""False verdicts and detections of today's method and the paired methods, in one process and across.

    python benchmarks/noise.py [--comparisons 20] [--workload cnn] [--rounds 3] [--pairs 16]
                               [--process-pairs 3-8] [--half both|in|across] [--quick]

For the workload (default: the bundled CNN), ``--comparisons`` comparisons of each kind, in two halves:
- in-process: A/A (the defaults against themselves) and A/B (``channels_last=True`` against the defaults);
- across processes: A/A (the defaults' environment against itself) and A/B (``threads=1`` against the
  defaults' threads: an environment knob, which needs another process).
Each is measured with:
- today's method: a fresh trial process per run (``autotune.trial.run_trial``), ``--rounds`` runs per
  arm, interleaved, judged by the confirmation's rule (``autotune.study.significance.beats``, either
  direction for "different"); its "width" is the rule's noise band (twice ``significance.noise``);
- in-process, the paired method: a fresh worker per comparison holding the defaults, an identical copy and
  the candidate; ``--pairs`` pairs of windows (length from the step time, ``measure.arms.choose_window_s``),
  judged by the median ratio's exact 95% interval against the fixed margin (``measure.stats.MIN_MARGIN``);
- across processes, process pairs (``autotune.measure.process_pair.across_processes``): two live workers
  alternated, the idle one frozen, ``--pairs`` // 2 pairs of windows per process pair, over 3 to 8 fresh
  process pairs (more while the interval of their geometric mean is wider than +-3%), judged by that
  Student-t 95% interval against the same margin.
The methods alternate comparison by comparison, so a neighbour's load hits all alike (the JSON line gives
the load average at start and end: with other processes on the cores every figure widens). Prints per
method the A/A comparisons found "different" (false positives) and the A/B comparisons detected (in-process:
found faster; across processes: found different, either way: whether one thread beats two depends on how
loaded the cores are), the median interval widths, then one JSON line with every figure. Target: the
paired methods <= 1 false in 20 A/A and >= 18 of 20 detections.
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
    return {"ratio": ratio, "faster": faster, "slower": slower, "different": faster or slower,
            "width": 2 * noise(runs["base"], runs["cand"])}


def _paired(workload: str, base: dict[str, Any], cand: dict[str, Any], facts: Any, pairs: int,
            seed: int) -> dict[str, dict[str, Any]]:
    from autotune.measure import PairedWorker, compare
    from autotune.measure.arms import choose_window_s
    from autotune.trial import TrialSettings

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


def _across(workload: str, base: dict[str, Any], cand: dict[str, Any], facts: Any, pairs: int, least: int,
            most: int, seed: int) -> dict[str, Any]:
    from autotune.measure import across_processes
    from autotune.trial import TrialSettings

    r = across_processes(workload, base, cand, facts, TrialSettings(), pairs=pairs, least=least, most=most,
                         seed=seed)
    return {"ratio": r.ratio.median, "low": r.ratio.low, "high": r.ratio.high, "verdict": r.verdict,
            "faster": r.verdict == "faster", "slower": r.verdict == "slower", "different": r.verdict != "same",
            "width": r.ratio.width, "process_pairs": len(r.runs), "per_process": list(r.per_process),
            "window_s": r.window_s}


def _summary(results: list[dict[str, Any]], detected: str = "faster") -> dict[str, Any]:
    if not results:
        return {}
    return {"false_positives": sum(r["different"] for r in results if r["kind"] == "aa"),
            "detections": sum(r[detected] for r in results if r["kind"] == "ab"),
            "aa_median_width": statistics.median(r["width"] for r in results if r["kind"] == "aa"),
            "ab_median_width": statistics.median(r["width"] for r in results if r["kind"] == "ab"),
            "ab_median_ratio": statistics.median(r["ratio"] for r in results if r["kind"] == "ab")}


def _range(text: str) -> tuple[int, int]:
    least, _, most = text.partition("-")
    return int(least), int(most or least)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--comparisons", type=int, default=20)
    parser.add_argument("--workload", default="cnn")
    parser.add_argument("--rounds", type=int, default=3, help="today's runs per arm (the confirmation's default)")
    parser.add_argument("--pairs", type=int, default=16, help="pairs of windows per in-process comparison")
    parser.add_argument("--process-pairs", type=_range, default=(3, 8), metavar="LEAST-MOST",
                        help="fresh process pairs per across-process comparison (default 3-8)")
    parser.add_argument("--half", choices=("both", "in", "across"), default="both")
    parser.add_argument("--quick", action="store_true", help="2 comparisons, 1 round, 8 pairs: a smoke test")
    args = parser.parse_args(argv)
    if args.quick:
        args.comparisons, args.rounds, args.pairs = 2, 1, 8

    from autotune import probes
    from autotune.search_spaces import SpaceContext, defaults
    from autotune.workloads import load_workload

    facts = probes.probe()
    batch = load_workload(args.workload).batch_size
    base = {**defaults(facts, SpaceContext(default_batch_size=batch, conv=True)), "device": "cpu",
            "reference_batch": batch}
    cand = {**base, "channels_last": True}
    one_thread = {**base, "threads": 1, "interop_threads": 1}
    results: dict[str, list[dict[str, Any]]] = {"today_in": [], "paired": [], "today_across": [], "process_pairs": []}
    started, load_before = time.monotonic(), os.getloadavg()
    for index in range(args.comparisons):
        if args.half in ("both", "in"):
            for kind, other in (("aa", base), ("ab", cand)):
                _note(results["today_in"], index, "in", "today", kind, _today(args.workload, base, other, facts,
                                                                               args.rounds))
            for kind, result in _paired(args.workload, base, cand, facts, args.pairs, seed=index).items():
                _note(results["paired"], index, "in", "paired", kind, result)
        if args.half in ("both", "across"):
            for kind, other in (("aa", base), ("ab", one_thread)):
                _note(results["today_across"], index, "across", "today", kind,
                      _today(args.workload, base, other, facts, args.rounds))
                _note(results["process_pairs"], index, "across", "pairs", kind,
                      _across(args.workload, base, other, facts, max(4, args.pairs // 2), *args.process_pairs,
                              seed=1000 * index))
    figures = {"in_process": {"today": _summary(results["today_in"]), "paired": _summary(results["paired"])},
               "across": {"today": _summary(results["today_across"], "different"),
                          "process_pairs": _summary(results["process_pairs"], "different")}}
    n = args.comparisons
    for half, methods in figures.items():
        for method, s in methods.items():
            if s:
                print(f"{half:10s} {method:13s} A/A different: {s['false_positives']}/{n}   A/B detected: "
                      f"{s['detections']}/{n}   median width A/A {s['aa_median_width']:.3f}, "
                      f"A/B {s['ab_median_width']:.3f}   median A/B ratio {s['ab_median_ratio']:.3f}")
    judged = [s for s in (figures["in_process"]["paired"], figures["across"]["process_pairs"]) if s]
    passed = all(s["false_positives"] <= max(1, n // 20) and s["detections"] >= 0.9 * n for s in judged)
    print(json.dumps({"benchmark": "noise", "workload": args.workload, "comparisons": n, "rounds": args.rounds,
                      "pairs": args.pairs, "process_pairs": list(args.process_pairs), "half": args.half,
                      "wall_s": round(time.monotonic() - started, 1),
                      # the machine's load (1, 5, 15 min) at start and end: neighbours' work shows in every figure
                      "loadavg": [load_before, os.getloadavg()], **figures, "runs": results, "passed": passed}))
    return 0 if passed else 1


def _note(into: list[dict[str, Any]], index: int, half: str, method: str, kind: str, result: dict[str, Any]) -> None:
    into.append({"kind": kind, **result})
    interval = f" [{result['low']:.3f}, {result['high']:.3f}] {result['verdict']}" if "low" in result else ""
    extra = f" ({result['process_pairs']} process pairs)" if "process_pairs" in result else ""
    print(f"{index:2d} {half:6s} {method:6s} {kind}: ratio {result['ratio']:.3f}{interval} "
          f"different={result['different']}{extra}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
