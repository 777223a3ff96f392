"""The verbs that only read create no schema in a server database either."""
from __future__ import annotations

from pathlib import Path

import pytest

from ..conftest import run_cli


@pytest.mark.postgres
def test_best_on_an_empty_server_database_creates_no_table(postgres: str, tmp_path: Path) -> None:
    import sqlalchemy

    engine = sqlalchemy.create_engine(postgres, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(sqlalchemy.text("CREATE DATABASE readonly"))
    engine.dispose()
    url = postgres.rsplit("/", 1)[0] + "/readonly"
    for verb, *command in (("best",), ("export",), ("run", "--", "true")):
        out = run_cli(verb, "--storage", url, *command, cwd=tmp_path)
        assert out.returncode == 2 and f"no recipe in {url}: run 'autotune search' first" in out.stderr, out.stderr
    engine = sqlalchemy.create_engine(url)
    assert sqlalchemy.inspect(engine).get_table_names() == []
    engine.dispose()
    assert list(tmp_path.iterdir()) == []
