"""How long ``autotune.probes.probe()`` takes on this machine (the target: < 0.3 s, importing torch aside).

    python benchmarks/probe_time.py [--runs 7]

Prints the median of several runs for each way of probing, and, once, the cost of importing torch,
which ``probe(runtime=True)`` pays on its first call only and which the target leaves out.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time


def median_seconds(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per measurement (default 7)")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    from autotune.probes import probe

    print(f"{'import autotune.probes':<34}{time.perf_counter() - start:8.3f} s")
    start = time.perf_counter()
    probe(runtime=False)
    print(f"{'first probe(runtime=False)':<34}{time.perf_counter() - start:8.3f} s  (imports psutil, pynvml)")
    cases = [
        ("probe(runtime=False, gpus=False)", lambda: probe(runtime=False, gpus=False)),
        ("probe(runtime=False)", lambda: probe(runtime=False)),
    ]
    for label, fn in cases:
        print(f"{label:<34}{median_seconds(fn, args.runs):8.3f} s  (median of {args.runs})")

    start = time.perf_counter()
    import torch  # noqa: F401 - measured on its own: the one cost the target leaves out

    print(f"{'import torch (once, excluded)':<34}{time.perf_counter() - start:8.3f} s")
    label = "probe() with runtime, torch loaded"
    print(f"{label:<34}{median_seconds(lambda: probe(), args.runs):8.3f} s  (median of {args.runs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
