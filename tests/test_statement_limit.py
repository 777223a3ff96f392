"""A database that stops answering midway: each statement to a PostgreSQL storage ends within its limit, and a verb
that lost its database says so in one line (``autotune.statement_limit``)."""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError, OperationalError

from autotune import cli, statement_limit
from autotune.database import open_engine
from autotune.errors import UsageError


@pytest.fixture(autouse=True)
def _own_watch() -> Iterator[None]:
    """The process's watch as it was (its limit, no cut left to tell): another test's engines read it."""
    before = statement_limit._watch.limit if statement_limit._watch is not None else None
    yield
    if statement_limit._watch is not None:
        statement_limit._watch.cut = None
        if before is not None:
            statement_limit._watch.limit = before


@pytest.mark.postgres
def test_a_server_that_stops_answering_ends_the_statement_within_the_limit(
        postgres: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection's server process stopped (SIGSTOP: its kernel still acknowledges every packet, as a wedged
    server's does): TCP's keepalives see a live peer and libpq waited for ever, past any budget. The statement now
    ends after the limit (1 s here), its connection cut, and the verb's line names the limit and how to raise it.
    An engine that is not autotune's keeps its statements unlimited."""
    monkeypatch.setenv(statement_limit.LIMIT_VARIABLE, "1")
    engine = open_engine(postgres)
    try:
        with engine.connect() as connection:
            backend = connection.execute(text("SELECT pg_backend_pid()")).scalar_one()
        os.kill(backend, signal.SIGSTOP)  # the pool hands the same connection out again: the next statement waits
        resume = threading.Timer(10.0, os.kill, (backend, signal.SIGCONT))  # without a limit: fails, never hangs
        resume.start()
        try:
            started = time.monotonic()
            with engine.connect() as connection, pytest.raises(OperationalError) as raised:
                connection.execute(text("SELECT 1"))
            took = time.monotonic() - started
        finally:
            resume.cancel()
            os.kill(backend, signal.SIGCONT)
        assert 1 <= took < 5, took
        said = str(statement_limit.lost(raised.value, "the --storage given"))  # the database whose statement was cut
        assert said.startswith(f"the database {postgres} did not answer within 1 s"), said
        assert "AUTOTUNE_DB_TIMEOUT_S=SECONDS" in said and "\n" not in said
        with engine.connect() as connection:  # the pool's next connection is a new one, answered
            assert connection.execute(text("SELECT 2")).scalar_one() == 2
        assert statement_limit._watch is not None
        statement_limit._watch.cut = "a heartbeat's"  # a cut whose error was swallowed, then an answer
        with engine.connect() as connection:
            connection.execute(text("SELECT 2"))
        assert statement_limit.overdue() is None  # explains no later error
    finally:
        engine.dispose()
    engine = open_engine(postgres)
    watch = statement_limit._watch
    assert watch is not None

    def idle(seconds: float) -> None:  # past a limit of 0.2 s (a loaded machine's statements keep the 1 s)
        watch.limit = 0.2
        time.sleep(seconds)
        watch.limit = 1.0

    try:
        with engine.connect() as connection:  # kept after a commit and a rollback, idle past the limit: not hung
            connection.execute(text("SELECT 1"))
            connection.commit()
            idle(0.6)
            connection.execute(text("SELECT 1"))
            connection.rollback()
            idle(0.6)
            assert connection.execute(text("SELECT 3")).scalar_one() == 3
        assert not watch.busy and statement_limit.overdue() is None  # every mark ended, none cut
    finally:
        engine.dispose()
    watch.limit = 0.2
    theirs = create_engine(postgres)  # the user's own engine, in the process autotune.apply() runs in: not ours
    try:
        with theirs.connect() as connection:
            assert connection.execute(text("SELECT 3 FROM pg_sleep(0.6)")).scalar_one() == 3
    finally:
        theirs.dispose()


@pytest.mark.postgres
def test_a_new_connections_first_queries_end_within_the_limit(postgres: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that accepts a connection and leaves the dialect's first queries on it unanswered (here: the catalog
    they read locked by another session) held the engine's first connect for ever, past the connect timeout (the
    connection was made) and past the statement limit (no statement event reaches those queries). Now they get
    the limit too, and the line is the limit's; a connection whose first queries answered is watched no more."""
    monkeypatch.setenv(statement_limit.LIMIT_VARIABLE, "1")
    engine = open_engine(postgres)
    try:
        with engine.connect() as connection:  # its first queries answered: no mark left, nothing to tell
            assert connection.execute(text("SELECT 1")).scalar_one() == 1
        assert statement_limit._watch is not None and not statement_limit._watch.busy
        assert statement_limit.overdue() is None
    finally:
        engine.dispose()
    theirs = create_engine(postgres)  # not ours: held as long as it takes
    locker = theirs.connect()
    try:
        # its server ends it after 10 s idle in its transaction: without a limit, the test fails, never hangs
        locker.execute(text("SET idle_in_transaction_session_timeout = '10s'"))
        locker.execute(text("LOCK TABLE pg_catalog.pg_proc IN ACCESS EXCLUSIVE MODE"))  # until its rollback
        engine = open_engine(postgres)
        started = time.monotonic()
        try:
            with pytest.raises(OperationalError) as raised:
                engine.connect()
        finally:
            engine.dispose()
        took = time.monotonic() - started
    finally:
        with contextlib.suppress(DBAPIError):  # ended by its server where the limit did not work
            locker.rollback()
        locker.close()
        theirs.dispose()
    assert 1 <= took < 5, took  # the limit's second, not the 10-s connect timeout, nor for ever
    said = str(statement_limit.lost(raised.value, "the --storage given"))
    assert said.startswith(f"the database {postgres} did not answer within 1 s"), said


@pytest.mark.parametrize("value", ["0", "-3", "soon", "nan", "inf"])
def test_a_limit_that_is_no_positive_number_is_refused_before_the_database_is_opened(
        monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(statement_limit.LIMIT_VARIABLE, value)
    with pytest.raises(UsageError, match="AUTOTUNE_DB_TIMEOUT_S=.*a positive number"):
        open_engine("postgresql+psycopg://tuner@127.0.0.1:9/autotune")


def test_a_verb_that_lost_its_database_midway_says_so_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A server gone mid-search reached the user as "internal error: StorageInternalError: An exception is raised
    during the commit. This typically happens due to invalid data in the commit", exit 1, as if a bug of ours. Now
    the driver's words with the database (its password masked), exit 2: "lost" where the connection ended, "failed"
    where the database answered with an error of its own; an error that is no database's is still a bug."""
    import optuna

    class DriverError(Exception):
        def __init__(self, said: str, sqlstate: str | None) -> None:  # as psycopg's: the server's code, if it said
            super().__init__(said)
            self.sqlstate = sqlstate

    def failing(said: str, ended: bool, sqlstate: str | None = None) -> Callable[[argparse.Namespace], int]:
        def verb(args: argparse.Namespace) -> int:
            try:
                raise OperationalError("COMMIT", {}, DriverError(said, sqlstate), connection_invalidated=ended)
            except OperationalError as e:
                raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from e
        return verb

    storage = "postgresql+psycopg://tuner:s3cret@db.example/autotune"
    shown = "postgresql+psycopg://tuner:***@db.example/autotune"
    gone = failing("server closed the connection unexpectedly\n\tThis probably means the server terminated", True)
    code = cli._verb(argparse.Namespace(func=gone, verb="search", debug=False), storage)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err == (f"autotune search: error: lost the database {shown} midway: server closed the connection "
                   "unexpectedly This probably means the server terminated; what was recorded before is kept\n")
    locked = failing("canceling statement due to lock timeout", False, "55P03")  # the server said it
    statement_limit.watch()
    assert statement_limit._watch is not None
    statement_limit._watch.cut = "another"  # a cut ends a connection: no error the database said is one
    assert cli._verb(argparse.Namespace(func=locked, verb="search", debug=False), storage) == 2
    assert capsys.readouterr().err == (f"autotune search: error: the database {shown} failed midway: canceling "
                                       "statement due to lock timeout; what was recorded before is kept\n")

    # the driver's own end of the stream, where SQLAlchemy could not ask the connection (a dialect's first query on
    # a raw cursor): not marked as the connection's end, no SQLSTATE; the cut explains it
    statement_limit._watch.cut = shown
    raw = failing("consuming input failed: server closed the connection unexpectedly", False)
    assert cli._verb(argparse.Namespace(func=raw, verb="search", debug=False), storage) == 2
    assert capsys.readouterr().err.startswith(f"autotune search: error: the database {shown} did not answer within ")

    def no_such_table(args: argparse.Namespace) -> int:  # SQLite's generic error: a statement of ours, a bug
        with create_engine("sqlite://").connect() as connection:
            connection.execute(text("SELECT x FROM no_such_table"))
        return 0

    assert cli._verb(argparse.Namespace(func=no_such_table, verb="search", debug=False), None) == 1
    assert "internal error: OperationalError" in capsys.readouterr().err

    def bug(args: argparse.Namespace) -> int:
        raise KeyError("x")

    assert cli._verb(argparse.Namespace(func=bug, verb="search", debug=False), storage) == 1
    assert "internal error: KeyError" in capsys.readouterr().err


def test_the_database_a_cut_names_hides_a_password_given_as_a_parameter() -> None:
    """SQLAlchemy's ``hide_password`` hides ``user:password@`` only: a ``?password=`` reached the line a cut
    statement ends with (``overdue``), and ``apply(storage=...)``'s caller prints it. Nothing is connected here."""
    engine = open_engine("postgresql+psycopg://u@127.0.0.1:1/db?password=S3CR&sslpassword=S3CR")
    try:
        pool = engine.pool
        assert isinstance(pool, statement_limit.WatchedPool)
        shown = [pool.watched_url, pool.recreate().watched_url]  # a disposed engine's pool is a recreated one
        assert all(url and "S3CR" not in url and "127.0.0.1:1/db" in url for url in shown), shown
    finally:
        engine.dispose()
