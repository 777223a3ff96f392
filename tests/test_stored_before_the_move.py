"""What users stored before the package layout changed still loads and applies: a study database, its recipes,
and exported env and JSON files, written by commit 14ada4e (``tests/data/before-house/``) and by cf777f1, before the
house's third step moved the measurer's contract and the budget (``tests/data/before-third-step/``): each a 40 s
search of ``tiny``, recipe 1 from it, recipe 2 saved through ``RecipeStore.save`` with one thread.

The committed files are only read: each test works on its own copy, as a user's folder would be."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.recipe_file import load_recipe_file

from .conftest import REPO, cli
from .study.conftest import trials

DATA = REPO / "tests" / "data"
# each folder of stored files, and the study its search wrote
STORED = {"before-house": "tiny-v2-e09eb7fa75a4", "before-third-step": "tiny-before-third-step"}


@pytest.fixture(params=sorted(STORED))
def stored(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str]:
    for name in ("studies.db", "recipe-1.env", "recipe-2.env", "recipe-2.json"):
        shutil.copy(DATA / request.param / name, tmp_path / name)
    return tmp_path, STORED[request.param]


def test_the_stored_study_and_its_recipes_are_read_by_every_verb(stored: tuple[Path, str]) -> None:
    folder, study = stored
    studies = cli("studies", cwd=folder)
    assert studies.returncode == 0 and study in studies.stdout, studies.stderr
    recipes = cli("recipes", "--json", cwd=folder)
    assert recipes.returncode == 0, recipes.stderr
    assert [r["id"] for r in json.loads(recipes.stdout)] == [2, 1]  # newest first
    best = json.loads(cli("best", "--json", cwd=folder).stdout)
    assert best["id"] == 2 and best["study"] == study and best["params"]["threads"] == 1
    assert cli("diff", "1", "2", cwd=folder).returncode == 0
    report = cli("report", "--recipe", "1", cwd=folder)
    assert report.returncode == 0, report.stderr
    assert list(folder.glob("report-*.html"))
    # the search's own records: roles and measurements as the study stored them
    recorded = trials(f"sqlite:///{folder / 'studies.db'}", study)
    assert recorded[0].user_attrs["role"] == "baseline" and recorded[0].user_attrs["samples_per_s"] > 0
    exported = cli("export", "--recipe", "2", "--format", "json", "-o", "again.json", cwd=folder)
    assert exported.returncode == 0, exported.stderr
    assert load_recipe_file(folder / "again.json") == load_recipe_file(folder / "recipe-2.json")


def test_the_exported_files_load_and_apply_in_a_fresh_process(stored: tuple[Path, str]) -> None:
    folder = stored[0]
    env, as_json = load_recipe_file(folder / "recipe-2.env"), load_recipe_file(folder / "recipe-2.json")
    assert env == as_json and env.id == 2 and env.params["threads"] == 1
    assert load_recipe_file(folder / "recipe-1.env").id == 1
    # written on one machine (the study's fingerprint): elsewhere apply() refuses them unless told, as it should
    code = ("import json, torch, autotune; tuned = autotune.apply(allow_other_hardware=True); "
            "print(json.dumps({'threads': torch.get_num_threads(), 'batch': tuned.batch_size}))")
    out = subprocess.run([sys.executable, "-m", "autotune", "run", "--allow-other-hardware", "--recipe",
                          "recipe-2.env", "--", sys.executable, "-c", code], cwd=folder, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"threads": 1, "batch": env.params["batch_per_rank"]}
