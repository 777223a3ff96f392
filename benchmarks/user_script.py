"""Does the user's own script get what the search claimed? A plain training script (``examples/train_cnn.py``,
the bundled CNN's model written out as a user would) run plain and under ``autotune run --recipe FILE`` with
``autotune.apply()``, alternately, in fresh processes (which of the two goes first in a pair is random), and
the per-pair ratios' median with its exact 95% interval set beside the recipe's stated speedup.

    autotune export --format env -o best.env
    python benchmarks/user_script.py --recipe best.env --pairs 10

Passes when the median pair ratio is within 15% of the stated speedup (the issue's target). Every process
also reports the threads in effect. The last line printed is one JSON object with the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "train_cnn.py"
AGREE = 0.15


def _run(command: list[str], seconds: float) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOTUNE_RECIPE")}
    env["TRAIN_S"] = str(seconds)
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        sys.exit(f"user_script: {' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    result["warnings"] = [line for line in done.stderr.splitlines() if "warn" in line.lower()]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", required=True, help="an exported recipe (autotune export --format env)")
    parser.add_argument("--script", type=Path, default=SCRIPT,
                        help="the training script, one that prints the JSON line train_cnn.py prints (default: "
                        "examples/train_cnn.py; examples/train_augmented.py is input-bound)")
    parser.add_argument("--pairs", type=int, default=10, help="fresh-process pairs (default 10)")
    parser.add_argument("--seconds", type=float, default=8.0, help="timed training per process (default 8)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from autotune.measure import stats
    from autotune.recipe_file import load_recipe_file

    recipe = load_recipe_file(args.recipe)
    autotune = shutil.which("autotune") or str(Path(sys.executable).with_name("autotune"))
    plain = [sys.executable, str(args.script)]
    tuned = [autotune, "run", "--recipe", args.recipe, "--", sys.executable, str(args.script)]
    rng, ratios, rows = random.Random(args.seed), [], []
    print(f"recipe {recipe.id} ({args.recipe}): stated {recipe.speedup_text} over PyTorch defaults; "
          f"{args.pairs} fresh-process pairs of {args.seconds:g} s each, load average {os.getloadavg()[0]:.2f}")
    started = time.monotonic()
    for pair in range(args.pairs):
        order = ["plain", "tuned"] if rng.random() < 0.5 else ["tuned", "plain"]
        got = {side: _run(plain if side == "plain" else tuned, args.seconds) for side in order}
        ratio = got["tuned"]["samples_per_s"] / got["plain"]["samples_per_s"]
        ratios.append(ratio)
        rows.append({"pair": pair + 1, "first": order[0], "plain": got["plain"], "tuned": got["tuned"],
                     "ratio": ratio})
        print(f"pair {pair + 1:2d} ({order[0]} first): plain {got['plain']['samples_per_s']:8.1f} samples/s "
              f"({got['plain']['threads']} threads), tuned {got['tuned']['samples_per_s']:8.1f} "
              f"({got['tuned']['threads']} threads), ratio {ratio:.3f}"
              + (f"  warnings: {got['tuned']['warnings']}" if got["tuned"]["warnings"] else ""))
    measured = stats.median_interval(ratios)
    stated = recipe.speedup
    agree = stated is not None and abs(measured.median / stated - 1) <= AGREE
    print(f"user's script: {measured.median:.2f}x [{measured.low:.2f}-{measured.high:.2f}] "
          f"({measured.confidence:.0%} interval, {len(ratios)} pairs, {time.monotonic() - started:.0f} s); "
          f"stated {recipe.speedup_text}: " + ("agree within 15%" if agree else "DO NOT agree within 15%"))
    print(json.dumps({"recipe": recipe.id, "stated": stated, "stated_low": recipe.speedup_low,
                      "stated_high": recipe.speedup_high, "measured": measured.median, "measured_low": measured.low,
                      "measured_high": measured.high, "pairs": len(ratios), "ratios": ratios, "agree": agree,
                      "load_average": os.getloadavg()[0], "params": recipe.params}))
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
