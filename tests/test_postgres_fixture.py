"""The ``postgres`` fixture finds the PostgreSQL server that Debian's ``postgresql`` package installed,
whatever its version."""
from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import pg_bin


def _install(root: Path, version: str, *, initdb: bool = True) -> Path:
    bin_dir = root / version / "bin"
    bin_dir.mkdir(parents=True)
    if initdb:
        (bin_dir / "initdb").touch()
    return bin_dir


@pytest.mark.parametrize(
    ("installed", "expected"),
    [
        ((("15", True),), "15"),
        ((("16", True),), "16"),  # a Debian release with another server version
        ((("9.6", True), ("13", True), ("17", True)), "17"),  # versions compare as numbers, not text
        ((("15", True), ("16", False)), "15"),  # 16's client only: no server to start
        ((("15", True), ("common", True)), "15"),  # not a version
        ((), None),
    ],
)
def test_the_highest_installed_server_is_found(tmp_path: Path, installed, expected) -> None:
    for version, has_initdb in installed:
        _install(tmp_path, version, initdb=has_initdb)
    found = pg_bin(tmp_path)
    assert found == (tmp_path / expected / "bin" if expected else None)


@pytest.mark.postgres
def test_the_server_started_for_the_session_answers(postgres: str) -> None:
    import sqlalchemy

    engine = sqlalchemy.create_engine(postgres)
    try:
        with engine.connect() as connection:
            assert connection.execute(sqlalchemy.text("select 1")).scalar() == 1
    finally:
        engine.dispose()
