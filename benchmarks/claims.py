"""Does the stated claim cover what the user's own script gets? Independent searches of the bundled CNN and
transformer (a fresh study each, in a folder of its own), each followed by the user's script
(``examples/train_cnn.py``, ``examples/train_transformer.py``) plain and under ``autotune run --recipe`` in fresh
processes (``--workloads recurrent input_bound``: ``benchmarks/workloads.py``'s, with ``train_recurrent.py`` and
``train_augmented.py``), ``--pairs`` pairs in an order drawn per pair. Resumable: each finished run is one JSON
line appended to ``--out``; a run already there is not run again, so the campaign can go on across sessions.

    python benchmarks/claims.py --runs 12 --budget 5m               # hours on 2 vCPUs
    python benchmarks/claims.py --summary                           # what the file holds so far
    python benchmarks/claims.py --keep runs/                        # each search's events and study kept too

Per workload it prints how often the user's mean (the geometric mean of the pairs' ratios) fell inside the stated
interval and how often one pair fell inside the stated range of one run, each with its Clopper-Pearson 95%
interval; runs that kept the defaults are counted apart. The last line is one JSON object: per workload ``runs``,
``offered``, ``mean_inside``, ``mean_consistent`` (the user's mean inside the range a mean of that many runs has
about a right claim: ``mean_range``), ``pairs_inside_prediction``, ``user_below_stated_low``,
``user_above_stated_high`` (a skewed spread misses on one side: docs/measurement.md) and
``median_interval_width_ratio`` (the stated interval's log width over the width a 95% t interval would have with
the claim's own number of process pairs and the spread of the user's pairs).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# each workload's search spec and the script a user would write for it
EXAMPLES, SPECS = ROOT / "examples", ROOT / "benchmarks" / "workloads.py"
WORKLOADS = {"cnn": ("cnn", EXAMPLES / "train_cnn.py"),
             "transformer": ("transformer", EXAMPLES / "train_transformer.py"),
             "recurrent": (f"{SPECS}:recurrent", EXAMPLES / "train_recurrent.py"),
             "input_bound": (f"{SPECS}:input_bound", EXAMPLES / "train_augmented.py")}
OUT = ROOT / "benchmarks" / "results" / "claims.jsonl"


def _cli() -> str:
    return shutil.which("autotune") or str(Path(sys.executable).with_name("autotune"))


def _commit() -> str | None:
    """The code a run measured (a campaign spans sessions and commits)."""
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False)
    return done.stdout.strip() or None


def _script_run(command: list[str], seconds: float, cwd: Path) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOTUNE_RECIPE")}
    env["TRAIN_S"] = str(seconds)
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return float(json.loads(lines[-1])["samples_per_s"])


def read_rows(path: Path) -> list[dict[str, Any]]:
    """A campaign's JSON lines so far (none before its first run)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def user_pairs(script: Path, pairs: int, seconds: float, cwd: Path, seed: str,
               rates: list[tuple[float, float]] | None = None) -> list[float]:
    """The user's path: ``script`` plain and under ``autotune run --recipe best.env`` (the file in ``cwd``),
    ``pairs`` fresh-process pairs in an order drawn per pair; each pair's ratio, tuned over plain. ``rates``: each
    pair's samples/s (plain, tuned) appended there, to tell which side a miss came from."""
    plain = [sys.executable, str(script)]
    tuned = [_cli(), "run", "--recipe", "best.env", "--", *plain]
    rng, ratios = random.Random(seed), []
    for _ in range(pairs):
        order = ["plain", "tuned"] if rng.random() < 0.5 else ["tuned", "plain"]
        rate = {side: _script_run(plain if side == "plain" else tuned, seconds, cwd) for side in order}
        ratios.append(rate["tuned"] / rate["plain"])
        if rates is not None:
            rates.append((rate["plain"], rate["tuned"]))
    return ratios


def one_run(workload: str, index: int, budget: str, pairs: int, seconds: float,
            keep: Path | None = None) -> dict[str, Any]:
    """A fresh search of ``workload`` (seed ``index``) in a folder of its own, then the user's script both ways;
    ``keep``: a folder where the search's events and its study are kept (``WORKLOAD-INDEX/``), to trace a run."""
    with tempfile.TemporaryDirectory(prefix=f"claims-{workload}-{index}-") as folder:
        here = Path(folder)
        load = os.getloadavg()[0]
        started = time.monotonic()
        spec, script = WORKLOADS[workload]
        search = subprocess.run([_cli(), "search", "--workload", spec, "--budget", budget, "--seed", str(index),
                                 "--json"], capture_output=True, text=True, cwd=here, check=False)
        search_s = time.monotonic() - started
        if keep is not None:  # a failed search too: the run most worth tracing
            _keep(keep / f"{workload}-{index}", here, search)
        if search.returncode != 0:
            return {"workload": workload, "run": index, "error": search.stderr.strip()[-400:], "load": load}
        events = [json.loads(line) for line in search.stdout.splitlines() if line.startswith("{")]
        finished = [e for e in events if e.get("event") == "trial_finished"]
        subprocess.run([_cli(), "export", "--format", "env", "-o", "best.env"], cwd=here, check=True,
                       capture_output=True)
        best = json.loads(subprocess.run([_cli(), "best", "--json"], cwd=here, check=True, capture_output=True,
                                         text=True).stdout)
        recipe = best.get("recipe", best)
        row: dict[str, Any] = {"workload": workload, "run": index, "budget": budget, "search_s": search_s,
                               "commit": _commit(),
                               "load": load, "claim": recipe.get("claim"), "speedup": recipe.get("speedup"),
                               "low": recipe.get("speedup_low"), "high": recipe.get("speedup_high"),
                               "run_low": recipe.get("run_low"), "run_high": recipe.get("run_high"),
                               "process_pairs": recipe.get("process_pairs"), "params": recipe.get("params"),
                               "notes": recipe.get("notes"),
                               # what the search spent its time on: its trials (the baseline's, the calibration, in
                               # them), its confirmation rounds and the timed windows of all
                               "trials": sum(e["role"] != "confirm" for e in finished),
                               "rounds": sum(e["role"] == "confirm" for e in finished),
                               "timed_s": sum(e["result"].get("timed_s") or 0.0 for e in finished)}
        row.update(_user_runs(here / "studies.db"))
        if recipe.get("claim") in (None, "defaults"):
            return {**row, "ratios": []}
        rates: list[tuple[float, float]] = []
        ratios = user_pairs(script, pairs, seconds, here, f"{workload}{index}", rates)
        return {**row, "ratios": ratios, "user_rates": rates, "seconds": seconds, "load_after": os.getloadavg()[0]}


def _keep(kept: Path, here: Path, search: subprocess.CompletedProcess[str]) -> None:
    """A search's events, its stderr and its study (SQLite's backup: a copy of the file alone misses its write-ahead
    log) in ``kept``, replacing an earlier run's; a copy that fails is said and the campaign goes on."""
    try:
        kept.mkdir(parents=True, exist_ok=True)
        (kept / "events.jsonl").write_text(search.stdout)
        (kept / "stderr.log").write_text(search.stderr)
        if (here / "studies.db").is_file():
            (kept / "studies.db").unlink(missing_ok=True)
            with closing(sqlite3.connect(here / "studies.db")) as src, \
                    closing(sqlite3.connect(kept / "studies.db")) as dst:
                src.backup(dst)
    except (OSError, sqlite3.Error) as e:
        print(f"claims: the run was not kept in {kept}: {e}", file=sys.stderr, flush=True)


def _user_runs(db: Path) -> dict[str, Any]:
    """The claim's own process pairs and the search's environment process pairs whose spread it may borrow
    (``StudyAttr.USER_RUNS``): what the stated interval was drawn from, so it can be drawn again without them."""
    if not db.is_file():  # a search told to store elsewhere (``AUTOTUNE_STORAGE``)
        return {}
    with closing(sqlite3.connect(db)) as con:
        found = con.execute("select value_json from study_user_attributes where key = 'user_runs'").fetchone()
    told = json.loads(found[0]) if found else {}
    return {"claim_ratios": told.get("ratios"), "lent": told.get("lent")}


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact binomial interval of ``k`` successes in ``n`` (each bound by bisection on the binomial tail).

    >>> [round(x, 3) for x in clopper_pearson(20, 22)], [round(x, 3) for x in clopper_pearson(0, 10)]
    ([0.708, 0.989], [0.0, 0.308])
    """
    if n == 0:
        return 0.0, 1.0

    def at_most(j: int, p: float) -> float:
        return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(j + 1))

    def solve(rising: Any, target: float) -> float:  # the p where rising(p) == target, rising increasing in p
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if rising(mid) < target else (lo, mid)
        return (lo + hi) / 2

    alpha = 1 - confidence
    low = 0.0 if k == 0 else solve(lambda p: 1 - at_most(k - 1, p), alpha / 2)  # P(X >= k) = alpha / 2
    high = 1.0 if k == n else solve(lambda p: 1 - at_most(k, p), 1 - alpha / 2)  # P(X <= k) = alpha / 2
    return low, high


def by_runs(hits: list[tuple[int, int]], confidence: float = 0.95, draws: int = 4000) -> tuple[float, float]:
    """The share of single pairs inside their run's stated range, ``hits`` as (inside, pairs) per run, with an
    interval that resamples runs (a cluster bootstrap): a run's pairs share one stated range, so they are not
    independent draws and the binomial interval over all pairs is too narrow (about 1.6-2x where ranges vary from
    run to run); never narrower than that binomial interval (a bootstrap of few runs can be).

    >>> [round(x, 3) for x in by_runs([(10, 10), (10, 10), (6, 10), (10, 10), (9, 10)])]  # binomial: 0.78-0.97
    [0.74, 1.0]
    """
    low, high = clopper_pearson(sum(h for h, _ in hits), sum(n for _, n in hits), confidence)
    if len(hits) < 2:
        return low, high
    rng = random.Random(0)  # seeded: the summary of one file reads the same each time
    shares = sorted(sum(h for h, _ in s) / max(1, sum(n for _, n in s))
                    for s in (rng.choices(hits, k=len(hits)) for _ in range(draws)))
    tail = int(draws * (1 - confidence) / 2)
    return min(low, shares[tail]), max(high, shares[draws - 1 - tail])


def mean_range(speedup: float, low: float, high: float, claimed_pairs: int, user_pairs: int) -> tuple[float, float]:
    """Where the geometric mean of ``user_pairs`` runs of yours lies, at the claim's confidence, if the claim is
    right: its t interval (``low``-``high`` about ``speedup`` on the log scale, from ``claimed_pairs``) widened by
    ``sqrt(1 + n / m)``, the user's mean's own spread beside the claim's (``t s sqrt(1/n + 1/m)``). The stated
    interval is of the mean of all runs: a correct 95% interval from 6 pairs holds a 10-run mean only about 90% of
    the time (docs/measurement.md).

    >>> [round(x, 3) for x in mean_range(2.0, 1.8, 2.2222, 6, 10)]
    [1.75, 2.285]
    """
    half = math.log(high / low) / 2
    wider = half * math.sqrt(1 + claimed_pairs / user_pairs)
    return speedup * math.exp(-wider), speedup * math.exp(wider)


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    from autotune.measure import LEAST_CLAIM_PAIRS
    from autotune.measure.stats import log_mean_interval, t_quantile

    out: dict[str, Any] = {}
    for workload in sorted({r["workload"] for r in rows}):
        # a run marked disturbed had other work beside it (``disturbed`` says what): not scored, and run again
        mine = [r for r in rows if r["workload"] == workload and "error" not in r and not r.get("disturbed")]
        offered = [r for r in mine if r.get("ratios") and r.get("low") and r.get("high")]
        inside = consistent = below = above = pairs_in = pairs_all = own_inside = own_told = 0
        widths, offsets, hits = [], [], []
        for r in offered:
            logs = [math.log(x) for x in r["ratios"]]
            mean = math.exp(statistics.fmean(logs))
            inside += r["low"] <= mean <= r["high"]
            # a claim of fewer pairs states the search workers' interval, not one of its pairs (``study.claim``)
            lo, hi = (mean_range(r["speedup"], r["low"], r["high"], r["process_pairs"], len(logs))
                      if (r.get("process_pairs") or 0) >= LEAST_CLAIM_PAIRS and r.get("speedup")
                      else (r["low"], r["high"]))
            consistent += lo <= mean <= hi
            # the claim's own interval, nothing borrowed; only where the recipe was stated from those pairs (a test of
            # another candidate that did not confirm it leaves its pairs in the study, the offer stated otherwise)
            if (r.get("process_pairs") or 0) >= LEAST_CLAIM_PAIRS and len(r.get("claim_ratios") or ()) == \
                    r["process_pairs"]:
                own = log_mean_interval(r["claim_ratios"])
                own_told += 1
                own_inside += own.low <= mean <= own.high
            below += mean < r["low"]
            above += mean > r["high"]
            if r.get("run_low") is not None:
                hits.append((sum(r["run_low"] <= x <= r["run_high"] for x in r["ratios"]), len(r["ratios"])))
                pairs_in, pairs_all = pairs_in + hits[-1][0], pairs_all + hits[-1][1]
            n = r.get("process_pairs") or 0
            spread = statistics.stdev(logs) if len(logs) >= 2 else 0.0
            if n >= 2 and spread > 0:
                t = t_quantile(0.975, n - 1)
                widths.append(math.log(r["high"] / r["low"]) / (2 * t * spread / math.sqrt(n)))
                # the user's mean from the claim's centre in standard errors, the claim's (its interval at n - 1
                # degrees of freedom: a borrowed spread's are more, so this one is a little wide) and the mean's own
                if r.get("speedup"):
                    claimed = math.log(r["high"] / r["low"]) / 2 / t
                    offsets.append(math.log(mean / r["speedup"]) / math.hypot(claimed, spread / math.sqrt(len(logs))))
        out[workload] = {
            "runs": len(mine), "offered": len(offered), "mean_inside": inside,
            "mean_inside_ci": clopper_pearson(inside, len(offered)), "mean_consistent": consistent,
            "mean_consistent_ci": clopper_pearson(consistent, len(offered)), "pairs_inside_prediction": pairs_in,
            "pairs": pairs_all, "pairs_inside_ci": by_runs(hits),
            "user_below_stated_low": below, "user_above_stated_high": above, "mean_inside_own": own_inside,
            "own_told": own_told,
            "median_interval_width_ratio": statistics.median(widths) if widths else None,
            # a right claim: mean 0 and sd 1; a mean away from 0 is an offset the claim does not see
            "offset_z_mean": statistics.fmean(offsets) if offsets else None,
            "offset_z_sd": statistics.stdev(offsets) if len(offsets) >= 2 else None,
            "disturbed": sum(1 for r in rows if r["workload"] == workload and r.get("disturbed")),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=12, help="runs per workload (default 12)")
    parser.add_argument("--budget", default="5m", help="each search's budget (default 5m)")
    parser.add_argument("--pairs", type=int, default=10, help="the user's fresh-process pairs per run (default 10)")
    parser.add_argument("--seconds", type=float, default=8.0, help="timed training per user process (default 8)")
    parser.add_argument("--workloads", nargs="+", default=["cnn", "transformer"], choices=list(WORKLOADS),
                        help="the bundled CNN and transformer (default), the recurrent and input-bound workloads of "
                             "benchmarks/workloads.py with the scripts a user would write for them")
    parser.add_argument("--out", type=Path, default=OUT, help=f"JSON lines, appended (default {OUT})")
    parser.add_argument("--summary", action="store_true", help="print what --out holds; run nothing")
    parser.add_argument("--keep", type=Path, help="keep each search's events and study in KEEP/WORKLOAD-RUN/")
    args = parser.parse_args(argv)

    rows = read_rows(args.out)
    if not args.summary:
        done = {(r["workload"], r["run"]) for r in rows if not r.get("disturbed")}
        todo = [(w, i) for i in range(args.runs) for w in args.workloads if (w, i) not in done]
        print(f"claims: {len(done)} run(s) in {args.out}, {len(todo)} to go (each about a {args.budget} search and "
              f"{2 * args.pairs} script runs of {args.seconds:g} s); load average {os.getloadavg()[0]:.2f}",
              flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        for workload, index in todo:
            row = one_run(workload, index, args.budget, args.pairs, args.seconds, args.keep)
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            rows.append(row)
            mean = math.exp(statistics.fmean(math.log(x) for x in row["ratios"])) if row.get("ratios") else None
            print(f"{workload} run {index}: claim {row.get('claim')} {row.get('speedup')} "
                  f"[{row.get('low')}-{row.get('high')}], user " + (f"{mean:.3f}" if mean else "-")
                  + (f" error: {row['error']}" if "error" in row else ""), flush=True)
    result = summary(rows)
    for workload, s in result.items():
        lo, hi = s["mean_inside_ci"]
        plo, phi = s["pairs_inside_ci"]
        print(f"{workload}: {s['runs']} runs, {s['offered']} offered a recipe; the user's mean inside the stated "
              f"interval in {s['mean_inside']} [{lo:.2f}-{hi:.2f}] (inside the range a mean of that many runs has "
              f"about a right claim: {s['mean_consistent']}), below its low bound in "
              f"{s['user_below_stated_low']}, above its high in {s['user_above_stated_high']}; inside the claim's "
              f"own interval (nothing borrowed) in {s['mean_inside_own']} of {s['own_told']}; single pairs inside the "
              f"range of one run {s['pairs_inside_prediction']} of {s['pairs']} [{plo:.2f}-{phi:.2f}]; median width "
              f"ratio {s['median_interval_width_ratio']}; the user's mean from the claim's centre "
              + (f"{s['offset_z_mean']:+.2f} standard errors on average" if s["offset_z_mean"] is not None else "-")
              + (f" (sd {s['offset_z_sd']:.2f}; a right claim: 0, 1)" if s["offset_z_sd"] is not None else "")
              + (f"; {s['disturbed']} run(s) marked disturbed, not scored" if s["disturbed"] else ""))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
