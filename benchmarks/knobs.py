"""Each knob's throughput against PyTorch's defaults, one change at a time, measured side by side.

    python benchmarks/knobs.py                                  # cnn and transformer, 2 rounds
    python benchmarks/knobs.py --workloads tiny --rounds 1 --steps 6 --warmup-steps 2 --no-compile

For every bundled workload it measures the defaults and every single-knob change the search space
offers on this machine (each value of threads, interop_threads, affinity, openmp with kmp_blocktime,
allocator, batch_per_rank, DataLoader workers, compile_mode, amp_dtype, channels_last, sparsity, processes,
ipex), plus the run_cpu heuristic, each as a real trial (``autotune.trial.runner.run_trial``: a fresh
subprocess started the way the search starts it). A round measures the defaults and then every change;
rounds repeat that, so a neighbour's load on a shared machine hits all alike. The ratio is the median
samples/s of the change over the median of the defaults; ``amortised`` counts compile time over
``--train-steps`` as the search's objective does; ``loss`` is the change of the loss reached (the
quality guard rejects more than +5% by default). The last line printed is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any


def variants(facts: Any, ctx: Any) -> list[tuple[str, dict[str, Any]]]:
    """(label, changes of the defaults) for every single-knob value offered here, then the heuristic."""
    from autotune import search_spaces as spaces

    base = spaces.defaults(facts, ctx)
    out: list[tuple[str, dict[str, Any]]] = []

    def add(changes: dict[str, Any]) -> None:
        if any(base.get(k) != v for k, v in changes.items()):
            out.append((" ".join(f"{k}={v}" for k, v in changes.items()), changes))

    for n in range(1, spaces.threads.max_threads(facts) + 1):
        add({"threads": n})
    for n in range(1, max(1, min(4, spaces.threads.physical_cores(facts))) + 1):
        add({"interop_threads": n})
    multi_node = facts.cpu.allowed.packages > 1 or len(set(facts.cpu.allowed.numa_nodes)) > 1
    for affinity in ("compact", "spread") if multi_node else ("compact",):
        add({"affinity": affinity})
    if "intel" in spaces.preload.openmp_choices(facts):
        for blocktime in spaces.preload.BLOCKTIMES:
            add({"openmp": "intel", "kmp_blocktime": blocktime})
    for allocator in spaces.preload.allocator_choices(facts):
        add({"allocator": allocator})
    for size in spaces.batch.sizes(ctx):
        add({"batch_per_rank": size})
    workers = {"num_workers": 1, "persistent_workers": True, "prefetch_factor": 2}
    out.append(("num_workers=1 (persistent, prefetch 2" + (", pinned)" if ctx.device == "cuda" else ")"),
                {**workers, "pin_memory": ctx.device == "cuda"}))
    for mode in spaces.compilation.modes(facts, ctx):
        add({"compile_mode": mode})
    for dtype in spaces.amp.dtypes(facts, ctx):
        add({"amp_dtype": dtype})
    if ctx.conv:
        add({"channels_last": True})
    if ctx.device == "cuda":
        add({"tf32_matmul": True})
        if ctx.conv or ctx.conv_nd:
            add({"tf32_cudnn": False})
            add({"cudnn_benchmark": True})
        add({"cuda_alloc": "expandable_segments"})
    patterns = spaces.sparsity.patterns(facts, ctx)
    if "structured" in patterns:
        for ratio in (0.5, 0.8):
            add({"sparsity_pattern": "structured", "sparsity": ratio})
    if "2:4" in patterns:
        add({"sparsity_pattern": "2:4", "sparsity": 0.5})
    for count in spaces.processes.choices(facts, ctx):
        add({"processes": count})
    if spaces.ipex.available(facts, ctx):
        add({"ipex": True})
    heuristic = {k: v for k, v in spaces.heuristic(facts, ctx).items() if base.get(k) != v}
    if heuristic:
        out.append(("heuristic (run_cpu's choices, together)", heuristic))
    return out


def _median(results: list[Any], field: str) -> float | None:
    values = [getattr(r, field) for r in results if r.status == "ok" and getattr(r, field)]
    return statistics.median(values) if values else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["cnn", "transformer"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=24, help="timed steps per trial (autotune search --steps)")
    parser.add_argument("--warmup-steps", type=int, default=4)
    parser.add_argument("--train-steps", type=int, default=5000, help="compile time is amortised over them")
    parser.add_argument("--no-compile", action="store_true", help="leave the compile modes out (they take minutes)")
    parser.add_argument("--only", nargs="+", default=None, metavar="KNOB", help="measure only changes of these knobs")
    args = parser.parse_args(argv)

    from autotune import probes
    from autotune import search_spaces as spaces
    from autotune.study import SearchOptions, run_settings, search_context
    from autotune.trial import TrialSettings, run_trial

    facts = probes.probe()
    settings = TrialSettings(warmup_steps=args.warmup_steps, measure_steps=args.steps, train_steps=args.train_steps)
    options = SearchOptions(compile=not args.no_compile, settings=settings)
    isa = ",".join(f for f in facts.cpu.isa if f.startswith(("avx", "amx")))
    print(f"{facts.cpu.model}: {facts.cpu.allowed.cores} cores, {facts.cpu.allowed.threads} threads, isa {isa}; "
          f"{len(facts.gpus)} GPU(s); torch {facts.runtime.torch_version if facts.runtime else '?'}", flush=True)
    summary: dict[str, Any] = {"machine": facts.cpu.model, "fingerprint": facts.fingerprint, "rounds": args.rounds,
                               "workloads": {}}
    for workload in args.workloads:
        _, ctx = search_context(workload, facts, options)
        base = {**spaces.defaults(facts, ctx), **run_settings(ctx, options)}
        changes = [(label, c) for label, c in variants(facts, ctx) if args.only is None or set(c) & set(args.only)]
        runs: dict[str, list[Any]] = {"defaults": [], **{label: [] for label, _ in changes}}
        for round_ in range(args.rounds):
            for label, change in [("defaults", {}), *changes]:
                result = run_trial(workload, {**base, **change}, facts, settings, timeout_s=600)
                runs[label].append(result)
                speed = f"{result.samples_per_s:.1f} samples/s" if result.samples_per_s else result.status
                print(f"  {workload} round {round_ + 1}: {label}: {speed}"
                      + (f" (compile {result.compile_s:.1f} s)" if result.compile_s and result.compile_s > 1 else "")
                      + (f" [{result.error}]" if result.error else ""), flush=True)
        ref, ref_obj = _median(runs["defaults"], "samples_per_s"), _median(runs["defaults"], "objective")
        ref_loss = _median(runs["defaults"], "loss")
        if not ref:
            print(f"{workload}: the defaults did not run: {runs['defaults'][-1].error}")
            continue
        heuristic = {k: v for k, v in spaces.heuristic(facts, ctx).items() if base.get(k) != v}
        print(f"\n{workload}: defaults {ref:.1f} samples/s, loss {ref_loss:.4f}; heuristic = {heuristic}")
        print(f"  {'change':<44} {'samples/s':>10} {'ratio':>6} {'amortised':>9} {'loss':>7}")
        rows = {}
        for label, _ in changes:
            speed, objective, loss = (_median(runs[label], f) for f in ("samples_per_s", "objective", "loss"))
            if speed is None:
                status = runs[label][-1].status
                print(f"  {label:<44} {status:>10}  {runs[label][-1].error or ''}")
                rows[label] = {"status": status}
                continue
            loss_change = (loss - ref_loss) / abs(ref_loss) if loss is not None and ref_loss else None
            rows[label] = {"samples_per_s": round(speed, 1), "ratio": round(speed / ref, 3),
                           "amortised_ratio": round(objective / ref_obj, 3) if objective and ref_obj else None,
                           "loss_change": round(loss_change, 4) if loss_change is not None else None}
            print(f"  {label:<44} {speed:>10.1f} {speed / ref:>5.2f}x {rows[label]['amortised_ratio'] or 0:>8.2f}x "
                  f"{loss_change if loss_change is not None else 0:>+7.1%}")
        summary["workloads"][workload] = {"defaults_samples_per_s": round(ref, 1), "changes": rows}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
