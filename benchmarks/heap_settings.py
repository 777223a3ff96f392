"""The allocator knob's heap settings on a user's plain script: each in fresh processes, in a shuffled order a round.

Runs ``--script`` (default: ``examples/train_cnn.py``, the bundled CNN as a user writes it, PyTorch's defaults) with
``TRAIN_S`` seconds of training under each setting: glibc's malloc as it comes, glibc's with the thresholds the
``allocator`` knob's ``glibc-kept`` fixes (``search_spaces.preload.HEAP_THRESHOLDS``), tcmalloc, jemalloc as the
``allocator`` knob sets it (``search_spaces.preload.JEMALLOC_CONF``), jemalloc with ``run_cpu``'s ``MALLOC_CONF``
(``JEMALLOC_CONF_BEFORE``: purging on) and jemalloc with no ``MALLOC_CONF``. One JSON line a process is appended to
``--out`` (its samples/s, its minor page faults a second of its life, the load average); a session's processes
already there are not run again. ``--summary`` prints, per setting, the median samples/s, its ratio to glibc's
median, and the median faults a second. With ``--recipe FILE`` (an env file or a recipe's JSON) every process
applies that recipe (``autotune.apply()``), its allocator set to the setting's: a recipe's other knobs change what
the heap does (bfloat16 autocast frees and takes back more buffers a step than float32). Only its in-process knobs
and the allocator take effect (no other variable, no pinning): give it a recipe whose other environment-level knobs
are the defaults' (GNU OpenMP, no affinity), or read its warnings.

    python benchmarks/heap_settings.py --rounds 3
    python benchmarks/heap_settings.py --summary
    python benchmarks/heap_settings.py --recipe best.env --rounds 3
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = ("glibc", "glibc-kept", "tcmalloc", "jemalloc", "jemalloc-run_cpu", "jemalloc-plain")


def environments(runtime: Any) -> dict[str, dict[str, str]]:
    """Each setting's variables on this machine (``probes.Facts.runtime``; a setting whose library the probe did not
    find is left out)."""
    from autotune.search_spaces import preload

    out: dict[str, dict[str, str]] = {"glibc": {}}
    if runtime is None:
        return out
    if runtime.glibc:
        out["glibc-kept"] = dict(preload.HEAP_THRESHOLDS)
    if runtime.tcmalloc_path:
        out["tcmalloc"] = {"LD_PRELOAD": runtime.tcmalloc_path}
    if runtime.jemalloc_path:
        je = {"LD_PRELOAD": runtime.jemalloc_path}
        out["jemalloc"] = {**je, "MALLOC_CONF": preload.JEMALLOC_CONF}
        out["jemalloc-run_cpu"] = {**je, "MALLOC_CONF": preload.JEMALLOC_CONF_BEFORE}
        out["jemalloc-plain"] = je
    return out


# the allocator knob's value each setting is
ALLOCATOR = {"glibc": "default", "glibc-kept": "glibc-kept", "tcmalloc": "tcmalloc"}


def with_recipe(envs: dict[str, dict[str, str]], path: str) -> dict[str, dict[str, str]]:
    """Each setting's variables with ``AUTOTUNE_RECIPE``: the recipe of ``path``, its allocator the setting's."""
    from autotune.recipe_file import load_recipe_file

    data = load_recipe_file(path).to_dict()
    return {name: {**env, "AUTOTUNE_RECIPE": json.dumps(
        {**data, "params": {**data["params"], "allocator": ALLOCATOR.get(name, "jemalloc")}})}
            for name, env in envs.items()}


def run_one(script: str, env: dict[str, str], train_s: float) -> dict[str, float]:
    """One fresh process of ``script`` with ``env`` added: its samples/s and minor faults a second of its life."""
    from autotune.search_spaces import preload

    # glibc as it comes: none of the caller's heap tuning (as a trial's defaults), jemalloc's conf or preloads
    dropped = ("LD_PRELOAD", "AUTOTUNE_RECIPE", "MALLOC_CONF")
    clean = {k: v for k, v in preload.without_heap_tuning(dict(os.environ)).items() if k not in dropped}
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt, time.monotonic()
    done = subprocess.run([sys.executable, script], env={**clean, **env, "TRAIN_S": str(train_s)}, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - started
    faults = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt - before
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{script} under {env}: exit {done.returncode}: {done.stderr.strip()[-300:]}")
    return {"samples_per_s": json.loads(lines[-1])["samples_per_s"], "faults_per_s": faults / wall, "wall_s": wall}


def read(out: Path, script: str, recipe: str | None) -> list[dict[str, Any]]:
    """The rows of ``out`` for ``script`` (with ``recipe``, or plain)."""
    from claims import read_rows

    return [row for row in read_rows(out) if row.get("script") == script and row.get("recipe") == recipe]


def summary(rows: list[dict[str, Any]]) -> int:
    by: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by.setdefault(row["setting"], []).append(row)
    base = statistics.median(r["samples_per_s"] for r in by["glibc"]) if "glibc" in by else None
    for name in [s for s in SETTINGS if s in by]:
        rates = [r["samples_per_s"] for r in by[name]]
        faults = statistics.median(r["faults_per_s"] for r in by[name])
        ratio = f"{statistics.median(rates) / base:.2f}x glibc's" if base else ""
        print(f"{name:17s} {len(rates):2d} processes  {min(rates):6.0f}-{max(rates):6.0f} samples/s, median "
              f"{statistics.median(rates):6.0f} {ratio:14s} {faults / 1000:6.0f} thousand faults/s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--script", default="examples/train_cnn.py")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--train-s", type=float, default=4.0)
    parser.add_argument("--session", default=time.strftime("%Y-%m-%d", time.gmtime()),
                        help="this run's name: its processes already in --out are not run again (default: the date)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "heap-settings.jsonl"))
    parser.add_argument("--summary", action="store_true", help="judge what --out holds; run nothing")
    parser.add_argument("--recipe", help="every process applies this recipe (an env file or a recipe's JSON), its "
                        "allocator the setting's")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from verify_grid import append_line

    out = Path(args.out)
    if args.summary:
        return summary(read(out, args.script, args.recipe))
    from autotune import probes

    facts = probes.probe()
    fingerprint, envs = facts.fingerprint, environments(facts.runtime)
    if args.recipe:
        envs = with_recipe(envs, args.recipe)
    done = {(r["session"], r["round"], r["setting"]) for r in read(out, args.script, args.recipe)}
    out.parent.mkdir(parents=True, exist_ok=True)
    for round_ in range(args.rounds):
        for name in random.Random(f"{args.session}:{round_}").sample(sorted(envs), len(envs)):
            if (args.session, round_, name) in done:
                continue
            row = {"setting": name, "round": round_, "session": args.session, "script": args.script,
                   **({"recipe": args.recipe} if args.recipe else {}),
                   "train_s": args.train_s, **run_one(args.script, envs[name], args.train_s),
                   "load": round(os.getloadavg()[0], 2), "fingerprint": fingerprint,
                   "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            append_line(out, row)
            print(f"round {round_} {name:17s} {row['samples_per_s']:7.0f} samples/s, "
                  f"{row['faults_per_s'] / 1000:5.0f} thousand faults/s", flush=True)
    return summary(read(out, args.script, args.recipe))


if __name__ == "__main__":
    sys.exit(main())
