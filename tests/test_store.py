from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autotune.errors import StorageError, UsageError
from autotune.recipe import Recipe
from autotune.store import RecipeStore

from .conftest import cli


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


def test_a_folder_named_as_the_database_is_reported_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "studies.db").mkdir()
    for verb in (("best",), ("search", "--workload", "tiny", "--budget", "10s")):
        done = cli(*verb, cwd=tmp_path)
        assert done.returncode == 2 and done.stderr.splitlines() == [
            f"autotune {verb[0]}: error: studies.db exists but cannot be read as an SQLite database (Is a directory): "
            "move it away or pass --storage URL"], done.stderr
    assert (tmp_path / "studies.db").is_dir() and not any((tmp_path / "studies.db").iterdir())


def test_bad_url() -> None:
    with pytest.raises(UsageError, match="bad storage URL"):
        RecipeStore.open("nonsense://")


def test_the_interval_and_later_fields_round_trip(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    recipe = Recipe(params={"amp_dtype": "bfloat16"}, workload="cnn", speedup=1.31, speedup_low=1.2, speedup_high=1.4,
                    peak_memory_bytes=3 << 30)
    with RecipeStore.open(url) as store:
        saved = store.save(recipe)
    with RecipeStore.open(url, readonly=True) as store:
        again = store.get(saved.id)
    assert (again.speedup, again.speedup_low, again.speedup_high, again.peak_memory_bytes) == (1.31, 1.2, 1.4, 3 << 30)


# The recipes table as autotune 0.1 wrote it, before the ``details`` column.
OLD_TABLE = """CREATE TABLE recipes (id INTEGER NOT NULL PRIMARY KEY, study VARCHAR(512),
 workload VARCHAR(1024) NOT NULL, fingerprint VARCHAR(64), params JSON NOT NULL, samples_per_s FLOAT,
 baseline_samples_per_s FLOAT, speedup FLOAT,
 loss FLOAT, baseline_loss FLOAT, notes JSON NOT NULL, created DATETIME NOT NULL)"""
OLD_ROW = """INSERT INTO recipes VALUES (1, 'cnn-v2-x', 'cnn', 'v2-x', '{"threads": 1}', 900.0, 600.0, 1.5, 0.3, 0.3,
 '["old"]', '2026-11-01 10:00:00.000000')"""


def _old_database(path: Path) -> None:
    import sqlite3

    with sqlite3.connect(path) as connection:
        connection.execute(OLD_TABLE)
        connection.execute(OLD_ROW)
    connection.close()


def test_an_old_table_is_read_as_it_is_and_upgraded_by_a_writer_keeping_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "studies.db"
    _old_database(path)
    before = path.read_bytes()
    url = f"sqlite:///{path}"
    with RecipeStore.open(url, readonly=True) as store:  # best/export/run: read, never change the file
        old = store.get(1)
        assert (old.speedup, old.speedup_low, old.notes) == (1.5, None, ["old"])
        assert store.latest(workload="cnn") == old and store.all() == [old]
    assert path.read_bytes() == before
    with RecipeStore.open(url) as store:  # a search: the column is added, the old row kept
        new = store.save(Recipe(params={}, workload="cnn", speedup=1.2, speedup_low=1.1, speedup_high=1.3))
        assert store.get(1).speedup == 1.5 and store.get(new.id).speedup_low == 1.1
    with RecipeStore.open(url) as store:  # opened again: nothing left to upgrade
        assert [r.id for r in store.all()] == [new.id, 1]


@pytest.mark.postgres
def test_an_old_postgresql_table_is_upgraded(postgres: str) -> None:
    import sqlalchemy

    engine = sqlalchemy.create_engine(postgres)
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text("DROP TABLE IF EXISTS recipes"))
        table = OLD_TABLE.replace("DATETIME", "TIMESTAMP WITH TIME ZONE")
        connection.execute(sqlalchemy.text(table.replace("id INTEGER NOT NULL PRIMARY KEY", "id SERIAL PRIMARY KEY")))
        connection.execute(sqlalchemy.text(OLD_ROW))
        connection.execute(sqlalchemy.text("SELECT setval('recipes_id_seq', 1)"))
    try:
        with RecipeStore.open(postgres, readonly=True) as store:
            assert store.get(1).speedup == 1.5
        with RecipeStore.open(postgres) as store:
            new = store.save(Recipe(params={}, workload="cnn", speedup_low=1.1))
            assert store.get(1).notes == ["old"] and store.get(new.id).speedup_low == 1.1
    finally:
        with engine.begin() as connection:
            connection.execute(sqlalchemy.text("DROP TABLE recipes"))
        engine.dispose()


def test_what_is_saved_while_this_process_holds_connections_is_read_after_another_process_closed_its_own(
        tmp_path: Path) -> None:
    """A search holds its storage's connections when it opens the store to save its recipe; ``autotune best`` or a
    dashboard in another process then opens and closes the database. Both later commits reach the file, for any
    process to read. The store's checks read the file with ``open()`` before: closing that descriptor dropped this
    process's SQLite locks, the other process took the database for unused and deleted the write-ahead log both
    commits went to (a recipe said "stored" was missing from the database, 2026-12-05)."""
    import subprocess
    import sys

    from sqlalchemy import create_engine, text

    path = tmp_path / "studies.db"
    url = f"sqlite:///{path}"
    with RecipeStore.open(url) as store:
        store.save(Recipe(params={"n": 0}, workload="w"))
    held = create_engine(url)  # the search's storage: a pooled connection, open
    with held.connect() as connection:
        connection.execute(text("select count(*) from recipes"))
    count = ("import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "  # closed: its cleanup deletes an unused log
             "print(c.execute('select count(*) from recipes').fetchone()[0]); c.close()")
    with RecipeStore.open(url) as store:
        store.save(Recipe(params={"n": 1}, workload="w"))
        subprocess.run([sys.executable, "-c", count, str(path)], check=True, capture_output=True)
        store.save(Recipe(params={"n": 2}, workload="w"))
    with held.connect() as connection:
        connection.execute(text("insert into recipes (study, workload, params, notes, created) "
                                "values ('s', 'w', '{}', '[]', '2026-12-05')"))
        connection.commit()
    fresh = subprocess.run([sys.executable, "-c", count, str(path)], check=True, capture_output=True, text=True)
    held.dispose()
    assert fresh.stdout.strip() == "4", fresh  # both read by another process while the search still runs


def test_a_postgresql_server_that_says_nothing_ends_the_open_within_its_connect_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Something on the server's port accepts the connection and never answers (a wedged server, a proxy): psycopg
    waited its own 130 s (psycopg2, for ever), past a short budget. The recipe store, the readers' studies and the
    search's storage each end with one line after the connect timeout (2 s here: psycopg's least)."""
    import socket
    import threading
    import time

    from autotune import database
    from autotune.study.driver import rdb_storage
    from autotune.study.summaries import open_storage

    monkeypatch.setattr(database, "CONNECT_TIMEOUT_S", 2)
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    silent = socket.create_server(("127.0.0.1", 0), backlog=8)  # listens, never accepts: the kernel completes the
    url = f"postgresql+psycopg://tuner@127.0.0.1:{silent.getsockname()[1]}/autotune"  # handshake, nobody answers
    ended: dict[str, str] = {}

    def opened(name: str, how: Any) -> None:
        try:
            how()
            ended[name] = "opened"
        except Exception as e:  # noqa: BLE001 - which error is asserted below
            ended[name] = f"{type(e).__name__}: {e}"

    def search() -> None:  # as the search opens its study (``driver.search``)
        with database.storage_errors(url):
            rdb_storage(url)

    started = time.monotonic()
    paths = {"store": lambda: RecipeStore.open(url, readonly=True), "studies": lambda: open_storage(url),
             "search": search}
    threads = [threading.Thread(target=opened, args=item, daemon=True) for item in paths.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=max(0.0, started + 20 - time.monotonic()))
    took = time.monotonic() - started
    silent.close()
    assert set(ended) == set(paths) and took < 15, (ended, took)  # before: none ended
    assert all(e.startswith("StorageError: cannot open the database") and "timeout" in e and "\n" not in e
               for e in ended.values()), ended
