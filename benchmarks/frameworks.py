"""Script mode through the framework integrations, beside the hand-written loop: for each script, a script-mode search
(``autotune search --budget B -- python SCRIPT``, with ``--batch-size 64`` for the hand-written loop, whose batch no
callback tells) in a folder of its own, then the user's path: the script plain and under ``autotune run --recipe
best.env``, ``--pairs`` fresh-process pairs in an order drawn per pair. Resumable: each finished run is one JSON line
appended to ``--out`` (with the load average before and after, and the commit); a run already there is not run again.

    python benchmarks/frameworks.py --runs 1 --budget 3m          # about 5 minutes a script on 2 vCPUs
    python benchmarks/frameworks.py --summary                     # what the file holds

Per run: the search's wall time, the candidates measured (trials that ended OK with an interval, the baseline and the
confirmation left out), the share of the budget spent starting copies (the trials' ``startup_s`` over the budget), the
claim with its interval and its range for one run, and what the user's script got (the geometric mean of its pairs'
ratios, each pair's ratio; a recipe that keeps the defaults too: it must not be slower). The last line printed is one
JSON object, per script.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from claims import _cli, _commit, read_rows, user_pairs  # noqa: E402 - a benchmark beside this one

# script -> (its file, the --batch-size it needs: None where its integration's callback tells its batch)
SCRIPTS = {"hand-written": (ROOT / "examples" / "train_cnn.py", 64),
           "transformers": (ROOT / "examples" / "train_hf.py", None),
           "lightning": (ROOT / "examples" / "train_lightning.py", None)}
OUT = ROOT / "benchmarks" / "results" / "frameworks.jsonl"


def searched(events: list[dict[str, Any]], budget_s: float) -> dict[str, Any]:
    """From a search's ``--json`` lines: the candidates measured and the share of the budget starting copies."""
    finished = [e for e in events if e.get("event") == "trial_finished"]
    candidates = [e for e in finished if e["role"] not in ("baseline", "confirm") and e["result"]["status"] == "ok"
                  and e["result"].get("speedup_low") is not None]
    startup = sum(e["result"].get("startup_s") or 0.0 for e in finished)
    return {"trials": len(finished), "candidates_measured": len(candidates),
            "startup_share": startup / budget_s if budget_s else None}


def one_run(name: str, index: int, budget: str, pairs: int, seconds: float) -> dict[str, Any]:
    script, batch = SCRIPTS[name]
    with tempfile.TemporaryDirectory(prefix=f"frameworks-{name}-{index}-") as folder:
        here = Path(folder)
        row: dict[str, Any] = {"script": name, "run": index, "budget": budget, "commit": _commit(),
                               "load": os.getloadavg()}
        started = time.monotonic()
        told = ["--batch-size", str(batch)] if batch else []
        search = subprocess.run([_cli(), "search", "--budget", budget, *told, "--seed", str(index), "--json", "--",
                                 sys.executable, str(script)],
                                capture_output=True, text=True, cwd=here, check=False)
        row["search_s"] = time.monotonic() - started
        if search.returncode != 0:
            return {**row, "error": search.stderr.strip()[-400:]}
        events = [json.loads(line) for line in search.stdout.splitlines() if line.startswith("{")]
        budget_s = next((e["budget_s"] for e in events if e.get("event") == "search_started"), None) or 0.0
        row.update(searched(events, budget_s))
        subprocess.run([_cli(), "export", "--format", "env", "-o", "best.env"], cwd=here, check=True,
                       capture_output=True)
        best = json.loads(subprocess.run([_cli(), "best", "--json"], cwd=here, check=True, capture_output=True,
                                         text=True).stdout)
        recipe = best.get("recipe", best)
        row.update({k: recipe.get(k) for k in ("claim", "speedup", "speedup_low", "speedup_high", "run_low",
                                              "run_high", "process_pairs", "params")})
        ratios = user_pairs(script, pairs, seconds, here, f"{name}{index}")
        return {**row, "ratios": ratios, "seconds": seconds, "load_after": os.getloadavg()}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in sorted({r["script"] for r in rows}):
        mine = [r for r in rows if r["script"] == name and "error" not in r]
        got = [math.exp(statistics.fmean(math.log(x) for x in r["ratios"])) for r in mine if r.get("ratios")]
        claimed = [(r, g) for r, g in zip([r for r in mine if r.get("ratios")], got, strict=True)
                   if r.get("speedup_low") is not None]
        out[name] = {"runs": len(mine), "errors": sum(r["script"] == name and "error" in r for r in rows),
                     "candidates_measured": [r.get("candidates_measured") for r in mine],
                     "startup_share": [round(r["startup_share"], 3) for r in mine
                                       if r.get("startup_share") is not None],
                     "claims": [(r.get("speedup"), r.get("speedup_low"), r.get("speedup_high")) for r in mine],
                     "user_got": [round(g, 3) for g in got],
                     "inside_claim": sum(r["speedup_low"] <= g <= r["speedup_high"] for r, g in claimed),
                     "claimed": len(claimed)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1, help="runs per script (default 1)")
    parser.add_argument("--budget", default="3m", help="each search's budget (default 3m)")
    parser.add_argument("--pairs", type=int, default=8, help="the user's fresh-process pairs per run (default 8)")
    parser.add_argument("--seconds", type=float, default=8.0, help="timed training per user process (default 8)")
    parser.add_argument("--scripts", nargs="+", default=list(SCRIPTS), choices=list(SCRIPTS))
    parser.add_argument("--out", type=Path, default=OUT, help=f"JSON lines, appended (default {OUT})")
    parser.add_argument("--summary", action="store_true", help="print what --out holds; run nothing")
    args = parser.parse_args(argv)
    rows = read_rows(args.out)
    if not args.summary:
        done = {(r["script"], r["run"]) for r in rows}
        todo = [(s, i) for i in range(args.runs) for s in args.scripts if (s, i) not in done]
        print(f"frameworks: {len(done)} run(s) in {args.out}, {len(todo)} to go; load average "
              f"{os.getloadavg()[0]:.2f}", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        for name, index in todo:
            row = one_run(name, index, args.budget, args.pairs, args.seconds)
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            rows.append(row)
            print(f"{name} run {index}: {row.get('search_s', 0):.0f} s, {row.get('candidates_measured')} candidates, "
                  f"start-up {row.get('startup_share') or 0:.0%} of the budget, claim {row.get('claim')} "
                  f"{row.get('speedup')} [{row.get('speedup_low')}-{row.get('speedup_high')}], user "
                  + (f"{math.exp(statistics.fmean(math.log(x) for x in row['ratios'])):.3f}" if row.get("ratios")
                     else "-") + (f" error: {row['error']}" if "error" in row else ""), flush=True)
    print(json.dumps({"benchmark": "frameworks", "scripts": summary(rows)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
