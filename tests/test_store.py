from __future__ import annotations

from pathlib import Path

import pytest

from autotune.errors import StorageError, UsageError
from autotune.recipe import Recipe
from autotune.store import RecipeStore


def test_save_get_latest(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    with RecipeStore.open(url) as store:
        first = store.save(Recipe(params={"threads": 1}, workload="cnn", fingerprint="f1", study="a", speedup=1.2))
        second = store.save(Recipe(params={"threads": 2}, workload="tiny", fingerprint="f1", study="b"))
        assert store.get(first.id).params == {"threads": 1} and store.get(first.id).speedup == 1.2
        assert store.latest().id == second.id
        assert store.latest(workload="cnn").id == first.id
        assert store.latest(study="b", fingerprint="f1").id == second.id
        assert store.latest(fingerprint="other") is None
        with pytest.raises(UsageError, match="no recipe 99"):
            store.get(99)
    with RecipeStore.open(url) as store:  # persisted
        assert store.get(second.id).workload == "tiny" and store.get(second.id).created


def test_corrupt_database_is_reported_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "studies.db"
    garbage = b"this is not a database\x00" * 100
    path.write_bytes(garbage)
    with pytest.raises(StorageError, match="not an SQLite database"):
        RecipeStore.open(f"sqlite:///{path}")
    assert path.read_bytes() == garbage


def test_bad_url() -> None:
    with pytest.raises(UsageError, match="bad storage URL"):
        RecipeStore.open("nonsense://")
