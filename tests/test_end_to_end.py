"""The user's path: search, best, export, then apply() in a fresh Python process."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.recipe import load_recipe_file

from . import quality_workloads
from .conftest import FAST, defaults_env, run_cli

PROBE_SCRIPT = """
import json, os, warnings, torch, autotune
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    tuned = autotune.apply({source})
print(json.dumps({{"threads": torch.get_num_threads(), "batch_size": tuned.batch_size,
                  "cpus": sorted(os.sched_getaffinity(0)), "warnings": [str(w.message) for w in caught]}}))
"""


def _python(code: str, cwd: Path, prefix: list[str] | None = None) -> dict:
    out = subprocess.run([*(prefix or []), sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_search_export_apply(tmp_path: Path) -> None:
    # A workload made slow on purpose: batch 256 runs one forward pass per optimizer step of 256 samples where
    # the default 64 runs four (--global-batch 256), ~4x the samples/s at the same loss. The search must find it,
    # and the speedup must come from the confirmation's fresh pairs against the defaults, with its interval.
    workload = quality_workloads.spec("slow")
    search = run_cli("search", "--workload", workload, "--budget", "3m", "--trials", "2", "--global-batch", "256",
                     *defaults_env(), "--fix", "batch_per_rank=256", "--no-compile", "--confirm", "1",
                     *FAST, cwd=tmp_path)
    assert search.returncode == 0, search.stderr
    assert "PyTorch defaults (trial 0)" in search.stdout, search.stdout
    claim = re.search(r"^(\d+\.\d\d)x \[(\d+\.\d\d)-(\d+\.\d\d)\] over PyTorch defaults$", search.stdout, re.M)
    assert claim and 1.3 < float(claim[2]) <= float(claim[1]) <= float(claim[3]), search.stdout
    assert "noise: identical runs here differ by up to" in search.stdout
    assert (tmp_path / "studies.db").exists()

    best = run_cli("best", "--json", cwd=tmp_path)
    stored = json.loads(best.stdout)
    assert stored["workload"] == workload and stored["baseline_samples_per_s"] > 0
    assert stored["params"]["batch_per_rank"] == 256 and stored["params"]["reference_batch"] == 64
    assert stored["format"] == 2 and "batch_size" not in stored["params"]
    assert stored["speedup"] == pytest.approx(float(claim[1]), abs=0.005), stored
    interval = (stored["speedup_low"], stored["speedup_high"])
    assert interval == pytest.approx((float(claim[2]), float(claim[3])), abs=0.005), stored
    assert any(note.startswith("best (trial ") and "confirmed at" in note for note in stored["notes"]), (
        stored["notes"], search.stderr[-3000:])
    assert stored["samples_per_s"] == pytest.approx(stored["speedup"] * stored["baseline_samples_per_s"])

    assert run_cli("export", "--format", "env", "-o", "best.env", cwd=tmp_path).returncode == 0
    assert run_cli("export", "--format", "json", "-o", "best.json", cwd=tmp_path).returncode == 0
    recipe = load_recipe_file(tmp_path / "best.env")
    assert recipe == load_recipe_file(tmp_path / "best.json")
    assert recipe.id == stored["id"] and recipe.params == stored["params"]

    # Loaded by bash, then applied in a fresh process: the recipe's settings are in effect.
    code = PROBE_SCRIPT.format(source="'best.env'")
    loaded = _python(code, tmp_path, ["bash", "-c", 'set -a; . ./best.env; set +a; exec "$@"', "bash"])
    assert loaded["threads"] == recipe.params["threads"]
    assert loaded["batch_size"] == recipe.params["batch_per_rank"]

    # Under `autotune run`, even affinity is in effect, and apply() with no argument finds the recipe.
    under_run = _python(PROBE_SCRIPT.format(source=""), tmp_path,
                        [sys.executable, "-m", "autotune", "run", "--recipe", "best.env", "--"])
    assert under_run["threads"] == recipe.params["threads"] and under_run["warnings"] == []


def test_apply_warns_when_environment_knobs_are_missing(tmp_path: Path) -> None:
    recipe = {"params": {"threads": 1, "interop_threads": 1, "affinity": "compact", "batch_size": 8},
              "workload": "tiny"}
    (tmp_path / "r.json").write_text(json.dumps(recipe))
    plain = _python(PROBE_SCRIPT.format(source="'r.json'"), tmp_path)
    assert plain["threads"] == 1  # in-process knobs are applied anyway
    assert any("autotune run" in w and "OMP_NUM_THREADS=1" in w for w in plain["warnings"])


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    for args, message in [
        (("search", "--workload", "nosuch", "--budget", "10s"), "not a bundled name"),
        (("search", "--workload", "tiny", "--budget", "soon"), "bad duration"),
        (("best",), "no studies.db here: run 'autotune search' first"),
        (("export", "--recipe", "missing.env"), "cannot read recipe file"),
        # nothing listens on port 1: refused at once, or (seen on a loaded 2-core machine) psycopg's timeout first
        (("best", "--storage", "postgresql+psycopg://nobody@127.0.0.1:1/x"), ("Connection refused",
                                                                              "connection timeout expired")),
    ]:
        result = run_cli(*args, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        wanted = (message,) if isinstance(message, str) else message
        assert len(lines) == 1 and any(m in lines[0] for m in wanted), result.stderr
        assert "Traceback" not in result.stderr


def test_a_reader_that_closes_the_pipe_is_no_internal_error(tmp_path: Path) -> None:
    # `autotune recipes | head`: `true` exits before autotune writes, so the write meets a closed pipe
    out = subprocess.run(["bash", "-c", f'"{sys.executable}" -m autotune probe --no-runtime --json | true; '
                          'echo "${PIPESTATUS[0]}"'], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "141" and out.stderr == "", out.stderr
