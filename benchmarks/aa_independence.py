"""Are a worker's window pairs independent, and does the in-process interval hold 1.0 for identical arms?

    python benchmarks/aa_independence.py [--workloads cnn transformer] [--comparisons 20] [--pairs 16] [--workers 2]

The in-process interval (``autotune.measure.stats.median_interval``) is the exact order-statistics interval of
the median of the per-pair ratios, which assumes the pairs are independent. This measures, for each workload at
PyTorch's defaults, two identical arms ("a", "b") in ``--workers`` fresh worker processes, one after another:
``--comparisons`` A/A comparisons of ``--pairs`` pairs each, spread over the workers and run back to back as the
search runs them. It prints:

- the lag-1 autocorrelation of the log pair ratios, over consecutive pairs within each worker (with the band
  +-1.96/sqrt(n) an independent series stays inside 95% of the time), and that of each arm's own window rates
  (a drift shared by both arms shows there, and cancels in the ratios);
- the order effect: the median log ratio when "a" ran first against when "b" did;
- coverage: how many of the A/A comparisons' 95% intervals hold 1.0, and their median width.

The last line printed is one JSON object with the figures.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from typing import Any


def lag1(series: list[list[float]]) -> tuple[float, int]:
    """The lag-1 autocorrelation pooled over several series (each centred on its own mean), bias-corrected as
    ``stats.lag1_autocorrelation`` at the series' mean length (an independent series' plain estimate is about
    -1/n: -0.06 for 16 pairs), and the pairs used.

    >>> import random
    >>> draw = random.Random(1)
    >>> r, pairs = lag1([[draw.gauss(0, 1) for _ in range(16)] for _ in range(200)])  # independent
    >>> round(r, 2), pairs
    (0.02, 3000)
    """
    num = den = 0.0
    pairs = 0
    for xs in series:
        if len(xs) < 2:
            continue
        mean = statistics.fmean(xs)
        d = [x - mean for x in xs]
        num += sum(a * b for a, b in zip(d[:-1], d[1:], strict=True))
        den += sum(a * a for a in d)
        pairs += len(xs) - 1
    from autotune.measure.serial import corrected

    used = [len(xs) for xs in series if len(xs) >= 2]
    return corrected(num / den if den else 0.0, statistics.fmean(used) if used else 0.0), pairs


def measure(workload: str, comparisons: int, pairs: int, workers: int, seed: int) -> dict[str, Any]:
    from autotune import probes
    from autotune import search_spaces as spaces
    from autotune.measure import PairedWorker
    from autotune.measure.stats import median_interval
    from autotune.measure.worker.arms import choose_window_s
    from autotune.study import SearchOptions, run_settings, search_context
    from autotune.trial import TrialSettings

    facts = probes.probe()
    settings = TrialSettings()
    _, ctx = search_context(workload, facts, SearchOptions(settings=settings))
    params = {**spaces.defaults(facts, ctx), **run_settings(ctx, SearchOptions(settings=settings))}
    ratios: list[list[float]] = []
    rates: dict[str, list[list[float]]] = {"a": [], "b": []}
    first: dict[str, list[float]] = {"a": [], "b": []}
    covered, widths, window_s = 0, [], 0.0
    per_worker = [comparisons // workers + (i < comparisons % workers) for i in range(workers)]
    for w, count in enumerate(per_worker):
        stream: list[float] = []
        own: dict[str, list[float]] = {"a": [], "b": []}
        with PairedWorker(workload, params, facts, settings) as worker:
            a = worker.add_arm("a", params)
            worker.add_arm("b", params)
            window_s = choose_window_s(a.step_s or 0.0)
            for c in range(count):
                run = worker.run_pairs("a", "b", pairs, window_s, seed=seed + 1000 * w + c)
                logs = [math.log(p.ratio) for p in run.pairs]
                stream += logs
                for p, x in zip(run.pairs, logs, strict=True):
                    first[p.first].append(x)
                    own["a"].append(p.base.rate)
                    own["b"].append(p.cand.rate)
                interval = median_interval([p.ratio for p in run.pairs])
                covered += interval.low <= 1.0 <= interval.high
                widths.append(interval.high - interval.low)
                print(f"  {workload} worker {w + 1} comparison {c + 1}: {interval.median:.3f} "
                      f"[{interval.low:.3f}-{interval.high:.3f}]", flush=True)
        ratios.append(stream)
        for arm in ("a", "b"):
            rates[arm].append([math.log(r) for r in own[arm]])
    r1, n = lag1(ratios)
    rate_r1 = lag1(rates["a"] + rates["b"])[0]
    return {"workload": workload, "window_s": window_s, "pairs": n + len(ratios), "lag1_ratio": round(r1, 3),
            "band": round(1.96 / math.sqrt(n), 3) if n else None, "lag1_rates": round(rate_r1, 3),
            "order_effect": round(statistics.median(first["a"]) - statistics.median(first["b"]), 4)
            if first["a"] and first["b"] else None,
            "covered": covered, "comparisons": comparisons, "median_width": round(statistics.median(widths), 4)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["cnn", "transformer"])
    parser.add_argument("--comparisons", type=int, default=20)
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = []
    for workload in args.workloads:
        found = measure(workload, args.comparisons, args.pairs, args.workers, args.seed)
        out.append(found)
        print(f"{workload}: lag-1 autocorrelation of the log ratios {found['lag1_ratio']:+.3f} "
              f"(independent: within +-{found['band']}), of the arms' own log rates {found['lag1_rates']:+.3f}; "
              f"order effect {found['order_effect']:+.4f} (log, a first - b first); 95% intervals holding 1.0: "
              f"{found['covered']} of {found['comparisons']}, median width {found['median_width']:.3f}",
              flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
