"""How close does autotune's search get to the best of an exhaustive grid, with a fraction of its trials?

A reduced space (threads x interop_threads x amp_dtype x batch_size x channels_last; compile off; every
other knob held at PyTorch's default, in the search by ``--fix``) is measured in two stages: the screen
(``--record``, ``grid_screen.py``: every combination PAIRED with the engine the search uses live, each environment in
``--workers`` workers visited in random order, resumable), written to a ``RecordedGrid`` (JSON) that keeps every
pair's amortised ratio, every process pair's factor, each arm's loss at the study's sample count and how an arm
failed; and the verification (``verify_grid.py``: the cells that decide a score re-measured in fresh process pairs,
in sessions the replay never sees).

Then (without ``--record``) the search runs against the file: ``search(..., measurer=ReplayMeasurer(grid,
seed))`` with its real sampler, seeding, race and confirmation, at most ``--fraction`` of the grid's
combinations as trials, for ``--seeds`` seeds, in seconds: autotune's search, its sampler alone (no seed of any
kind) and, with ``--baselines``, random search, Optuna's TPE at its defaults, one factor at a time from the
defaults, the seed list alone and the grid in random order (``baselines.py``), each in the same loop, replayed
measurer, clock and confirmation (``search(..., sampler=)``: the baseline picks every trial after the baseline, with
no in-process turns). Each is scored on the log scale
(``quality_metrics``): the gain captured G = log T(returned) / log T*, the near-optimal rate, the 10th percentile
of G, P(T < 1), G against random search's, and G at 30, 60, 120 and 300 s of charged time, medians with bootstrap
intervals over the seeds. T is the held-out truth where ``verify_grid.py`` re-measured a cell (its file beside the grid,
or ``--verified``): fresh process pairs in sessions the replay never saw, and T* the best verified; any other cell's
T is the grid's own measurement (all recorded pairs), which the replay drew from: the figures say which. Targets (the
issue's, on grids whose best is 1.10x or more): median G >= 0.90, near-optimal >= 70%, the 10th percentile of G >=
0.5, P(T < 1) <= 2%, the sampler alone's G at least random search's less 0.05 (its paired bootstrap 90% bound).

    python benchmarks/search_quality.py --record     # once, on a quiet machine (16 minutes on 2 cores)
    python benchmarks/search_quality.py --seeds 20   # replay: the search against the file
    python benchmarks/search_quality.py --seeds 30 --baselines --budget 120   # beside the baselines

``benchmarks/grids/cnn-paired.json`` was recorded with ``... --record --pairs 10 --most-pairs 10
--process-pairs 3 --window-s 0.5`` on a 2-core AMD EPYC (AVX-512 with bf16) with nothing else running (load
average 0.28 at start, 2.03 at end: the recording's own two threads; in the file): 80 combinations in 16
minutes, 48 of them feasible (the quality guard refuses batch 128's loss at the fixed sample count). The
defaults' identical copy reads 0.999x [0.969-1.019]; one thread reads 0.47-0.60x of two; the best,
bfloat16 + channels_last at batch 64, 1.750x [1.718-1.799]. (The grid it replaced was recorded on the same
kind of machine loaded by other jobs, load average 5-7: there one thread read 8-14x faster than two, and
the replay found 0.783 of that grid's best.) It holds no facts of its machine: replayed on another CPU it is
scored over the combinations that machine's space reaches (on an AVX2-only EPYC, without bf16: 0.855 of the
reachable best, which is a 3-process-pair reading, 1.311x [0.759-2.263]).

``benchmarks/grids/cnn-paired-avx2.json`` was recorded with the same options on a 2-core AMD EPYC with AVX2
only (no bf16; its facts are in the file), load average 1.34 at start and 1.95 at end: 40 combinations in 11
minutes, 24 feasible. The best, channels_last at batch 64, 1.218x [1.195-1.228]; one thread 0.48-0.69x. Its
replay (``--grid benchmarks/grids/cnn-paired-avx2.json``) found the best in 20 of 20 seeds with 6 trials of 40:
an easy grid, its best being a seed.

The last line printed is one JSON object with the figures.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grid_screen  # noqa: E402 - the screen's recording beside this file
import quality_metrics as qm  # noqa: E402 - the scores beside this file
import verify_grid  # noqa: E402 - the held-out truth beside this file
from baselines import STRATEGIES, Plan  # noqa: E402 - the baselines beside this file

from autotune.testing.replay import ReplayMeasurer  # noqa: E402
from autotune.trial.spec import Status, TrialResult  # noqa: E402

SEARCHED = ("threads", "interop_threads", "amp_dtype", "batch_size", "channels_last")
AXES = (*SEARCHED, "num_workers", "openmp", "allocator", "affinity")  # what --searched may name
LOADER = ("num_workers", "persistent_workers", "prefetch_factor")  # the num_workers axis sets all three
GRIDS = Path(__file__).resolve().parent / "grids"


class Traced(ReplayMeasurer):
    """The replay's measurer that keeps, for each search trial, the charged time at its end, its cell's truth and
    its own reading (None: failed, or infeasible in the grid): the anytime gain's trace (``qm.anytime``)."""

    def __init__(self, grid: Any, seed: int, clock: Any, feasible: dict[tuple[Any, ...], float],
                 truth: dict[tuple[Any, ...], float]) -> None:
        super().__init__(grid, seed, clock)
        self.feasible, self.truth = feasible, truth
        self.trace: list[tuple[float, float, float | None]] = []
        self.keys: dict[int, tuple[Any, ...]] = {}

    def begin(self, params: dict[str, Any], timeout_s: float) -> object | TrialResult:
        handle = super().begin(params, timeout_s)
        if not isinstance(handle, TrialResult):
            self.keys[id(handle)] = self.grid.key(params)
        return handle

    def end(self, handle: object) -> TrialResult:
        result = super().end(handle)
        key = self.keys.pop(id(handle), None)
        if key is not None and not self.confirming and self.clock is not None:
            ok = result.status == Status.OK and key in self.feasible
            self.trace.append((self.clock.charged, self.truth.get(key, 1.0), result.objective if ok else None))
        return result


KEPT_FOR_TRUTH = 2  # pairs of a recipe the claim never draws: its truth is scored from pairs the claim did not see


class WithYourRuns(Traced):
    """``Traced`` with the claim about your runs replayed, as a live search spends on it (``study.claim``: up to
    ``CLAIM_SHARE`` of the budget): each pair drawn, without replacement, from the verification's fresh process
    pairs of the recipe's cell (``verify_grid.pairs_of``), which the screen the search chose from never saw, and
    charged their recorded time; the truth that scores the seed is then the mean of that cell's other pairs
    (``truth_beside``), so a claim is never judged against its own pairs. A recipe not re-measured has none
    (``PairFailed``): its claim stays the workers', as a live claim whose pairs failed. A trial process's run
    (``Noise.run_s``), which prices a pair of your runs before one ran, is read from the grid's worker start
    (``ReplayMeasurer.calibrate``) and its defaults' step, as live reads it from the calibration."""

    user_processes = True

    def __init__(self, grid: Any, seed: int, clock: Any, feasible: dict[tuple[Any, ...], float],
                 truth: dict[tuple[Any, ...], float], user: dict[tuple[Any, ...], list[tuple[float, float, float]]]
                 ) -> None:
        super().__init__(grid, seed, clock, feasible, truth)
        self.user, self.user_left = user, {}
        self.drawn: dict[tuple[Any, ...], list[tuple[float, float, float]]] = {}

    def calibrate(self, timeout_s: float) -> Any:
        from autotune.measure.runs import trial_run_s
        from autotune.trial import TrialSettings

        noise = super().calibrate(timeout_s)
        if noise.start_s is None:
            return noise
        home = self.grid.find(self.grid.defaults)
        batch = self.grid.defaults.get("batch_per_rank") or self.grid.defaults.get("batch_size") or 1
        run_s = trial_run_s(noise.start_s, home.step_s, TrialSettings(), batch) if home.step_s else None
        return replace(noise, run_s=run_s)

    def user_pair(self, params: dict[str, Any], seed: int, timeout_s: float) -> Any:
        from autotune.measure import PairFailed, RunPair

        key = self.grid.key(params)
        pool = self.user.get(key, [])
        left = self.user_left.setdefault(key, random.Random(f"user:{self.split_seed}:{key}").sample(pool, len(pool)))
        if len(left) <= KEPT_FOR_TRUTH:
            raise PairFailed(f"the verification keeps its last {KEPT_FOR_TRUTH} fresh process pairs of this recipe for "
                             "its truth" if pool else
                             "this recipe was not re-measured in fresh process pairs (verify_grid.py)")
        if left[-1][1] > timeout_s:  # a live pair runs until the budget's end stops it: that time is spent
            self.charge(timeout_s)
            raise PairFailed(f"no time left for a pair of about {left[-1][1]:.0f} s")
        pair = left.pop()
        self.drawn.setdefault(key, []).append(pair)
        self.charge(pair[1])
        return RunPair(pair[0], pair[2], pair[1])

    def truth_beside(self, key: tuple[Any, ...], truth: float) -> float:
        """``key``'s truth from the verification's pairs this replay's claim did not draw (``truth`` where it drew
        none, or all)."""
        rest = list(self.user.get(key, []))
        for pair in self.drawn.get(key, []):
            rest.remove(pair)
        if not self.drawn.get(key) or not rest:
            return truth
        return math.exp(statistics.fmean(math.log(r) for r, _, _ in rest))


def _distinct(recipes: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """``recipes`` each once, in their first order."""
    return [dict(p) for p in dict.fromkeys(tuple(r.items()) for r in recipes)]


def _undecided(grid: Any, outcome: Any) -> dict[str, Any] | None:
    """The searched knobs of the candidate ``outcome``'s rounds could not decide, which its claim tests."""
    found = outcome.confirmation.undecided if outcome.confirmation is not None else None
    return dict(zip(grid.searched, grid.key(found.params), strict=True)) if found is not None else None


def _axes(facts: Any, ctx: Any, searched: tuple[str, ...] = SEARCHED) -> list[list[dict[str, Any]]]:
    """Every value the search may pick for each searched knob, as the knobs it sets (threads: 1, the cores and
    all CPUs where there are more than 4: a larger machine's grid is not exhaustive in threads; num_workers: 0 to
    the space's most, with persistent workers and each prefetch factor the space offers; openmp: GNU's, and Intel's
    where the machine has it with ``KMP_BLOCKTIME=1`` alone, the heuristic's: the replay fixes the blocktime to the
    one value recorded, ``narrowed``; allocator and affinity: those the space offers on the machine)."""
    from autotune import search_spaces as spaces

    most = spaces.threads.max_threads(facts)
    cores = spaces.threads.physical_cores(facts)
    values: dict[str, list[Any]] = {
        "threads": list(range(1, most + 1)) if most <= 4 else sorted({1, cores, most}),
        "interop_threads": list(range(1, max(1, min(4, cores)) + 1)),
        "amp_dtype": list(spaces.amp.dtypes(facts, ctx)),
        "batch_size": list(spaces.batch.sizes(ctx)),
        "channels_last": [False, True] if ctx.conv else [False],
        "allocator": list(spaces.preload.allocator_choices(facts)),
    }
    if "affinity" in searched:  # the space's walk, only where asked
        values["affinity"] = list(spaces.allowed_values(facts, ctx)["affinity"].choices)
    openmp = [{"openmp": o, "kmp_blocktime": 1 if o == "intel" else None} for o in spaces.preload.openmp_choices(facts)]
    # batch_size is recorded under today's name (recipe format 2: the batch one process loads)
    axes = [openmp if name == "openmp" else [{"batch_per_rank" if name == "batch_size" else name: v}
                                             for v in values[name]]
            for name in searched if name != "num_workers"]
    if "num_workers" in searched:
        axes.append([{"num_workers": 0, "persistent_workers": False, "prefetch_factor": None},
                     *({"num_workers": w, "persistent_workers": True, "prefetch_factor": f}
                       for w in range(1, spaces.data.most_workers(facts) + 1) for f in (2, 4))])
    return axes


def narrowed(grid: Any) -> dict[str, Any]:
    """The searched knobs the grid recorded at one value besides None (the value where another knob asks it:
    ``kmp_blocktime`` 1 under Intel's OpenMP, None under GNU's), held there: the replayed space offers more.

    >>> from types import SimpleNamespace as G
    >>> narrowed(G(searched=["openmp", "kmp_blocktime", "threads"], configs=[G(params={"openmp": o, \
"kmp_blocktime": b, "threads": t}) for o, b in (("gnu", None), ("intel", 1)) for t in (1, 2)]))
    {'kmp_blocktime': 1}
    """
    values: dict[str, set[Any]] = {}
    for config in grid.configs:
        for k in grid.searched:
            values.setdefault(k, set()).add(config.params.get(k))
    return {k: next(iter(v - {None})) for k, v in values.items() if None in v and len(v) == 2}


def _names(keys: list[str]) -> tuple[str, ...]:
    """The axes (``AXES``) of a grid's searched knobs (``_searched_keys`` backwards; a recorded ``batch_size``
    is today's ``batch_per_rank``)."""
    named = {"batch_per_rank": "batch_size", "persistent_workers": None, "prefetch_factor": None,
             "kmp_blocktime": None}
    return tuple(n for n in dict.fromkeys(named.get(k, k) for k in keys) if n is not None)


def _searched_keys(searched: tuple[str, ...]) -> list[str]:
    named = {"num_workers": LOADER, "batch_size": ("batch_per_rank",), "openmp": ("openmp", "kmp_blocktime")}
    return [k for name in searched for k in named.get(name, (name,))]


def _setup(workload: str, settings: Any) -> tuple[Any, Any, Any, dict[str, Any]]:
    from autotune import probes
    from autotune import search_spaces as spaces
    from autotune.study import SearchOptions, run_settings, search_context

    facts = probes.probe()
    options = SearchOptions(budget_s=None, settings=settings, compile=False)
    _, ctx = search_context(workload, facts, options)
    return facts, ctx, options, {**spaces.defaults(facts, ctx), **run_settings(ctx, options)}


def record(args: argparse.Namespace) -> int:
    """The screen (``grid_screen.record``) of every combination of ``--searched`` on ``--workload``."""
    from autotune.trial import TrialSettings

    searched = tuple(args.searched.split(","))
    unknown = [name for name in searched if name not in AXES]
    if unknown:
        raise SystemExit(f"--searched: {', '.join(unknown)} (known: {', '.join(AXES)})")
    setup = _setup(args.workload, TrialSettings(warmup_steps=args.warmup_steps, measure_steps=args.steps))
    combos = grid_screen.combinations(_axes(setup[0], setup[1], searched))
    return grid_screen.record(args, combos, setup, _searched_keys(searched))


def score_heuristic(grid: Any, scores: dict[tuple[Any, ...], float], heuristic: dict[str, Any],
                    defaults: dict[str, Any]) -> tuple[float | None, str]:
    """The heuristic's share of the grid's best, and how it reads: as itself, or missing. Where it sets a knob the
    grid holds fixed (affinity, OpenMP runtime, allocator), no cell is the heuristic: scored as the cell it shares
    its searched knobs with, it was another recipe's figure (every recorded grid's heuristic sets four such)."""
    held = {**defaults, **grid.defaults}  # a knob added since the recording: at today's default
    off_grid = {k: v for k, v in heuristic.items() if k not in grid.searched_names() and held.get(k) != v}
    if off_grid:
        return None, f"not in the grid (it sets {', '.join(f'{k}={v!r}' for k, v in off_grid.items())})"
    key = grid.key(heuristic)
    if key not in scores:
        return None, "not feasible in the grid"
    share = scores[key] / max(scores.values())
    return share, f"{share:.3f}"


def replay(args: argparse.Namespace) -> int:
    import inspect

    from autotune import search_spaces as spaces
    from autotune.study import Budget, SearchOptions, search
    from autotune.study.driver import search_context
    from autotune.testing.grid import RecordedGrid
    from autotune.testing.replay import ReplayClock
    from autotune.trial import TrialSettings

    grid = RecordedGrid.load(args.grid)
    if "measurer" not in inspect.signature(search).parameters:
        print("this autotune's search() takes no measurer= yet: the grid can be recorded, not replayed",
              file=sys.stderr)
        return 2
    from autotune import probes

    # The space searched is the recording machine's; a grid recorded without its facts is replayed in this
    # machine's, and scored over the combinations that space can reach (an AVX2-only machine offers no bf16).
    facts = probes.Facts.from_dict(grid.facts) if grid.facts else probes.probe()
    base_options = SearchOptions(budget_s=None, settings=TrialSettings(), compile=False,
                                 max_loss_increase=args.max_loss_increase, confirm_top=args.confirm,
                                 confirm_rounds=args.confirm_rounds)
    _, ctx = search_context(grid.workload, facts, base_options)
    scores = grid.scores(args.max_loss_increase)
    if not grid.facts:
        allowed = spaces.allowed_values(facts, ctx)
        reach = {k: v for k, v in scores.items()
                 if not spaces.outside({**grid.defaults, **dict(zip(grid.searched, k, strict=True))}, facts, ctx,
                                       allowed)}
        if len(reach) < len(scores):
            print(f"the grid holds no facts of the machine that recorded it: replayed in this machine's space, "
                  f"scored over the {len(reach)} of {len(scores)} feasible combinations it can reach")
        scores = reach
    best_key = max(scores, key=lambda k: scores[k])
    grid_best = scores[best_key]
    default_score = scores[grid.key(grid.defaults)] / grid_best
    heuristic = {**grid.defaults, **spaces.heuristic(facts, ctx)}
    heuristic_score, heuristic_said = score_heuristic(grid, scores, heuristic, spaces.defaults(facts, ctx))
    fixed = {**{k: v for k, v in spaces.defaults(facts, ctx).items() if k not in grid.searched_names()},
             **narrowed(grid)}
    trials = max(1, int(args.fraction * len(grid.configs)))
    print(f"grid: {len(grid.configs)} combinations, {len(scores)} feasible; {grid.note}")
    shown = sorted(scores, key=lambda k: -scores[k])[:5]
    print(f"  heuristic {heuristic_said}")
    for label, key in [*(("top", k) for k in shown), ("defaults", grid.key(grid.defaults)),
                       *([("heuristic", grid.key(heuristic))] if heuristic_score is not None else [])]:
        iv = grid.find(dict(zip(grid.searched, key, strict=True))).speedup()
        measured = f"{iv.median:.3f}x [{iv.low:.3f}-{iv.high:.3f}] over {iv.count} pairs"
        if key == grid.key(grid.defaults):  # the reference: its recorded copy is an A/A, the machine's noise
            measured = f"1.000x, the reference (its copy's A/A: {measured})"
        print(f"  {label:9s} {measured}: {dict(zip(grid.searched, key, strict=True))}")
    from autotune.study.records import NOT_RUN
    from autotune.study.seeds import input_seeds
    from autotune.study.seeds import seeds as search_seeds

    # the seeds as the study records them (``spaces.as_trial``: a fixed blocktime under GNU's OpenMP not set)
    seed_list = [params for _, params in search_seeds(
        facts, ctx, replace(base_options, fixed=fixed, storage="sqlite://"), grid.workload, None)[1:]]
    seeded_keys = {grid.key({**grid.defaults, **params}) for params in seed_list}

    def inputs(wait: float | None) -> list[dict[str, Any]]:
        return [p for _, p in input_seeds(wait, spaces.defaults(facts, ctx), facts, ctx, fixed)]

    plan = Plan(spaces.defaults(facts, ctx), grid.key, _axes(facts, ctx, _names(grid.searched)), seed_list, inputs)
    truth = grid.scores()  # every cell that ran, feasible or not: what a returned recipe gets (item 1 verifies it)
    best_half = qm.half_width(*_interval(grid, best_key))
    if args.verified and not Path(args.verified).exists():
        raise SystemExit(f"--verified {args.verified}: no such file")
    found = verify_grid.read(args.verified or verify_grid.verified_path(args.grid), verify_grid.grid_id(grid),
                             facts.fingerprint)
    held_out = verify_grid.truth_of(found)
    truth, t_star, best_half, verified, truth_said = held_out_truth(grid, held_out, truth, best_key, best_half,
                                                                    args.provisional, scores)
    verified_best = max(verified, key=lambda k: truth[k]) if verified else best_key
    # the claim about your runs draws on the re-measured cells' pairs (any session): the replay spends on it as live
    user_pairs = verify_grid.pairs_of(found)
    print(f"truth: {truth_said}")
    strategies = STRATEGIES if args.baselines else STRATEGIES[:2]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in strategies}
    started = time.monotonic()
    if args.budget and not grid.recorded.get("process_pair_s"):
        print("the grid records no process pair's time: the replay's clock charges its process pairs nothing")
    for name, seeded, make_sampler in strategies:
        print(f"{name}:")
        for seed in range(args.seeds):
            with tempfile.TemporaryDirectory() as tmp:
                options = SearchOptions(**{**base_options.__dict__, "trials": trials, "seed": seed, "fixed": fixed,
                                           "seeded": seeded, "storage": f"sqlite:///{Path(tmp) / 'studies.db'}",
                                           "study": f"quality-{seed}", "budget_s": args.budget})
                t0 = time.monotonic()
                clock = ReplayClock(args.frozen_clock)  # the recorded time of what the grid answers, against --budget
                measurer = (WithYourRuns(grid, seed, clock, scores, truth, user_pairs) if user_pairs
                            else Traced(grid, seed, clock, scores, truth))
                outcome = search(grid.workload, options=options, measurer=measurer, facts=facts,
                                 timing=Budget.start(options.budget_s, clock.monotonic),
                                 sampler=make_sampler(seed, plan) if make_sampler else None)
                key = grid.key(outcome.recipe.params)
                confirms = sum(1 for r in outcome.records if r.role == "confirm")
                t = truth.get(key, math.nan)
                if isinstance(measurer, WithYourRuns) and key in verified and key != grid.key(grid.defaults):
                    t = measurer.truth_beside(key, t)
                runs[name].append({
                    "seed": seed, "best_found": scores.get(key, 0.0) / grid_best, "truth": t,
                    "verified": key in verified,
                    "gain": qm.gain(t, t_star), "near": qm.near_optimal(t, t_star, best_half),
                    "gain_at": [qm.gain(x, t_star) for x in qm.anytime(measurer.trace)],
                    # measured, as --trials counts them: not a repeat the loop skipped (a planned baseline's end)
                    "trials": sum(1 for r in outcome.records if r.role != "confirm" and r.result.status not in NOT_RUN),
                    "confirmation_runs": confirms,
                    "claimed": [outcome.recipe.speedup_low, outcome.recipe.speedup_high],
                    "process_pairs": outcome.recipe.process_pairs,
                    "rounds": _rounds(outcome), "wall_s": time.monotonic() - t0, "charged_s": clock.charged,
                    "recipe": dict(zip(grid.searched, key, strict=True)),
                    # the candidate its claim tests with your runs (``Confirmation.undecided``), if any
                    "undecided": _undecided(grid, outcome)})
                r = runs[name][-1]
                low, high = r["claimed"]
                claimed = f"claimed [{low:.3f}-{high:.3f}]" if low is not None and high is not None else "no claim"
                print(f"seed {seed:2d}: G {r['gain']:.3f} ({r['truth']:.3f}x; defaults {default_score:.3f} of the "
                      f"best, heuristic {heuristic_said}), {claimed} over {r['rounds']} round(s), with "
                      f"{r['trials']} trials + {confirms} confirmations in {r['wall_s']:.1f} s "
                      f"({r['charged_s']:.0f} s recorded): {r['recipe']}",
                      flush=True)
    scored = {name: _scores(rows, runs.get("random")) for name, rows in runs.items()}
    ours = scored["autotune"]
    found = [r["best_found"] for r in runs["autotune"]]
    summary = {
        "benchmark": "search_quality", "workload": grid.workload, "grid": str(args.grid),
        "truth": truth_said, "grid_size": len(grid.configs), "feasible": len(scores),
        "grid_best_speedup": round(grid_best, 4), "verified_best": round(t_star, 4) if verified else None,
        "best_is_seed_or_heuristic": verified_best in seeded_keys or (
            heuristic_score is not None and grid.key(heuristic) == verified_best),
        # what the verify stage must re-measure: every strategy's returned recipes, and how many were not
        "returned": {name: _distinct(r["recipe"] for r in rows) for name, rows in runs.items()},
        "returned_unverified": {name: sum(1 for r in rows if not r["verified"]) for name, rows in runs.items()},
        # and the candidates their claims test: a replayed claim draws your runs from the verification's pairs
        # alone, so a tested recipe the verification never re-measured fails its test there, where live it runs
        "tested": {name: _distinct(r["undecided"] for r in rows if r["undecided"]) for name, rows in runs.items()},
        "trials_allowed": trials, "seeds": args.seeds, **ours,
        "sampler_minus_random_low": _round(qm.paired_low([r["gain"] for r in runs["sampler alone"]],
                                                          [r["gain"] for r in runs["random"]]))
        if "random" in runs else None,
        "baselines": {name: figures for name, figures in scored.items() if name != "autotune"},
        "best_found_over_grid_best": [round(f, 4) for f in found],
        "median_best_found": round(statistics.median(found), 4),
        "defaults_over_grid_best": round(default_score, 4),
        "heuristic_over_grid_best": None if heuristic_score is None else round(heuristic_score, 4),
        "heuristic_missing": None if heuristic_score is not None else heuristic_said,
        "budget_s": args.budget, "charged_s": [round(r["charged_s"], 1) for r in runs["autotune"]],
        "trials_used": [r["trials"] for r in runs["autotune"]],
        "confirmation_runs": [r["confirmation_runs"] for r in runs["autotune"]],
        "rounds_of_recipe": [r["rounds"] for r in runs["autotune"]],
        "grid_best_is_seed": best_key in seeded_keys,
        "wall_s": round(time.monotonic() - started, 1), "recorded": grid.recorded,
    }
    low_vs_random = summary["sampler_minus_random_low"]
    summary["targets"] = None if t_star < 1.10 else {  # the issue's; a grid whose best is under 1.10x: n/a
        "median_gain_captured >= 0.90": ours["median_gain_captured"] is not None
        and ours["median_gain_captured"] >= 0.90,
        "near_optimal_rate >= 0.70": ours["near_optimal_rate"] >= 0.70,
        "p10_gain_captured >= 0.5": ours["p10_gain_captured"] is not None and ours["p10_gain_captured"] >= 0.5,
        "p_slower <= 0.02": ours["p_slower"] <= 0.02,
        "sampler_minus_random_low >= -0.05": None if low_vs_random is None else low_vs_random >= -0.05}
    unverified = summary["returned_unverified"]["autotune"]
    # the targets are scored against held-out truth: the screen's own figures only show the way
    summary["not_judged"] = ("no verified truth" if not verified else "provisional truth" if args.provisional
                             else f"{unverified} of autotune's returned recipes not verified" if unverified else None)
    summary["targets_met"] = None if summary["targets"] is None or summary["not_judged"] else all(
        v for v in summary["targets"].values() if v is not None)
    print(f"{'strategy':15s} {'median G [90%]':>22s} {'near-opt':>8s} {'p10 G':>6s} {'P(T<1)':>6s} "
          f"{'vs random':>9s}  G at {', '.join(f'{t:.0f}' for t in qm.ANYTIME_S)} s")
    for name, f in scored.items():
        g, (lo, hi), p10 = f["median_gain_captured"], f["median_gain_captured_interval"], f["p10_gain_captured"]
        interval = f"{g:8.3f} [{lo:.3f}-{hi:.3f}]" if g is not None and lo is not None else f"{'-':>22s}"
        print(f"{name:15s} {interval}   {f['near_optimal_rate']:8.2f} {p10 if p10 is not None else '-':>6} "
              f"{f['p_slower']:6.2f} {f['normalised_vs_random'] or '-':>9} "
              f" {', '.join(f'{x:.2f}' if x is not None else '-' for x in f['gain_at'].values())}")
    print(f"truth: {truth_said}; the grid's best {grid_best:.3f}x is "
          f"{'' if summary['grid_best_is_seed'] else 'not '}a seed; defaults {default_score:.3f} of it; heuristic "
          f"{heuristic_said}; {trials} trials of "
          f"{len(grid.configs)}")
    print(json.dumps(summary))
    if summary["targets"] is None:
        print(f"targets: n/a (the best, {t_star:.3f}x, is under 1.10x)")
    else:
        print(("targets" if not summary["not_judged"] else f"targets, not judged ({summary['not_judged']})") + ": "
              + "; ".join(f"{k} {'n/a (give --baselines)' if v is None else 'met' if v else 'MISSED'}"
                                      for k, v in summary["targets"].items()))
    return 1 if summary["targets_met"] is False else 0


def held_out_truth(grid: Any, held_out: dict[tuple[Any, ...], tuple[float, float, float, str, int]],
                   truth: dict[tuple[Any, ...], float], best_key: tuple[Any, ...], best_half: float,
                   provisional: bool = False, feasible: Any = None
                   ) -> tuple[dict[tuple[Any, ...], float], float, float, set[Any], str]:
    """The truth a replay is scored against: the verified cells' (``verify_grid.truth_of``: status ``verified``;
    with ``provisional``, any re-measured in 3 pairs or more) in place of the screen's, T* the best of them that the
    quality guard lets through (``feasible``: the screen's; None: all) and its half-width the tie band; with none,
    the grid's own. Returns (truth, T*, its half-width, the keys whose truth is held out, what the truth is, in
    words)."""
    usable = {k: v for k, v in held_out.items()
              if v[3] == "verified" or (provisional and math.isfinite(v[0]) and math.isfinite(v[2]))}
    statuses = [v[3] for v in held_out.values()]
    counts = ", ".join(f"{statuses.count(s)} {s}" for s in dict.fromkeys(statuses))
    if not usable:
        return (truth, truth[best_key], best_half, set(),
                "the grid's own measurement of each cell (not held out"
                + (f": {len(held_out)} cells re-measured, {counts}, none verified)" if held_out else ")"))
    contenders = [k for k in usable if feasible is None or k in feasible]
    if not contenders:
        return (truth, truth[best_key], best_half, set(),
                f"the grid's own measurement of each cell (not held out: {counts}, none the quality guard passes)")
    best = max(contenders, key=lambda k: usable[k][0])
    t_star, low, high = usable[best][:3]
    said = (f"{'provisional, ' if provisional else ''}held out: {len(usable)} cells' truth from fresh process pairs "
            f"({counts}), T* {t_star:.3f}x [{low:.3f}-{high:.3f}] {dict(zip(grid.searched, best, strict=True))}; "
            f"any other cell: the grid's own")
    home = grid.key(grid.defaults)
    return ({**truth, **{k: v[0] for k, v in usable.items()}, home: 1.0}, t_star, qm.half_width(low, high),
            {*usable, home}, said)


def _rounds(outcome: Any) -> int:
    """The confirmation rounds behind the recipe (0: none; a recording with few held-out pairs holds one)."""
    best = outcome.confirmation.best if outcome.confirmation is not None else None
    return best.rounds if best is not None else 0


def _interval(grid: Any, key: tuple[Any, ...]) -> tuple[float, float]:
    iv = grid.find(dict(zip(grid.searched, key, strict=True))).speedup()
    return iv.low, iv.high


def _round(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, 4)


def _scores(rows: list[dict[str, Any]], random_rows: list[dict[str, Any]] | None) -> dict[str, Any]:
    """One strategy's figures over its seeds (``quality_metrics``), against random search's where it ran."""
    gains = [r["gain"] for r in rows]
    median, low, high = qm.bootstrap(gains)
    finite = sorted(g for g in gains if math.isfinite(g))
    p10 = finite[max(0, math.ceil(0.10 * len(finite)) - 1)] if finite else math.nan
    g_random = statistics.median(r["gain"] for r in random_rows) if random_rows else None
    at = [statistics.median(r["gain_at"][i] for r in rows) for i in range(len(qm.ANYTIME_S))]
    # the claimed interval against the held-out truth, for offered recipes whose truth is held out
    judged = [r for r in rows if r["verified"] and r["truth"] != 1.0 and None not in r["claimed"]
              and (r["process_pairs"] or 0) >= 3]  # a claim from your runs (3 pairs at least), not the workers'
    holds = sum(1 for r in judged if r["claimed"][0] <= r["truth"] <= r["claimed"][1])
    return {"median_gain_captured": _round(median),
            "claim_holds_truth": [holds, len(judged)], "median_gain_captured_interval": [_round(low), _round(high)],
            "near_optimal_rate": round(sum(r["near"] for r in rows) / len(rows), 3),
            "p10_gain_captured": _round(p10),
            "p_slower": round(sum(1 for r in rows if r["truth"] < 1.0) / len(rows), 3),
            "normalised_vs_random": None if g_random is None else _round(qm.normalised(median, g_random)),
            "gain_at": {f"{t:.0f}": _round(x) for t, x in zip(qm.ANYTIME_S, at, strict=True)}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--record", action="store_true", help="measure the grid, paired, and write --grid")
    parser.add_argument("--workload", default="cnn", help="with --record (default: cnn)")
    parser.add_argument("--grid", default=str(GRIDS / "cnn-paired.json"), help="the recorded grid's file")
    parser.add_argument("--pairs", type=int, default=16, help="with --record: pairs of windows per combination")
    parser.add_argument("--most-pairs", type=int, default=24,
                        help="with --record: at most this many pairs, however many the calibration asks for")
    parser.add_argument("--window-s", type=float, default=None,
                        help="with --record: each window's seconds (default: from the defaults' step time, as live)")
    parser.add_argument("--process-pairs", type=int, default=8,
                        help="with --record: process pairs per environment (the replay's search draws on as many "
                             "as a live first round runs, its confirmation rounds each on one of the rest)")
    parser.add_argument("--workers", type=int, default=2,
                        help="with --record: workers (visits) per environment, the pairs split between them")
    parser.add_argument("--seed", type=int, default=0, help="with --record: the order of the visits")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--warmup-steps", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--searched", default=",".join(SEARCHED),
                        help=f"with --record: the knobs of the grid, of {', '.join(AXES)} (num_workers also sets "
                             "persistent_workers and prefetch_factor)")
    parser.add_argument("--budget", type=float, default=None,
                        help="replay: the search's budget in seconds, on a clock that charges what the grid recorded")
    parser.add_argument("--fraction", type=float, default=0.15, help="search trials as a fraction of the grid")
    parser.add_argument("--confirm", type=int, default=3, help="confirmation candidates (autotune search --confirm)")
    parser.add_argument("--confirm-rounds", type=int, default=3,
                        help="the confirmation's rounds (autotune search --confirm-rounds, default 3)")
    parser.add_argument("--max-loss-increase", type=float, default=0.05)
    parser.add_argument("--verified", default=None,
                        help="replay: the held-out truth (verify_grid.py's file; default: NAME-verified.jsonl beside "
                             "the grid, where it exists)")
    parser.add_argument("--provisional", action="store_true",
                        help="replay: score against cells re-measured but not verified yet (one session), said so")
    parser.add_argument("--frozen-clock", action="store_true",
                        help="count the recorded time alone, not the replay's own: the same result every run (to "
                             "compare two versions); by default the search's own time counts, as live, and a result "
                             "moves a little with the machine's load")
    parser.add_argument("--baselines", action="store_true",
                        help="replay: random search, TPE at its defaults, one factor at a time, the seed list alone "
                             "and the grid in random order too, under the same measurer, clock and confirmation")
    args = parser.parse_args(argv)
    from autotune.errors import UsageError

    try:
        return record(args) if args.record else replay(args)
    except UsageError as e:  # an option the search refuses (--confirm -1, --confirm-rounds 0): its line, no traceback
        parser.error(str(e))


if __name__ == "__main__":
    sys.exit(main())
