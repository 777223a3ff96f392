"""Does a search keep the gain its confirmation found when the budget ends mid-round? (issue 55)

Runs short searches one after another, alternating an input-bound workload (``benchmarks/workloads.py:input_bound``,
workload mode) and the same kind of script (``examples/train_augmented.py``, script mode, ``--batch-size 64``), each
in a fresh folder with its own study, and records per search: every confirmation round's outcome (ok, cut by the
budget, a candidate's timeout, a failure) with when it ended against the search's deadline, and what the recipe
offers. Resumable: results are appended as JSON lines to ``--out``, and a run already there is not made again; the
load average is recorded with each.

    python benchmarks/budget_cuts.py --runs 6 --budget 3m --out benchmarks/results/budget_cuts.jsonl

It prints one line per search and, last, one JSON object: searches, rounds by outcome, ``timeouts_at_deadline``
(rounds recorded as a candidate's timeout that ended within 2 s of the deadline: the defect this guards, 0 is the
target), and ``gains_kept`` / ``gains_confirmed`` (searches whose confirmation confirmed a candidate above the bar in
two rounds or more, and of those, the ones whose recipe offers it).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KINDS = {
    "workload": ["--workload", str(REPO / "benchmarks" / "workloads.py") + ":input_bound"],
    "script": ["--batch-size", "64", "--", sys.executable, str(REPO / "examples" / "train_augmented.py")],
}


def _seconds(text: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1}
    total, number = 0.0, ""
    for char in text:
        if char.isdigit() or char == ".":
            number += char
        else:
            total, number = total + float(number) * units[char], ""
    return total + (float(number) if number else 0.0)


def one(kind: str, index: int, budget: str, folder: Path) -> dict[str, object]:
    """One search of ``kind`` in ``folder``: its rounds and its recipe."""
    import optuna

    from autotune.study.records import CONFIRM, Attr, records

    folder.mkdir(parents=True, exist_ok=True)
    storage, study = f"sqlite:///{folder / 'studies.db'}", f"cuts-{kind}-{index}"
    load = os.getloadavg()[0]
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "autotune", "search", "--budget", budget, "--json", "--storage",
                           storage, "--study", study, *KINDS[kind]], cwd=folder, capture_output=True, text=True)
    ended = time.time()
    deadline = started + _seconds(budget)
    result = next((json.loads(line) for line in reversed(done.stdout.splitlines())
                   if line.startswith("{") and '"event": "result"' in line), None)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = {t.number: t for t in optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)}
    rounds = []
    for r in records(optuna.load_study(study_name=study, storage=storage)):
        if r.role != CONFIRM:
            continue
        attrs = trials[r.number].user_attrs
        end = attrs.get(Attr.RUN_ENDED)
        rounds.append({"trial": r.number, "confirms": attrs.get(Attr.CONFIRMS), "round": r.round,
                       "status": str(r.result.status), "error": r.result.error,
                       "ended_before_deadline_s": None if end is None else round(deadline - end, 1),
                       "speedup": r.result.objective, "low": r.result.speedup_low, "high": r.result.speedup_high})
    recipe = (result or {}).get("recipe") or {}
    notes = recipe.get("notes") or []
    # a candidate confirmed over two rounds or more with its low bound above 1 (the bar is 1 + the margin: see notes)
    confirmed_two = [n for n in notes if re.search(r"confirmed at [\d.]+x \[([\d.]+)-[\d.]+\] over [2-9] rounds", n)
                     and float(re.search(r"confirmed at [\d.]+x \[([\d.]+)-", n).group(1)) > 1.0]
    return {"kind": kind, "index": index, "budget": budget, "exit": done.returncode, "load_start": load,
            "load_end": os.getloadavg()[0], "wall_s": round(ended - started, 1), "rounds": rounds,
            "speedup": recipe.get("speedup"), "low": recipe.get("speedup_low"), "high": recipe.get("speedup_high"),
            "offered": bool(recipe) and recipe.get("speedup") not in (None, 1.0), "notes": notes,
            "confirmed_notes": confirmed_two, "stderr_tail": done.stderr[-600:] if done.returncode else ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=6, help="searches in all, alternating the two kinds")
    parser.add_argument("--budget", default="3m")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "budget_cuts.jsonl")
    parser.add_argument("--folder", type=Path, default=Path("/tmp/autotune-budget-cuts"))
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    seen = [json.loads(line) for line in args.out.read_text().splitlines()] if args.out.exists() else []
    for index in range(args.runs):
        kind = ("workload", "script")[index % 2]
        if any(s["kind"] == kind and s["index"] == index and s["budget"] == args.budget for s in seen):
            continue
        row = one(kind, index, args.budget, args.folder / f"{kind}-{index}")
        with args.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        seen.append(row)
        statuses = ", ".join(f"r{r['round'] + 1} {r['status']}" for r in row["rounds"])
        print(f"{kind} {index}: load {row['load_start']:.2f}, {row['wall_s']} s; rounds: {statuses or 'none'}; "
              f"recipe {row['speedup']} [{row['low']}-{row['high']}]", flush=True)
    mine = [s for s in seen if s["budget"] == args.budget]
    rounds = [r for s in mine for r in s["rounds"]]
    by_status: dict[str, int] = {}
    for r in rounds:
        by_status[r["status"]] = by_status.get(r["status"], 0) + 1
    at_deadline = [r for r in rounds if r["status"] == "timeout" and (r["ended_before_deadline_s"] or 0) < 2]
    print(json.dumps({"searches": len(mine), "rounds": by_status, "timeouts_at_deadline": len(at_deadline),
                      "gains_confirmed": len([s for s in mine if s["confirmed_notes"]]),
                      "gains_kept": len([s for s in mine if s["confirmed_notes"] and s["offered"]])}))


if __name__ == "__main__":
    main()
