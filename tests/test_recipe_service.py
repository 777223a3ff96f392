"""The recipe service of a fleet: one machine searches into PostgreSQL, the others fetch and apply its recipe."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import autotune
from autotune import search_spaces as spaces
from autotune.errors import HardwareMismatchError
from autotune.recipe import Recipe
from autotune.store import RecipeStore

from .conftest import run_cli

pytestmark = pytest.mark.postgres
# The workload's name is the recipe's key in the storage: nothing here loads it.
WORKLOAD = "fleet"

# What a training script sees once started: the recipe it got, and the threads and CPUs in effect.
REPORT = """
import json, os, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import autotune, torch
    tuned = autotune.apply({args})
print(json.dumps({{"recipe": json.loads(os.environ.get("AUTOTUNE_RECIPE", "null") or "null"),
                  "omp": os.environ.get("OMP_NUM_THREADS"), "threads": torch.get_num_threads(),
                  "cpus": sorted(os.sched_getaffinity(0)), "warnings": [str(w.message) for w in caught]}}))
"""


def _script(tmp_path: Path, name: str, args: str = "") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(REPORT.format(args=args)))
    return path


def test_a_machine_runs_the_recipe_another_searched(postgres: str, tmp_path: Path, facts) -> None:
    # What the searching machine stored (a search into PostgreSQL: tests/study/test_workers.py), pinned to one
    # thread on one CPU, so there is something to see in effect on the other side.
    params = {**spaces.defaults(facts, spaces.SpaceContext(default_batch_size=64)), "threads": 1,
              "affinity": "compact", "device": "cpu", "reference_batch": 64, "global_batch": None,
              "lr_scaling": "sqrt"}
    with RecipeStore.open(postgres) as store:
        recipe = store.save(Recipe(params=params, workload=WORKLOAD, fingerprint=facts.fingerprint, study="fleet",
                                   speedup=1.9, speedup_low=1.8, speedup_high=2.0))

    worker = tmp_path / "worker"  # another machine of the fleet: no files, only the storage's URL
    worker.mkdir()
    script = _script(worker, "train.py")
    out = run_cli("run", "--storage", postgres, "--workload", WORKLOAD, "--", sys.executable, str(script),
                  cwd=worker)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["recipe"]["id"] == recipe.id and seen["recipe"]["fingerprint"] == facts.fingerprint
    assert (seen["omp"], seen["threads"]) == ("1", 1)
    assert seen["cpus"] == spaces.cpus_for(recipe.params, facts) and len(seen["cpus"]) == 1
    assert seen["warnings"] == []  # every knob in effect: nothing to fix

    # In-process only, without 'autotune run': torch's threads are set, the environment knobs are named with the fix.
    inproc = _script(worker, "inproc.py", f"workload={WORKLOAD!r}, storage={postgres!r}")
    done = subprocess.run([sys.executable, str(inproc)], cwd=worker, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert (seen["recipe"], seen["omp"], seen["threads"]) == (None, None, 1)
    assert any("environment-level knobs not in effect" in w and "OMP_NUM_THREADS" in w
               and f"autotune run --storage {postgres} --workload {WORKLOAD} -- python" in w
               for w in seen["warnings"]), \
        seen["warnings"]


def test_a_recipe_of_other_hardware_is_refused_with_the_reason(postgres: str, tmp_path: Path, facts) -> None:
    with RecipeStore.open(postgres) as store:
        other = store.save(Recipe(params={"threads": 3}, workload="fleet-other", fingerprint="v3-000000000000"))
    out = run_cli("run", "--storage", postgres, "--workload", "fleet-other", "--", "true", cwd=tmp_path)
    assert out.returncode == 2
    reason = (f"no recipe for workload fleet-other measured on this machine's hardware {facts.fingerprint} in "
              f"{postgres}: the newest, recipe {other.id}, was measured on v3-000000000000; search on this hardware "
              "first: autotune search --workload fleet-other --storage URL")
    assert out.stderr == f"autotune run: error: {reason}\n"
    with pytest.raises(HardwareMismatchError) as refused:
        autotune.apply(workload="fleet-other", storage=postgres, facts=facts)
    assert str(refused.value) == reason
    out = run_cli("run", "--storage", postgres, "--workload", "fleet-none", "--", "true", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.startswith(
        f"autotune run: error: no recipe for workload fleet-none in {postgres}: run 'autotune search --workload "
        "fleet-none --storage URL' first; workloads with recipes: ")
