"""Samples/s of 1 process (2 threads) against 2 DDP processes (1 thread each) on the same 2 cores.

    python benchmarks/processes_side_by_side.py [--workloads cnn transformer] [--repeats 2]

Each measurement is a real trial (``autotune.trial.runner.run_trial``) with PyTorch's defaults otherwise;
the two settings alternate, so a neighbour's load on a shared machine hits both alike. Prints every
measurement and the ratio (2 processes / 1 process) per repeat. The total threads (2) and the global
batch (the workload's default) are the same on both sides.
"""
from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["cnn", "transformer"])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)

    from autotune import probes
    from autotune.search_spaces import SpaceContext, defaults
    from autotune.trial import TrialSettings, run_trial
    from autotune.workloads import load_workload

    facts = probes.probe()
    settings = TrialSettings(warmup_steps=4, measure_steps=24, windows=4, max_extra_windows=0, eval_samples=128)
    for name in args.workloads:
        batch = load_workload(name).batch_size
        base = {**defaults(facts, SpaceContext(default_batch_size=batch)), "device": "cpu", "reference_batch": batch,
                "threads": 2, "interop_threads": 1, "compile_mode": "none"}
        for repeat in range(args.repeats):
            rates = {}
            for processes in (1, 2):
                result = run_trial(name, {**base, "processes": processes}, facts, settings, timeout_s=600)
                if result.status != "ok":
                    print(f"{name} processes={processes}: {result.status} {result.error}")
                    return 1
                rates[processes] = result.samples_per_s
                ranks = result.in_effect.get("ranks")
                print(f"{name} repeat {repeat} processes={processes}: {result.samples_per_s:8.1f} samples/s "
                      f"(spread {result.spread:.2f}, loss {result.loss:.4f}, ranks {ranks})", flush=True)
            print(f"{name} repeat {repeat}: 2 processes / 1 process = {rates[2] / rates[1]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
