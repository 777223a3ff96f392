"""The verbs that only read (best, export, run, studies, recipes, diff, apply(recipe_id)) write nothing, and say
what is missing."""
from __future__ import annotations

from pathlib import Path

import pytest

from autotune.errors import UsageError
from autotune.recipe import Recipe
from autotune.store import RecipeStore

from .conftest import cli, run_cli

READERS = [("best",), ("export", "--format", "env"), ("run", "--", "true"), ("studies",), ("recipes",),
           ("diff", "1", "2")]


@pytest.mark.parametrize("verb", READERS, ids=lambda v: v[0])
def test_readers_without_a_database_create_none(tmp_path: Path, verb: tuple[str, ...]) -> None:
    out = run_cli(*verb, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == f"autotune {verb[0]}: error: no studies.db here: run 'autotune search' first"
    assert list(tmp_path.iterdir()) == []


def test_a_recipe_id_without_a_database_creates_none(tmp_path: Path) -> None:
    out = cli("best", "--recipe", "1", "--storage", f"sqlite:///{tmp_path}/sub/studies.db", cwd=tmp_path)
    assert out.returncode == 2 and f"no database {tmp_path}/sub/studies.db: run 'autotune search' first" in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_empty_database_stays_empty(tmp_path: Path) -> None:
    (tmp_path / "studies.db").touch()
    out = cli("best", "--study", "s", cwd=tmp_path)
    assert out.returncode == 2
    assert "no recipe in sqlite:///studies.db: run 'autotune search' first" in out.stderr
    assert (tmp_path / "studies.db").stat().st_size == 0  # no recipes table created


@pytest.fixture
def two_recipes(tmp_path: Path) -> Path:
    with RecipeStore.open(f"sqlite:///{tmp_path}/studies.db") as store:
        store.save(Recipe(params={"threads": 1}, workload="tiny", fingerprint="f", study="tiny-f"))
        store.save(Recipe(params={"threads": 2}, workload="cnn", fingerprint="f", study="cnn-f"))
    return tmp_path


@pytest.mark.parametrize(
    ("filters", "message"),
    [
        (("--study", "nosuch"), "no recipe for study nosuch; studies with recipes: cnn-f, tiny-f"),
        (("--workload", "mine.py:make"), "no recipe for workload mine.py:make; workloads with recipes: cnn, tiny"),
        (("--study", "tiny-f", "--workload", "cnn"),
         "no recipe for study tiny-f and workload cnn; studies with recipes: cnn-f, tiny-f; "
         "workloads with recipes: cnn, tiny"),
    ],
)
def test_a_missing_study_or_workload_is_named_with_what_exists(
    two_recipes: Path, filters: tuple[str, ...], message: str
) -> None:
    before = (two_recipes / "studies.db").read_bytes()
    out = cli("best", *filters, cwd=two_recipes)
    assert out.returncode == 2 and out.stderr.strip() == f"autotune best: error: {message}"
    assert (two_recipes / "studies.db").read_bytes() == before


def test_best_of_a_study_that_exists(two_recipes: Path) -> None:
    out = cli("best", "--study", "tiny-f", "--json", cwd=two_recipes)
    assert out.returncode == 0, out.stderr
    assert '"threads": 1' in out.stdout and '"study": "tiny-f"' in out.stdout


def test_apply_a_recipe_id_reads_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import autotune

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="no studies.db here: run 'autotune search' first"):
        autotune.apply(1, check_hardware=False)
    assert list(tmp_path.iterdir()) == []
