"""A search writes its SQLite storage while ``autotune studies``, ``best`` and ``report`` read it (WAL mode)."""
from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from autotune.store import RecipeStore

from .conftest import run_cli
from .study.conftest import start_search, wait_for


def journal_mode(path: Path) -> str:
    with sqlite3.connect(path) as connection:
        return connection.execute("PRAGMA journal_mode").fetchone()[0]


def test_the_recipe_store_puts_sqlite_in_wal_mode(tmp_path: Path) -> None:
    with RecipeStore.open(f"sqlite:///{tmp_path}/recipes.db"):
        pass
    assert journal_mode(tmp_path / "recipes.db") == "wal"


def _finished(connection: sqlite3.Connection) -> int:
    return connection.execute("SELECT count(*) FROM trials WHERE state != 'RUNNING'").fetchone()[0]


def _finished_now(db: Path) -> int:
    """Finished trials as a new reader sees them. Read with sqlite3, not by polling ``autotune studies``:
    a Python start every 0.2 s on 2 cores starved the search (CI timed out waiting for its second trial)."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as connection:
        return _finished(connection)


@pytest.mark.slow
def test_readers_poll_studies_best_and_report_while_a_search_writes(tmp_path: Path) -> None:
    search = start_search("--trials", "4", "--confirm", "1", "--confirm-rounds", "1", "--no-compile", cwd=tmp_path)
    answers: list[tuple[str, int, str]] = []
    done = threading.Event()

    def poll() -> None:  # what a user does in a second terminal
        while not done.is_set():
            for verb in ("studies", "best", "report"):
                out = run_cli(verb, *(("-o", "polled.html") if verb == "report" else ()), cwd=tmp_path)
                answers.append((verb, out.returncode, out.stderr.strip()))
            time.sleep(1.5)  # each reader is a Python start: on 2 cores, polling faster slows the search

    reader = threading.Thread(target=poll)
    try:
        db = tmp_path / "studies.db"
        wait_for(lambda: _finished_now(db) >= 1, 180, "the first measured trial")
        assert journal_mode(db) == "wal"
        reader.start()
        # A reader that keeps its snapshot open (a long report, a dashboard's query): in SQLite's default
        # rollback mode the search could not commit until it ends, and would fail with "database is locked".
        held = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None)
        held.execute("BEGIN")
        before = _finished(held)
        wait_for(lambda: _finished_now(db) > before, 180, "a trial recorded while a reader holds its snapshot")
        assert _finished(held) == before  # its snapshot, unchanged
        held.execute("COMMIT")
        held.close()
        stdout, stderr = search.communicate(timeout=300)
        assert search.returncode == 0, stderr
    finally:
        done.set()
        if reader.is_alive():
            reader.join(timeout=60)
        if search.poll() is None:
            search.kill()
            search.communicate()
    for verb in ("studies", "report"):  # the study exists from the first measured trial on
        polled = [a for a in answers if a[0] == verb]
        assert polled and all(code == 0 for _, code, _ in polled), polled
    no_recipe_yet = "autotune best: error: no recipe in sqlite:///studies.db: run 'autotune search' first"
    for _, code, err in (a for a in answers if a[0] == "best"):  # before the recipe is stored: it says so
        assert code == 0 or err == no_recipe_yet
    final = run_cli("best", cwd=tmp_path)
    assert final.returncode == 0 and "knob(s) differ from PyTorch's defaults" in final.stdout, final.stderr
