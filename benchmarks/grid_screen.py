"""The search benchmark's screen (issue 58, item 1): every combination of a reduced space measured paired, with the
engine the search uses live, into a ``RecordedGrid`` that the replay draws from (``search_quality.py --record``).

- The defaults' environment is visited first: its worker calibrates (an A/A of the defaults: window length, pairs,
  margin, noise).
- Every environment (the combinations' environment-level knobs: threads, interop threads, affinity, OpenMP
  runtime, allocator; ``environment_keys``) is visited ``--workers`` times (default 2), each visit a fresh worker
  in which its combinations are arms against that environment's defaults arm with their share of ``--pairs``: one
  worker's arm placement and age do not decide a cell. After the first visit of the defaults' environment, the
  visits come in random order, so a VM's minutes-long speed state does not fall on one environment.
- An environment other than the defaults' gets its factor over them from ``--process-pairs`` fresh process pairs,
  split between its visits: spread over the recording.

Resumable: each visit, once done, is one JSON line in ``NAME.partial.jsonl`` beside the grid (after a header with
the calibration, the order of visits, the combinations and the machine's fingerprint); a recording started again
with the same options on the same machine runs the visits not done, and writes the grid when every visit is in. The
truth that scores a replay comes from another stage (``verify_grid.py``): the screen's own readings are what the
replay draws from.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any


def environment_keys(combos: list[dict[str, Any]]) -> tuple[str, ...]:
    """The knobs of ``combos`` that a worker's environment holds (``search_spaces.environment_keys``): one environment
    per combination of their values; none where only in-process knobs are searched (the defaults' environment alone).

    >>> environment_keys([{"threads": 1, "openmp": "gnu", "kmp_blocktime": None, "amp_dtype": None}])
    ('threads', 'openmp', 'kmp_blocktime')
    """
    from autotune import search_spaces

    held = set(search_spaces.environment_keys())
    return tuple(k for k in (combos[0] if combos else {}) if k in held)


def partial_path(grid_path: str | Path) -> Path:
    path = Path(grid_path)
    return path.with_name(f"{path.stem}.partial.jsonl")


def visits(envs: list[tuple[Any, ...]], home: tuple[Any, ...], workers: int, seed: int) -> list[tuple[Any, ...]]:
    """The order of the visits: the defaults' environment first (it calibrates), then every environment's visits in
    random order, each environment ``workers`` times in all."""
    rng = random.Random(seed)
    rest = [env for env in envs for _ in range(workers)]
    rest.remove(home)
    return [home, *rng.sample(rest, len(rest))]


def shares(total: int, parts: int, index: int) -> int:
    """Visit ``index``'s share of ``total`` split over ``parts`` visits (the first ones take the remainder)."""
    return total // parts + (1 if index < total % parts else 0)


def merge(parts: list[Any], factors: list[float]) -> Any:
    """One combination's visits as one recorded cell: every visit's ratios, the environment's process pairs from
    all its visits; a visit that failed (``oom``, ``nan``, ``crash``) makes the cell failed, with what ran before."""
    from dataclasses import replace

    from autotune.testing.grid import GridConfig

    ratios = [r for p in parts for r in p.ratios]
    failed = next((p for p in parts if p.state != "ok"), None)
    if failed is not None:
        return replace(failed, ratios=ratios, process_pair_factors=factors)
    med = lambda values: statistics.median(values) if values else None  # noqa: E731
    first = parts[0]
    return GridConfig(first.params, "ok", None, ratios, factors, med([p.loss for p in parts if p.loss is not None]),
                      first.loss_samples, first.window_s, statistics.fmean(p.warmup_s for p in parts),
                      med([p.compile_s for p in parts if p.compile_s is not None]),
                      med([p.step_s for p in parts if p.step_s is not None]),
                      med([p.data_wait for p in parts if p.data_wait is not None]))


def _record_arms(worker: Any, defaults: dict[str, Any], combos: list[dict[str, Any]], pairs: int,
                 window_s: float, train_steps: int, seed: int) -> list[Any]:
    """Each combination as an arm of ``worker``, ``pairs`` pairs against its ``defaults`` arm, then its loss."""
    from autotune.measure import stats
    from autotune.measure.hopeless import HOPELESS
    from autotune.testing.grid import GridConfig

    out = []
    for index, combo in enumerate(combos):
        name, started = f"c{index}", time.monotonic()
        # far slower than its environment's defaults in its warm-up (float16 on a CPU: 0.01x), it is stopped there,
        # as the search stops it (``HOPELESS``): its pairs and loss would take minutes a cell
        status = worker.add_arm(name, {**defaults, **combo}, give_up=HOPELESS, against="defaults")
        warmup_s = time.monotonic() - started
        if status.state == "ok" and status.gave_up is not None:
            why = f"gave up in its warm-up: a step took {status.gave_up:.0f}x the defaults' time per sample"
            out.append(GridConfig(combo, "gave_up", why, warmup_s=warmup_s))
            print(f"  {combo}: {why}", flush=True)
            worker.drop_arm(name)
            continue
        if status.state != "ok":
            out.append(GridConfig(combo, status.state, status.error, warmup_s=warmup_s))
            print(f"  {combo}: {status.state} {status.error}", flush=True)
            worker.drop_arm(name)
            continue
        run = worker.run_pairs("defaults", name, pairs, window_s, seed=seed + index)
        ratios = stats.amortised_ratios(run.pairs, run.base, run.cand, train_steps=train_steps)
        cand = worker.evaluate(name) if run.cand.state == "ok" else run.cand
        worker.drop_arm(name)
        if run.base.state != "ok":  # the long-lived defaults arm diverged or failed: a fresh one for the rest
            print(f"  the defaults arm failed ({run.base.state}: {run.base.error}); rebuilt", flush=True)
            worker.drop_arm("defaults")
            held = {k: combo[k] for k in environment_keys([combo])}
            if worker.add_arm("defaults", {**defaults, **held}).state != "ok":
                raise SystemExit("the defaults arm failed again")
        config = GridConfig(combo, cand.state, cand.error, ratios, [], cand.loss, cand.loss_samples, window_s,
                            warmup_s, cand.compile_s, cand.step_s, cand.data_wait)
        out.append(config)
        iv = config.speedup() if ratios else None
        shown = f"{iv.median:.3f} [{iv.low:.3f}-{iv.high:.3f}]" if iv else "-"
        print(f"  {combo}: {cand.state} speedup {shown} over {len(ratios)} pairs, loss {cand.loss}", flush=True)
    return out


def _calibrate(worker: Any, defaults: dict[str, Any], pairs: int, window_s: float | None) -> Any:
    from autotune.measure import Noise

    started = time.monotonic()
    cal = worker.calibrate("defaults", defaults, pairs=pairs, window_s=window_s)
    noise = Noise(cal.window_s, cal.pairs, cal.half_width, cal.margin, cal.spread,
                  (cal.aa.amortised.median, cal.aa.amortised.low, cal.aa.amortised.high),
                  timed_s=2 * cal.aa.ratio.count * cal.window_s, wall_s=time.monotonic() - started)
    print(f"calibration: {noise.note()}; A/A {noise.aa[0]:.3f} [{noise.aa[1]:.3f}-{noise.aa[2]:.3f}], "
          f"window {noise.window_s:.2f} s, {noise.pairs} pairs", flush=True)
    return noise


def _resume(path: Path, header: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[int, dict[str, Any]]]:
    """What an earlier recording with the same options left: its header (calibration, order) and its whole visits
    by index. The file is written back without a line a stop tore (a visit written onto it would be lost)."""
    if not path.exists():
        return None, {}
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # torn by a stop mid-write: that visit runs again
    if not rows or rows[0].get("options") != header["options"]:
        raise SystemExit(f"{path} holds a recording with other options (or other combinations): remove it, or "
                         f"record with its options ({rows[0].get('options') if rows else 'none'})")
    if rows[0].get("fingerprint") != header.get("fingerprint"):  # a session may get another CPU: never one grid
        raise SystemExit(f"{path} holds a recording begun on another machine (fingerprint "  # repr: a file's text
                         f"{rows[0].get('fingerprint')!r}, this one {header.get('fingerprint')!r}): record this one's "
                         "grid under another name")
    path.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    return rows[0], {r["visit"]: r for r in rows[1:] if "visit" in r}


def record(args: argparse.Namespace, combos: list[dict[str, Any]], setup: tuple[Any, Any, Any, dict[str, Any]],
           searched_keys: list[str]) -> int:
    from autotune.measure import Noise, PairedWorker, across_processes
    from autotune.testing.grid import GridConfig, RecordedGrid
    from autotune.trial import TrialSettings

    settings = TrialSettings(warmup_steps=args.warmup_steps, measure_steps=args.steps)
    facts, _, _, defaults = setup
    envs: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    environment = environment_keys(combos)
    for combo in combos:
        envs.setdefault(tuple(combo[k] for k in environment), []).append(combo)
    home = tuple(defaults[k] for k in environment)
    if args.workers < 1 or args.process_pairs < args.workers:
        raise SystemExit(f"--process-pairs {args.process_pairs} for --workers {args.workers}: every visit of an "
                         "environment takes at least one process pair")
    options = {k: getattr(args, k) for k in ("workload", "searched", "pairs", "most_pairs", "window_s",
                                             "process_pairs", "steps", "warmup_steps", "workers", "seed")}
    options["combinations"] = combos  # recorded in this order; merged by their knobs
    partial = partial_path(args.grid)
    header, done = _resume(partial, {"options": options, "fingerprint": facts.fingerprint})
    if header is None:
        order = visits(list(envs), home, args.workers, args.seed)
        header = {"options": options, "fingerprint": facts.fingerprint, "order": [list(e) for e in order],
                  "started": time.time(), "load_before": list(os.getloadavg())}
    order = [tuple(e) for e in header["order"]]
    noise = Noise(**{**header["noise"], "aa": tuple(header["noise"]["aa"])}) if "noise" in header else None
    print(f"grid: {len(combos)} combinations of {args.searched} on {args.workload}, {len(envs)} environments, "
          f"{len(order)} visits ({len(done)} done before)", flush=True)
    for index, env in enumerate(order):
        if index in done:
            continue
        nth = order[:index].count(env)
        env_defaults = {**defaults, **dict(zip(environment, env, strict=True))}
        visit: dict[str, Any] = {"visit": index, "env": list(env), "factors": [], "started": time.time()}
        if env != home:
            assert noise is not None
            count = shares(args.process_pairs, args.workers, nth)
            across_started = time.monotonic()
            across = across_processes(args.workload, defaults, env_defaults, facts, settings,
                                      pairs=max(4, noise.pairs // 2), window_s=noise.window_s, least=count,
                                      most=count, half_width=noise.half_width, margin=noise.margin,
                                      seed=1000 * index + 100_000 * args.seed)
            visit["factors"] = list(across.per_process)
            visit["pair_s"] = (time.monotonic() - across_started) / max(1, len(visit["factors"]))
            print(f"environment {env}, visit {nth + 1}: factor {across.ratio.median:.3f} [{across.ratio.low:.3f}-"
                  f"{across.ratio.high:.3f}] over {len(visit['factors'])} process pairs", flush=True)
        with PairedWorker(args.workload, env_defaults, facts, settings) as worker:
            if noise is None:
                noise = _calibrate(worker, defaults, args.pairs, args.window_s)  # keeps its "defaults" arm
                header["noise"] = {**asdict(noise), "aa": list(noise.aa)}
                partial.parent.mkdir(parents=True, exist_ok=True)
                partial.write_text(json.dumps(header) + "\n")
            elif worker.add_arm("defaults", env_defaults).state != "ok":
                raise SystemExit(f"the defaults arm of environment {env} failed")
            pairs = shares(min(max(args.pairs, noise.pairs), args.most_pairs), args.workers, nth)
            configs = _record_arms(worker, defaults, envs[env], pairs, noise.window_s, settings.train_steps,
                                   seed=100 * index + 100_000 * args.seed)
        visit["configs"] = [asdict(c) for c in configs]
        visit["wall_s"] = time.time() - visit["started"]
        with partial.open("a") as f:
            f.write(json.dumps(visit, default=str) + "\n")
        done[index] = visit
    assert noise is not None
    by_env: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for visit in done.values():
        by_env.setdefault(tuple(visit["env"]), []).append(visit)
    short = {env: len(by_env.get(env, [])) for env in envs if len(by_env.get(env, [])) != args.workers}
    if short:
        raise SystemExit(f"visits per environment {short}, not {args.workers}: {partial} is kept")
    merged = []
    for env, env_combos in envs.items():
        factors = [f for v in by_env[env] for f in v["factors"]]
        for combo in env_combos:
            parts = [GridConfig(**c) for v in by_env[env] for c in v["configs"] if c["params"] == combo]
            if len(parts) != args.workers:
                raise SystemExit(f"{combo}: {len(parts)} visits recorded it, not {args.workers}: {partial} is kept")
            merged.append(merge(parts, factors))
    # the recording's own time: a stop between visits is not counted
    load_after, wall = os.getloadavg(), sum(v.get("wall_s", 0.0) for v in done.values())
    pair_s = [v["pair_s"] for v in done.values() if "pair_s" in v]
    grid = RecordedGrid(
        workload=args.workload, searched=searched_keys, defaults=defaults,
        noise={**noise.__dict__, "aa": list(noise.aa)}, configs=merged,
        note=(f"recorded at niceness {os.nice(0)} on a {os.cpu_count()}-CPU machine "
              f"({platform.processor() or platform.machine()}), load average {header['load_before'][0]:.2f} at start "
              f"and {load_after[0]:.2f} at end (the recording alone keeps about as many cores busy as it uses; more "
              f"means other jobs shared them), {args.workers} workers an environment: its ratios carry that "
              f"machine's noise"),
        recorded={"date": time.strftime("%Y-%m-%d %H:%M %Z"), "wall_s": round(wall, 1),
                  "loadavg": [header["load_before"], list(load_after)], "cpus": os.cpu_count(),
                  "cpu_model": getattr(facts.cpu, "model", None), "pairs": [args.pairs, args.most_pairs],
                  "aa_pairs": args.pairs, "process_pairs": [args.process_pairs, args.process_pairs],
                  "window_s": args.window_s, "steps": args.steps, "warmup_steps": args.warmup_steps,
                  "workers": args.workers, "visits": [done[i]["env"] for i in sorted(done)],
                  "process_pair_s": round(statistics.median(pair_s), 2) if pair_s else None},
        facts=facts.to_dict())
    out = Path(args.grid)
    grid.save(out)
    partial.unlink()
    print(f"recorded {len(merged)} combinations in {wall:.0f} s to {out}")
    print(json.dumps({"benchmark": "search_quality", "recorded": str(out), "grid_size": len(merged),
                      "wall_s": round(wall, 1), "loadavg": grid.recorded["loadavg"], "noise": grid.noise}))
    return 0


def combinations(axes: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [{k: v for part in c for k, v in part.items()} for c in itertools.product(*axes)]

