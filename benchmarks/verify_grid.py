"""Held-out truth for a recorded grid (issue 58, item 1, the verify stage): the cells that decide a search's score,
re-measured as the claim about your runs measures them, in sessions that the replay never sees.

A grid (``search_quality.py --record``) is the screen: the replay draws from it. Its own reading of a cell cannot
score a search that chose from the same pairs, and its best is the largest of 24-48 noisy readings. This stage
re-measures, in fresh process pairs started as ``autotune run`` starts your training (``trial.runner.run_trial``:
the recipe's environment, ``apply()`` inside, one model, each process alone, the two in an order drawn per pair):

- every feasible cell whose upper bound reaches the grid's best's lower bound (the cells that may be the best);
- the defaults against themselves (an A/A: the verification's own check);
- the run_cpu-style heuristic as itself (it sets knobs the grid holds fixed);
- every recipe a replay returned or its claim tested (``--returned``: files whose last line is
  ``search_quality.py``'s JSON).

Each session (``--session``, a name; the default is the date and hour) measures ``--pairs`` pairs of every cell,
one pair a cell a round, the cells in a shuffled order each round, so a VM's minutes-long speed states fall on
all alike. Resumable: one JSON line a pair, appended to ``--out``; a session's pairs already there are not run
again. A cell is ``verified`` with at least 16 pairs from at least 2 sessions begun at least an hour apart; its
truth T is the geometric mean of its pairs' ratios with the Student-t interval over pairs (``measure.runs.Runs``),
and the sessions' own means are shown beside it.

    python benchmarks/verify_grid.py --grid benchmarks/grids/cnn-paired-zen4.json --returned /tmp/replay.json
    python benchmarks/verify_grid.py --grid benchmarks/grids/cnn-paired-zen4.json --summary

A grid is verified only on the machine that recorded it (the fingerprint in its facts): another CPU records a grid
of its own. ``search_quality.py`` scores against the verified truth where the file beside the grid holds it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LEAST_PAIRS = 16  # a verified cell's pairs, over all its sessions
LEAST_SESSIONS = 2  # each with at least LEAST_PAIRS / LEAST_SESSIONS of them
SESSIONS_APART_S = 3600.0  # the first pairs of the earliest and the latest session at least this far apart
OVER_SESSIONS = 3  # sessions (3 pairs or more each) whose means make T where the sessions disagree
LABELS = ("cell", "defaults", "heuristic")  # "defaults": the A/A; "heuristic": off the grid, as itself


def verified_path(grid_path: str | Path) -> Path:
    """Where a grid's verification lives: beside it, ``NAME-verified.jsonl``."""
    path = Path(grid_path)
    return path.with_name(f"{path.stem}-verified.jsonl")


def grid_id(grid: Any) -> str:
    """Which recording a verification row belongs to: a grid recorded again at the same path is another grid."""
    return f"{grid.workload}@{grid.recorded.get('date')}"


@dataclass(frozen=True)
class Cell:
    """One recipe to verify: ``label`` (``LABELS``), its grid key, and the knobs it sets beyond the defaults."""

    label: str
    key: tuple[Any, ...]
    changes: dict[str, Any]

    @property
    def name(self) -> str:
        return json.dumps([self.label, list(self.key), self.changes], default=str, sort_keys=True)


def _logs(ratios: Sequence[float]) -> tuple[float, float, int]:
    logs = [math.log(r) for r in ratios]
    return statistics.fmean(logs), statistics.variance(logs) if len(logs) > 1 else math.inf, len(logs)


@dataclass(frozen=True)
class Verified:
    """A cell's pairs, per session (``session -> (first pair's unix time, ratios)``), and its failed pairs."""

    cell: Cell
    sessions: dict[str, tuple[float, list[float]]]
    failed: dict[str, int]  # session -> pairs that gave no ratio
    pairs: list[tuple[float, float, float]]  # every pair's (ratio, wall seconds, timed seconds of a process)

    @property
    def ratios(self) -> list[float]:
        return [r for _, ratios in self.sessions.values() for r in ratios]

    def truth(self) -> tuple[float, float, float]:
        """T with its 95% interval (the log-scale Student t): over the pairs, or over the sessions' means where
        they disagree (``over_sessions``); (T, 0, inf) from fewer than 3 pairs, NaN from none."""
        from autotune.measure.runs import LEAST_PAIRS as FEWEST
        from autotune.measure.runs import Runs
        from autotune.measure.stats import t_quantile

        if not self.ratios:
            return math.nan, 0.0, math.inf
        if len(self.ratios) < FEWEST:
            return math.exp(_logs(self.ratios)[0]), 0.0, math.inf
        if self.over_sessions():
            logs = [m for m, _, _ in self.session_stats()]
            mean = statistics.fmean(logs)
            half = t_quantile(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
            return math.exp(mean), math.exp(mean - half), math.exp(mean + half)
        iv = Runs(tuple(self.ratios), run_s=0.0).mean()
        return iv.median, iv.low, iv.high

    def session_means(self) -> dict[str, float]:
        return {s: math.exp(_logs(ratios)[0]) for s, (_, ratios) in self.sessions.items()}

    def session_stats(self) -> list[tuple[float, float, int]]:
        """Each session's log mean, log variance and pairs, of the sessions with 3 pairs or more (those a rule
        between sessions reads)."""
        return [_logs(ratios) for _, ratios in self.sessions.values() if len(ratios) >= 3]

    def sessions_disagree(self) -> bool:
        """Whether two sessions' means differ beyond what their own pairs' spread allows (Welch's t, at 95% for
        all the pairs of sessions together: Bonferroni's): the pairs of one session share a machine state, and
        pooled over a disagreement their interval is too narrow. Each pair of sessions tested at 95% would find
        a disagreement in about half of the cells of six sessions that agree."""
        from autotune.measure.stats import t_quantile

        means = self.session_stats()
        tests = len(means) * (len(means) - 1) // 2
        for i, (m1, v1, n1) in enumerate(means):
            for m2, v2, n2 in means[i + 1:]:
                if abs(m1 - m2) > t_quantile(1 - 0.025 / tests, min(n1, n2) - 1) * math.sqrt(v1 / n1 + v2 / n2):
                    return True
        return False

    def over_sessions(self) -> bool:
        """Whether T is the mean of the sessions' means, its interval theirs: where they disagree, over
        ``OVER_SESSIONS`` of them or more (the session term of log ratio = cell + session + process + error: a
        machine state that lasts a session, which the pairs of few sessions cannot average out)."""
        return len(self.session_stats()) >= OVER_SESSIONS and self.sessions_disagree()

    def status(self) -> str:
        """``verified``: ``LEAST_PAIRS`` pairs, from ``LEAST_SESSIONS`` sessions of at least their share each, begun
        ``SESSIONS_APART_S`` apart, whose means agree, or whose means make T (``over_sessions``); ``sessions
        disagree`` where they would be but do not, from fewer sessions; ``failed`` where no pair gave a ratio; else
        ``partial``."""
        if not self.ratios:
            return "failed" if self.failed else "partial"
        each = LEAST_PAIRS // LEAST_SESSIONS
        starts = sorted(start for start, ratios in self.sessions.values() if len(ratios) >= each)
        apart = len(starts) >= LEAST_SESSIONS and starts[-1] - starts[0] >= SESSIONS_APART_S
        if len(self.ratios) < LEAST_PAIRS or not apart:
            return "partial"
        return "sessions disagree" if self.sessions_disagree() and not self.over_sessions() else "verified"


def read(path: str | Path, grid: str | None = None, fingerprint: str | None = None) -> dict[str, Verified]:
    """Every cell a verification file holds (``Cell.name`` -> ``Verified``), of the recording ``grid``
    (``grid_id``) and the machine ``fingerprint`` where given; a line that is neither a pair nor a failed pair
    (torn by a stop mid-write) is skipped."""
    cells: dict[str, Cell] = {}
    sessions: dict[str, dict[str, tuple[float, list[float]]]] = {}
    failed: dict[str, dict[str, int]] = {}
    pairs: dict[str, list[tuple[float, float, float]]] = {}
    p = Path(path)
    for line in (p.read_text().splitlines() if p.exists() else []):
        try:
            row = json.loads(line)
            cell, session = Cell(row["label"], tuple(row["key"]), row["changes"]), str(row["session"])
            if (grid and row.get("grid") != grid) or (fingerprint and row.get("fingerprint") != fingerprint):
                continue
            if row.get("failed"):
                cells.setdefault(cell.name, cell)
                failed.setdefault(cell.name, {}).setdefault(session, 0)
                failed[cell.name][session] += 1
                continue
            ratio, when, wall = float(row["ratio"]), float(row["unix"]), float(row.get("wall_s", 0.0))
            timed = float(row.get("run_s", wall / 2))
        except (ValueError, KeyError, TypeError):
            continue
        if not ratio > 0:
            continue
        cells.setdefault(cell.name, cell)
        pairs.setdefault(cell.name, []).append((ratio, wall, timed))
        first, ratios = sessions.setdefault(cell.name, {}).get(session, (when, []))
        sessions[cell.name][session] = (min(first, when), [*ratios, ratio])
    return {name: Verified(cells[name], sessions.get(name, {}), failed.get(name, {}), pairs.get(name, []))
            for name in cells}


def truth_of(verified: dict[str, Verified]) -> dict[tuple[Any, ...], tuple[float, float, float, str, int]]:
    """The grid cells' truths (label ``cell``; the defaults' is 1 by definition): key -> (T, low, high, status,
    failed pairs); a cell whose every pair failed reads T = NaN, status ``failed``."""
    return {v.cell.key: (*v.truth(), v.status(), sum(v.failed.values()))
            for v in verified.values() if v.cell.label == "cell"}


def pairs_of(verified: dict[str, Verified]) -> dict[tuple[Any, ...], list[tuple[float, float, float]]]:
    """Each re-measured grid cell's pairs (label ``cell``, as ``read`` gives them): a replay's claim about your runs
    draws from them (``search_quality.WithYourRuns``)."""
    return {v.cell.key: v.pairs for v in verified.values() if v.cell.label == "cell" and v.pairs}


def returned_recipes(files: Iterable[str | Path]) -> list[dict[str, Any]]:
    """The recipes every strategy's replay seeds returned, and those their claims tested (``tested``: a replayed
    claim draws your runs from the verification's pairs), from ``search_quality.py``'s last JSON line."""
    out: list[dict[str, Any]] = []
    for f in files:
        lines = [line for line in Path(f).read_text().splitlines() if line.startswith("{")]
        if not lines:
            raise SystemExit(f"--returned {f}: no JSON line (search_quality.py's output)")
        summary = json.loads(lines[-1])
        for recipes in [*summary.get("returned", {}).values(), *summary.get("tested", {}).values()]:
            out += [r for r in recipes if r not in out]
    return out


def choose(grid: Any, scores: dict[tuple[Any, ...], float], interval: Any, heuristic: dict[str, Any] | None,
           returned: Sequence[dict[str, Any]]) -> list[Cell]:
    """The cells to verify: the defaults (A/A), every feasible cell whose upper bound reaches the best's lower bound,
    the heuristic (``heuristic``: the knobs it changes, None: none) and every returned recipe, each once."""
    best = max(scores, key=lambda k: scores[k])
    floor = interval(best)[0]
    home = grid.key(grid.defaults)
    contenders = sorted((k for k in scores if k != home and interval(k)[1] >= floor), key=lambda k: -scores[k])
    keys = [*contenders, *(grid.key({**grid.defaults, **r}) for r in returned)]
    cells = [Cell("defaults", home, {})]
    if heuristic:
        cells.append(Cell("heuristic", grid.key({**grid.defaults, **heuristic}), heuristic))
    for key in dict.fromkeys(keys):
        if key != home:
            cells.append(Cell("cell", key, dict(zip(grid.searched, key, strict=True))))
    return cells


def _to_run(cells: list[Cell], done: dict[str, Verified], session: str, pairs: int,
            unsettled_only: bool = False) -> dict[str, int]:
    """Each cell's pairs still to run in ``session`` (a failed pair counts as run: ``read`` keeps its count);
    ``unsettled_only``: none for a cell already verified (its truth is settled; a new returned recipe's is not, nor
    one whose sessions disagree: more sessions narrow its interval over their means)."""
    had = {name: len(v.sessions.get(session, (0.0, []))[1]) + v.failed.get(session, 0) for name, v in done.items()}
    settled = {name for name, v in done.items() if v.status() == "verified" and not v.over_sessions()} \
        if unsettled_only else set()
    return {c.name: pairs - had.get(c.name, 0) for c in cells if pairs > had.get(c.name, 0) and c.name not in settled}


def append_line(path: Path, row: dict[str, Any]) -> None:
    """``row`` as one JSON line at the end of ``path``, after a newline where a stop tore the last line (written
    onto it, the row would be lost with it)."""
    torn = path.exists() and path.stat().st_size > 0 and not path.read_bytes().endswith(b"\n")
    with path.open("a") as f:
        f.write(("\n" if torn else "") + json.dumps(row, default=str) + "\n")


def _pair(workload: str, defaults: dict[str, Any], params: dict[str, Any], facts: Any, seed: int,
          timeout_s: float) -> tuple[Any, dict[str, Any]]:
    """One pair of fresh processes, each alone, as the claim about your runs measures (``measure.runs.sequential``
    over ``trial.runner.run_trial`` at the search's settings): the pair, or why it failed; and each side's run."""
    from autotune.measure.runs import PairFailed, sequential
    from autotune.trial import TrialSettings
    from autotune.trial.runner import run_trial
    from autotune.trial.spec import Status

    runs: dict[str, Any] = {}

    def alone(side: str) -> tuple[float, float]:
        run = run_trial(workload, defaults if side == "base" else params, facts, TrialSettings(), timeout_s=timeout_s)
        runs[side] = run
        if run.status != Status.OK or not run.samples_per_s:
            raise PairFailed(f"{side}: {run.status}: {run.error}")
        return run.samples_per_s, run.timed_s or 0.0
    try:
        return sequential(seed, alone), runs
    except PairFailed as e:
        return str(e), runs


def measure(args: argparse.Namespace) -> int:
    import search_quality as sq

    from autotune import probes
    from autotune import search_spaces as spaces
    from autotune.testing.grid import RENAMED, RecordedGrid
    from autotune.trial import TrialSettings

    grid = RecordedGrid.load(args.grid)
    facts = probes.probe()
    recorded = probes.Facts.from_dict(grid.facts).fingerprint if grid.facts else None
    if recorded != facts.fingerprint and not args.any_machine:
        raise SystemExit(f"{args.grid} was recorded on {recorded or 'an unrecorded machine'}, this machine is "
                         f"{facts.fingerprint}: record a grid of this machine's own (search_quality.py --record)")
    settings = TrialSettings()  # as the search's claim about your runs measures (its user pairs)
    _, ctx, _, today = sq._setup(grid.workload, settings)
    # the knobs the grid held fixed, as it held them (a knob added since: at today's default), on both sides
    defaults = {**today, **{RENAMED.get(k, k): v for k, v in grid.defaults.items() if RENAMED.get(k, k) in today}}
    scores = grid.scores(args.max_loss_increase)
    heuristic = {k: v for k, v in spaces.heuristic(facts, ctx).items() if defaults.get(k) != v}
    cells = choose(grid, scores, lambda k: sq._interval(grid, k), heuristic, returned_recipes(args.returned))
    out = Path(args.out or verified_path(args.grid))
    todo = _to_run(cells, read(out, grid_id(grid), facts.fingerprint), args.session, args.pairs, args.unsettled_only)
    by_name = {c.name: c for c in cells}
    per_pair = grid.recorded.get("process_pair_s") or 20.0
    print(f"{len(cells)} cells, session {args.session}: {sum(todo.values())} pairs to run (about "
          f"{sum(todo.values()) * per_pair / 60:.0f} minutes), to {out}", flush=True)
    rng = random.Random(f"{args.session}:{len(todo)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    while todo:
        for name in rng.sample(sorted(todo), len(todo)):
            cell = by_name[name]
            params = {**defaults, **{RENAMED.get(k, k): v for k, v in cell.changes.items()}}
            seed = rng.randrange(2**31)
            row: dict[str, Any] = {"label": cell.label, "key": list(cell.key), "changes": cell.changes,
                                   "session": args.session, "grid": grid_id(grid)}
            pair, runs = _pair(grid.workload, defaults, params, facts, seed, args.timeout)
            if isinstance(pair, str):  # recorded, and not a pair: a cell that always fails still ends its session
                row.update(ratio=None, failed=pair)
            else:
                row.update(ratio=pair.ratio, cand_sps=pair.samples_per_s, base_sps=pair.baseline_samples_per_s,
                           cand_loss=runs["cand"].loss, base_loss=runs["base"].loss, wall_s=round(pair.wall_s, 1),
                           run_s=round(pair.run_s, 2))
            row.update(load=round(os.getloadavg()[0], 2), fingerprint=facts.fingerprint, unix=time.time(),
                       when=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            append_line(out, row)
            todo[name] -= 1
            shown = f"{row['ratio']:.3f} ({row['wall_s']:.0f} s" if row["ratio"] else f"failed ({row['failed']}"
            print(f"  {cell.label} {cell.changes}: {shown}, load {row['load']})", flush=True)
            todo = {n: left for n, left in todo.items() if left > 0}
    return summary(args)


def _finite(x: float) -> float | None:
    return round(x, 4) if math.isfinite(x) else None


def summary(args: argparse.Namespace) -> int:
    from autotune import probes
    from autotune.testing.grid import RecordedGrid

    grid = RecordedGrid.load(args.grid)
    scores = grid.scores(args.max_loss_increase)
    out = Path(args.out or verified_path(args.grid))
    machine = probes.Facts.from_dict(grid.facts).fingerprint if grid.facts and not args.any_machine else None
    verified = read(out, grid_id(grid), machine)
    if not verified:
        print(f"{out}: nothing verified yet of {grid_id(grid)}" + (f" on {machine}" if machine else ""))
        return 1
    rows = []
    print(f"{'label':9s} {'screen':>7s} {'T':>7s} {'95% interval':>15s} {'pairs':>5s}  sessions (their means)  status")
    for v in sorted(verified.values(), key=lambda v: -v.truth()[0] if v.ratios else 0.0):
        t, low, high = v.truth()
        screen = scores.get(v.cell.key) if v.cell.label == "cell" else 1.0 if v.cell.label == "defaults" else None
        means = ", ".join(f"{s} {m:.3f}" for s, m in v.session_means().items())
        means += "".join(f", {s}: {n} failed" for s, n in v.failed.items())
        read_before = "-" if screen is None else f"{screen:.3f}"
        over = f" over {len(v.session_stats())} sessions' means" if v.over_sessions() else ""
        print(f"{v.cell.label:9s} {read_before:>7s} {t:7.3f} [{low:6.3f}-{high:6.3f}] {len(v.ratios):5d}  "
              f"{means}  {v.status()}{over}: {v.cell.changes}")
        rows.append({"label": v.cell.label, "changes": v.cell.changes, "screen": screen, "truth": _finite(t),
                     "interval": [_finite(low), _finite(high)], "pairs": len(v.ratios),
                     "failed": sum(v.failed.values()), "over_sessions": v.over_sessions(),
                     "sessions": {s: round(m, 4) for s, m in v.session_means().items()}, "status": v.status()})
    cells = [r for r in rows if r["label"] == "cell" and r["status"] == "verified"]
    best = max(cells, key=lambda r: r["truth"]) if cells else None
    aa = next((r for r in rows if r["label"] == "defaults"), None)
    if aa is not None and aa["interval"][1] is not None:  # the verification's own check: the defaults against
        aa["covers_1"] = aa["interval"][0] <= 1.0 <= aa["interval"][1]  # themselves
        print(f"A/A (the defaults against themselves): {aa['truth']:.3f} [{aa['interval'][0]:.3f}-"
              f"{aa['interval'][1]:.3f}] over {aa['pairs']} pairs: {'covers' if aa['covers_1'] else 'MISSES'} 1")
    said = "none yet" if best is None else f"{best['truth']:.3f}x {best['changes']}"
    print(f"verified: {len(cells)} of {sum(1 for r in rows if r['label'] == 'cell')} cells (16 pairs, 2 sessions "
          f"an hour apart, their means agreeing or 3 sessions' means making T); the best verified: {said}")
    print(json.dumps({"benchmark": "verify_grid", "grid": str(args.grid), "recording": grid_id(grid),
                      "verification": str(out), "verified_best": best, "aa": aa, "cells": rows}, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--grid", required=True, help="the recorded grid (the screen)")
    parser.add_argument("--out", default=None, help="JSON lines, appended (default: NAME-verified.jsonl beside it)")
    parser.add_argument("--session", default=time.strftime("%Y-%m-%dT%H", time.gmtime()),
                        help="this session's name (default: the UTC date and hour)")
    parser.add_argument("--pairs", type=int, default=8, help="process pairs of every cell in this session")
    parser.add_argument("--returned", nargs="*", default=[],
                        help="search_quality.py outputs whose returned recipes are verified too")
    parser.add_argument("--unsettled-only", action="store_true",
                        help="run no pair of a cell already verified (say, when only new returned recipes need truth)")
    parser.add_argument("--timeout", type=float, default=300.0, help="one process's time limit, seconds")
    parser.add_argument("--max-loss-increase", type=float, default=0.05)
    parser.add_argument("--any-machine", action="store_true", help="verify on a machine other than the grid's")
    parser.add_argument("--summary", action="store_true", help="judge what --out holds; run nothing")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    return summary(args) if args.summary else measure(args)


if __name__ == "__main__":
    sys.exit(main())
