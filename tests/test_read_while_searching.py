"""A search writes its SQLite storage while ``autotune studies``, ``best`` and ``report`` read it (WAL mode); the
same search prints JSON lines (``--json``)."""
from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from autotune.store import RecipeStore

from .conftest import SLEEPY, run_cli
from .study.conftest import BUDGET_S, own_host, start_search, wait_for


def journal_mode(path: Path) -> str:
    with sqlite3.connect(path) as connection:
        return connection.execute("PRAGMA journal_mode").fetchone()[0]


def test_the_recipe_store_puts_sqlite_in_wal_mode(tmp_path: Path) -> None:
    with RecipeStore.open(f"sqlite:///{tmp_path}/recipes.db"):
        pass
    assert journal_mode(tmp_path / "recipes.db") == "wal"


def _finished(connection: sqlite3.Connection) -> int:
    return connection.execute("SELECT count(*) FROM trials WHERE state != 'RUNNING'").fetchone()[0]


def _now(db: Path, count: Callable[[sqlite3.Connection], int]) -> int:
    """``count`` as a new reader sees it; 0 before the search has created Optuna's tables. Read with sqlite3, not
    by polling ``autotune studies``: a Python start every 0.2 s on 2 cores starved the search."""
    if not db.exists():
        return 0
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as connection:
        if not connection.execute("SELECT 1 FROM sqlite_master WHERE name = 'trials'").fetchone():
            return 0
        return count(connection)


def _trials(connection: sqlite3.Connection) -> int:
    return connection.execute("SELECT count(*) FROM trials").fetchone()[0]


# BUDGET_S, QUICK's: the search stops by itself then, so no wait on it is longer; a wait fails at once when
# the search ends without what it waits for. SLEEPY: a busy neighbour hardly stretches the search. Its seed,
# trial 1, stalls while the flag file exists (``faulty_workloads.sleepy``): the search cannot end before the
# readers are done.


@pytest.mark.slow
def test_readers_poll_studies_best_and_report_while_a_search_writes(tmp_path: Path) -> None:
    # The baseline, then one candidate: the reads below need the study, then a trial recorded while one reads.
    # Its stdout is JSON lines; its report goes to a folder that does not exist: a warning, and the stored
    # search still succeeds.
    stall = tmp_path / "stall"
    stall.touch()
    # A minute, after QUICK's 10 (the last --budget counts): its calibration sized for it (6 A/A pairs, not 16).
    search = start_search("--workload", SLEEPY, "--trials", "2", "--confirm", "0", "--json", "--budget", "1m",
                          "--report", "missing/r.html", cwd=tmp_path,
                          env={**own_host(tmp_path), "AUTOTUNE_TEST_STALL": str(stall)})
    answers: list[tuple[str, int, str]] = []
    try:
        db = tmp_path / "studies.db"
        wait_for(lambda: _now(db, _trials) >= 1, BUDGET_S, "the baseline to start", search=search)
        assert journal_mode(db) == "wal"
        # A reader that keeps its snapshot open (a long report, a dashboard's query): in SQLite's default
        # rollback mode the search could not commit until it ends, and would fail with "database is locked".
        held = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None)
        held.execute("BEGIN")
        before = _finished(held)
        # What a user does in a second terminal, while the search calibrates and measures: each reader is a
        # Python start, so once each (on 2 cores, polling them starved the search).
        for verb in ("studies", "best", "report"):
            out = run_cli(verb, *(("-o", "polled.html") if verb == "report" else ()), cwd=tmp_path)
            answers.append((verb, out.returncode, out.stderr.strip()))
        assert search.poll() is None  # they read while it ran: its seed cannot be recorded before the flag goes
        stall.unlink()
        wait_for(lambda: _now(db, _finished) > before, BUDGET_S, "a trial recorded while a reader holds its snapshot",
                 search=search)
        assert _finished(held) == before  # its snapshot, unchanged
        held.execute("COMMIT")
        held.close()
        stdout, stderr = search.communicate(timeout=BUDGET_S + 60)
        assert search.returncode == 0, stderr
    finally:
        if search.poll() is None:
            search.kill()
            search.communicate()
    # The study exists from its first trial on; the recipe is stored last: until then ``best`` says so.
    no_recipe_yet = "autotune best: error: no recipe in sqlite:///studies.db: run 'autotune search' first"
    assert [(verb, code) for verb, code, _ in answers] == [("studies", 0), ("best", 2), ("report", 0)], answers
    assert answers[1][2] == no_recipe_yet
    final = run_cli("best", cwd=tmp_path)
    assert final.returncode == 0 and "knob(s) differ from PyTorch's defaults" in final.stdout, final.stderr
    _json_lines(stdout, stderr)


def _json_lines(stdout: str, stderr: str) -> None:
    """``--json``: every line of stdout is one event's object, the result last; the summary goes to stderr."""
    objects = [json.loads(line) for line in stdout.splitlines()]
    events = [o["event"] for o in objects]
    assert events[0] == "search_started" and events[-1] == "result"
    started = [o["number"] for o in objects if o["event"] == "trial_started"]
    finished = [o for o in objects if o["event"] == "trial_finished"]
    assert started == [o["number"] for o in finished] == [0, 1]
    assert finished[0]["role"] == "baseline" and finished[0]["result"]["status"] == "ok"
    result = objects[-1]
    assert result["study"] == objects[0]["study"] and result["recipe"]["id"] == 1
    assert result["recipe"]["params"] == next(o["params"] for o in finished if o["number"] == result["best"])
    assert "PyTorch defaults (trial 0)" in stderr  # the summary, for the person watching, on stderr
    assert result["report"] is None and "autotune: WARNING: the report was not written (" in stderr
    assert f"the study is stored: autotune report --study {result['study']}" in stderr
