"""``autotune studies``, ``recipes``, ``diff`` and ``best``: what a user sees of the storage, read-only."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ..conftest import cli
from .conftest import DEFAULTS, add_recipe, add_study

PARIS = {"TZ": "Europe/Paris"}  # a zone that is not UTC: times must say which one they are in
TUNED = {**DEFAULTS, "threads": 1, "affinity": "compact"}


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    """Two studies: one finished with a recipe, one still searching (a trial running, none confirmed)."""
    url = f"sqlite:///{tmp_path}/studies.db"
    add_study(url, "tiny-done", trials=[("baseline", DEFAULTS, "ok", 100.0), ("seed", TUNED, "ok", 180.0),
                                        ("search", {**DEFAULTS, "batch_size": 128}, "oom", None)])
    add_recipe(url, TUNED, study="tiny-done", speed=170.0)
    add_study(url, "cnn-busy", workload="cnn", fingerprint="v3-bbbbbbbbbbbb", running=1,
              trials=[("baseline", DEFAULTS, "ok", 50.0), ("search", {**DEFAULTS, "threads": 1}, "ok", 60.0)])
    return tmp_path


def test_studies_json_lists_each_study_from_the_storage(storage: Path) -> None:
    out = cli("studies", "--json", cwd=storage, env=PARIS)
    assert out.returncode == 0, out.stderr
    found = {s["name"]: s for s in json.loads(out.stdout)}
    assert found.keys() == {"tiny-done", "cnn-busy"}
    done, busy = found["tiny-done"], found["cnn-busy"]
    assert (done["workload"], done["fingerprint"], done["trials"], done["running"]) == ("tiny", "v3-aaaaaaaaaaaa", 3, 0)
    assert (done["speedup"], done["confirmed"], done["recipe"]) == (1.7, True, 1)  # the recipe's, not trial 1's 1.8
    assert (busy["workload"], busy["fingerprint"], busy["trials"], busy["running"]) == ("cnn", "v3-bbbbbbbbbbbb", 2, 1)
    assert (busy["speedup"], busy["confirmed"], busy["recipe"]) == (pytest.approx(1.2), False, None)
    for s in found.values():
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+\+0[12]:00", s["started"]), s  # Paris: with its offset
        assert s["last"] >= s["started"]


def test_studies_table_says_what_is_unconfirmed(storage: Path) -> None:
    out = cli("studies", cwd=storage, env=PARIS)
    assert out.returncode == 0, out.stderr
    rows = {line.split("│")[1].strip(): line for line in out.stdout.splitlines() if line.startswith("│ ")}
    assert "1.70x" in rows["tiny-done"] and "v3-aaaaaaaaaaaa" in rows["tiny-done"]
    assert "1.20x ?" in rows["cnn-busy"] and "2 (+1 running)" in rows["cnn-busy"]
    assert re.search(r"\d\d:\d\d:\d\d CES?T", out.stdout)
    assert "?: not confirmed side by side with the defaults over two rounds" in out.stdout


@pytest.mark.parametrize("claim", ["provisional", "search", None])
def test_studies_marks_a_recipe_whose_speedup_is_not_confirmed(storage: Path, claim: str | None) -> None:
    """A recipe offered on one confirmation round, on the search's own interval (``--confirm 0``), or stored before
    autotune kept its claim is listed with its interval and '?', never as confirmed."""
    url = f"sqlite:///{storage}/studies.db"
    add_recipe(url, {**TUNED, "threads": 2}, study="tiny-done", speed=140.0, interval=(1.2, 1.6), claim=claim)
    found = {s["name"]: s for s in json.loads(cli("studies", "--json", cwd=storage).stdout)}
    assert (found["tiny-done"]["confirmed"], found["tiny-done"]["claim"]) == (False, claim)
    rows = {line.split("│")[1].strip(): line for line in cli("studies", cwd=storage).stdout.splitlines()
            if line.startswith("│ ")}
    assert "1.40x [1.20-1.60] ?" in rows["tiny-done"]


def test_studies_of_a_database_without_any(tmp_path: Path) -> None:
    (tmp_path / "studies.db").touch()
    out = cli("studies", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "no study in sqlite:///studies.db: run 'autotune search' first"
    assert (tmp_path / "studies.db").stat().st_size == 0


def test_recipes_lists_newest_first_and_filters(storage: Path) -> None:
    url = f"sqlite:///{storage}/studies.db"
    add_recipe(url, {**TUNED, "threads": 2}, study="cnn-busy", workload="cnn", fingerprint="v3-bbbbbbbbbbbb")
    out = cli("recipes", "--json", cwd=storage)
    assert out.returncode == 0, out.stderr
    assert [(r["id"], r["study"], r["speedup"]) for r in json.loads(out.stdout)] == [(2, "cnn-busy", 2.0),
                                                                                      (1, "tiny-done", 1.7)]
    assert [r["id"] for r in json.loads(cli("recipes", "--json", "--workload", "tiny", cwd=storage).stdout)] == [1]
    table = cli("recipes", cwd=storage, env=PARIS).stdout
    assert re.search(r"│\s+1 │ tiny\s+│ tiny-done\s+│ v3-aaaaaaaaaaaa │\s+170.0 │\s+1.70x │ \S+ \S+ CES?T",
                     table), table


def test_diff_shows_the_knobs_that_differ_and_the_speeds(storage: Path) -> None:
    url = f"sqlite:///{storage}/studies.db"
    add_recipe(url, {**TUNED, "compile_mode": "default", "reference_batch": 64}, study="tiny-done", speed=250.0)
    exported = storage / "r1.json"
    exported.write_text(cli("export", "--format", "json", "--recipe", "1", cwd=storage).stdout)
    out = cli("diff", str(exported), "2", cwd=storage)
    assert out.returncode == 0, out.stderr
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.stdout.splitlines()
            if line.startswith("│")]
    assert ["samples/s", "170.0", "250.0"] in rows and ["speedup", "1.70x", "2.50x"] in rows
    assert ["compile_mode", "none", "default"] in rows
    assert not any(row[0] in ("threads", "reference_batch") for row in rows)  # equal; a run setting
    assert "1 knob(s) differ, 3 the same" in out.stdout and "note:" not in out.stdout


def test_diff_says_when_speeds_are_not_comparable(storage: Path) -> None:
    url = f"sqlite:///{storage}/studies.db"
    add_recipe(url, {"threads": 8}, study=None, workload="cnn", fingerprint="v3-cccccccccccc")
    out = cli("diff", "1", "2", cwd=storage)
    assert out.returncode == 0, out.stderr
    assert "note: measured on different hardware (v3-aaaaaaaaaaaa vs v3-cccccccccccc)" in out.stdout
    assert "note: different workloads (tiny vs cnn)" in out.stdout
    assert re.search(r"│ affinity\s+│ compact\s+│ \(not set\)\s+│", out.stdout)


def test_diff_of_a_recipe_that_is_not_there(storage: Path) -> None:
    out = cli("diff", "1", "9", cwd=storage)
    assert out.returncode == 2
    assert out.stderr.strip() == "autotune diff: error: no recipe 9 in this database: 'autotune best' lists the latest"


def test_best_marks_what_differs_from_the_baseline_and_hides_run_settings(storage: Path) -> None:
    out = cli("best", "--recipe", "1", cwd=storage, env=PARIS)
    assert out.returncode == 0, out.stderr
    rows = {cells[0]: cells[1:] for cells in ([c.strip() for c in line.split("│")[1:-1]]
                                              for line in out.stdout.splitlines() if line.startswith("│"))}
    assert rows == {"* affinity": ["compact", "none"], "* threads": ["1", "2"], "batch_size": ["32", ""],
                    "compile_mode": ["none", ""]}
    assert "* 2 knob(s) differ from PyTorch's defaults (the baseline trial of study tiny-done)" in out.stdout
    assert re.search(r"created \d{4}-\d\d-\d\d \d\d:\d\d:\d\d CES?T", out.stdout)


def test_best_of_a_file_from_this_machine_compares_with_its_defaults(storage: Path, facts) -> None:
    recipe = {"params": {"threads": 1, "affinity": "none", "reference_batch": 32}, "workload": "tiny",
              "fingerprint": facts.fingerprint, "study": "elsewhere"}
    (storage / "mine.json").write_text(json.dumps(recipe))
    out = cli("best", "--recipe", "mine.json", cwd=storage)
    assert out.returncode == 0, out.stderr
    assert "(PyTorch's defaults on this machine)" in out.stdout
    assert ("* threads" in out.stdout) == (facts.cpu.allowed.cores != 1)
    (storage / "other.json").write_text(json.dumps({**recipe, "fingerprint": "v3-cccccccccccc"}))
    out = cli("best", "--recipe", "other.json", cwd=storage)
    assert "PyTorch's defaults: unknown: its study is not in sqlite:///studies.db and it was measured on other" \
           " hardware" in out.stdout


def test_every_view_gives_a_paired_speedup_with_its_interval(storage: Path) -> None:
    url = f"sqlite:///{storage}/studies.db"
    paired = add_recipe(url, {**TUNED, "threads": 2}, study="tiny-done", speed=123.0, interval=(1.15, 1.31))
    best = cli("best", "--recipe", str(paired.id), cwd=storage)
    assert best.returncode == 0, best.stderr
    assert "1.23x [1.15-1.31] (confirmed, 95% interval) PyTorch defaults (123.0 vs 100.0 samples/s)" in best.stdout
    recipes = cli("recipes", cwd=storage)
    assert "1.23x [1.15-1.31]" in recipes.stdout and "1.70x" in recipes.stdout  # an old recipe: no interval
    studies = cli("studies", "--json", cwd=storage)
    done = next(s for s in json.loads(studies.stdout) if s["name"] == "tiny-done")
    assert (done["speedup"], done["speedup_low"], done["speedup_high"]) == (1.23, 1.15, 1.31)
    assert "1.23x [1.15-1.31]" in cli("studies", cwd=storage).stdout
    diff = cli("diff", "1", str(paired.id), cwd=storage)
    assert re.search(r"speedup\s+│ 1.70x\s+│ 1.23x \[1.15-1.31\]", diff.stdout), diff.stdout
    export = cli("export", "--recipe", str(paired.id), "--format", "env", "-o", "best.env", cwd=storage)
    assert export.returncode == 0, export.stderr
    header = "# 1.23x [1.15-1.31] PyTorch defaults: 123.0 vs 100.0 samples/s (confirmed, 95% interval)"
    assert header in (storage / "best.env").read_text()
