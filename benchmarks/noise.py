"""The paired methods' false differences, coverage and power near the margin, in one process and across processes.

    python benchmarks/noise.py [--comparisons 20] [--pairs 16] [--process-pairs 3-8] [--half both|in|across]
                               [--effects 3 5 10] [--quick]

Each half measures ``--comparisons`` comparisons of identical arms (A/A) and as many of a fixture knob that adds
a known share of step time (``benchmarks/effects.py``: 3%, 5% and 10% by default), with the method the search
uses for that half:
- in one process: two arms of one worker, ``--pairs`` pairs of windows a comparison (window length from the step
  time, ``measure.arms.choose_window_s``), judged by the median ratio's exact 95% interval against the margin
  (``measure.stats.MIN_MARGIN``); the knob is ``channels_last`` (the fixture's step grows when its input is
  channels_last). The comparisons of one effect run back to back in one worker, as a search's candidates do;
- across processes: ``measure.process_pair.across_processes``, two live workers alternated, the idle one frozen,
  ``--pairs`` // 2 pairs of windows a process pair, over ``--process-pairs`` fresh pairs, judged by the Student-t
  95% interval of their geometric mean; the knob is ``threads=1`` (the fixture's step grows when the process was
  started with one thread; its model computes on one thread on both sides, so the knob has no effect of its own).
A detection is a "slower" verdict. Per half it prints the A/A false differences and coverage (intervals that hold
1.0), the detections at each effect with the median ratio measured, the lag-1 autocorrelation of the A/A's log
ratios (window pairs in one process; process pairs across), and last one JSON object: per half ``aa_false``,
``aa_coverage``, ``power`` (effect in % -> detections), ``measured`` (effect -> median ratio),
``lag1_autocorrelation``, ``comparisons`` and the pairs used. Target per half: A/A coverage at least 18 of 20,
false differences at most 1 of 20, detections at least 18 of 20 at 10%; 3% and 5% are reported.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from aa_independence import lag1  # noqa: E402 - a benchmark beside this one

FIXTURE = str(Path(__file__).resolve().parent / "effects.py")


def _in_process(effect: int, base: dict[str, Any], facts: Any, comparisons: int, pairs: int) -> list[dict[str, Any]]:
    from autotune.measure import PairedWorker, compare
    from autotune.measure.arms import choose_window_s
    from autotune.trial import TrialSettings

    settings = TrialSettings()
    cand = {**base, "channels_last": True} if effect else base
    out = []
    with PairedWorker(f"{FIXTURE}:in{effect or 3}", base, facts, settings) as worker:
        statuses = [worker.add_arm(name, params) for name, params in (("base", base), ("cand", cand))]
        failed = [s for s in statuses if s.state != "ok"]
        if failed:
            raise SystemExit(f"arm failed: {failed[0].arm} {failed[0].state} {failed[0].error}")
        window_s = choose_window_s(statuses[0].step_s or 0.0)
        for index in range(comparisons):
            run = worker.run_pairs("base", "cand", pairs, window_s, seed=index)
            c = compare(run.pairs, run.base, run.cand, train_steps=settings.train_steps)
            out.append(_result(c.ratio, c.verdict, [p.ratio for p in run.pairs], window_s=window_s))
            _print("in", effect, index, out[-1])
    return out


def _across(effect: int, base: dict[str, Any], facts: Any, comparisons: int, pairs: int, least: int,
            most: int) -> list[dict[str, Any]]:
    from autotune.measure import across_processes
    from autotune.trial import TrialSettings

    cand = {**base, "threads": 1, "interop_threads": 1} if effect else base
    out = []
    for index in range(comparisons):
        r = across_processes(f"{FIXTURE}:across{effect or 3}", base, cand, facts, TrialSettings(),
                             pairs=max(4, pairs // 2), least=least, most=most, seed=1000 * index + effect)
        out.append(_result(r.ratio, r.verdict, list(r.per_process), window_s=r.window_s))
        _print("across", effect, index, out[-1])
    return out


def _result(ratio: Any, verdict: str, ratios: list[float], **extra: Any) -> dict[str, Any]:
    return {"ratio": ratio.median, "low": ratio.low, "high": ratio.high, "verdict": verdict,
            "holds_1": ratio.low <= 1.0 <= ratio.high, "units": len(ratios), "ratios": ratios, **extra}


def _print(half: str, effect: int, index: int, r: dict[str, Any]) -> None:
    print(f"{half:6s} +{effect:2d}% #{index:2d}: {r['ratio']:.3f} [{r['low']:.3f}-{r['high']:.3f}] {r['verdict']} "
          f"({r['units']} pairs)", flush=True)


def _summary(runs: dict[int, list[dict[str, Any]]], comparisons: int) -> dict[str, Any]:
    aa = runs.get(0, [])
    return {
        "comparisons": comparisons,
        "aa_false": sum(r["verdict"] != "same" for r in aa),
        "aa_coverage": sum(r["holds_1"] for r in aa),
        "power": {str(e): sum(r["verdict"] == "slower" for r in rs) for e, rs in runs.items() if e},
        "measured": {str(e): round(statistics.median(r["ratio"] for r in rs), 4) for e, rs in runs.items()},
        "median_width": {str(e): round(statistics.median(r["high"] / r["low"] for r in rs if r["low"] > 0), 4)
                         for e, rs in runs.items()},
        "pairs": {str(e): statistics.median(r["units"] for r in rs) for e, rs in runs.items()},
        "lag1_autocorrelation": round(lag1([[math.log(x) for x in r["ratios"]] for r in aa])[0], 3),
        "lag1_pairs": lag1([[math.log(x) for x in r["ratios"]] for r in aa])[1],
    }


def _range(text: str) -> tuple[int, int]:
    least, _, most = text.partition("-")
    return int(least), int(most or least)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--comparisons", type=int, default=20)
    parser.add_argument("--pairs", type=int, default=16, help="pairs of windows per in-process comparison")
    parser.add_argument("--process-pairs", type=_range, default=(3, 8), metavar="LEAST-MOST",
                        help="fresh process pairs per across-process comparison (default 3-8)")
    parser.add_argument("--half", choices=("both", "in", "across"), default="both")
    parser.add_argument("--effects", type=int, nargs="+", default=[3, 5, 10], choices=(3, 5, 10))
    parser.add_argument("--quick", action="store_true", help="2 comparisons, 8 pairs, 3 process pairs: a smoke test")
    args = parser.parse_args(argv)
    if args.quick:
        args.comparisons, args.pairs, args.process_pairs = 2, 8, (3, 3)

    from autotune import probes
    from autotune.search_spaces import SpaceContext, defaults

    facts = probes.probe()
    base = {**defaults(facts, SpaceContext(default_batch_size=32, conv=True)), "device": "cpu",
            "reference_batch": 32}
    started, load_before = time.monotonic(), os.getloadavg()
    halves: dict[str, Any] = {}
    for half in ("in", "across"):
        if args.half not in ("both", half):
            continue
        runs = {effect: (_in_process(effect, base, facts, args.comparisons, args.pairs) if half == "in" else
                         _across(effect, base, facts, args.comparisons, args.pairs, *args.process_pairs))
                for effect in (0, *args.effects)}
        s = halves["in_process" if half == "in" else "across_processes"] = _summary(runs, args.comparisons)
        n = args.comparisons
        power = ", ".join(f"+{e}%: {d}/{n} (measured {s['measured'][e]:.3f}x, {s['pairs'][e]:g} pairs)"
                          for e, d in s["power"].items())
        print(f"{half}: A/A false {s['aa_false']}/{n}, coverage {s['aa_coverage']}/{n}; detected {power}; "
              f"lag-1 {s['lag1_autocorrelation']:+.3f} over {s['lag1_pairs']} pairs")
    n = args.comparisons
    passed = all(s["aa_coverage"] >= 0.9 * n and s["aa_false"] <= max(1, n // 20)
                 and s["power"].get("10", n) >= 0.9 * n for s in halves.values())
    print(json.dumps({"benchmark": "noise", "machine": f"{facts.cpu.model}, {os.cpu_count()} CPUs",
                      "fingerprint": facts.fingerprint, "wall_s": round(time.monotonic() - started, 1),
                      "loadavg": [load_before, os.getloadavg()], **halves, "passed": passed}))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
