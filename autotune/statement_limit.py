"""A database that stops answering: a client-side limit on each statement of a PostgreSQL storage.

A PostgreSQL server can hang while its machine's kernel still acknowledges every packet (a stopped or wedged server
process, a storage stall under it): TCP's keepalives and libpq's ``tcp_user_timeout`` (``database.engine_kwargs``)
see a live peer, the server's own ``statement_timeout`` never fires, and libpq waits for its reply for ever, with the
search's budget and its workers held. So each statement, commit and rollback this process sends to PostgreSQL through
libpq (psycopg 3 or psycopg2: libpq tells whether a command waits for its answer) is timed from the outside
(SQLAlchemy's engine and pool events): one that has not answered within the limit (``limit_s``:
``AUTOTUNE_DB_TIMEOUT_S``, else ``LIMIT_S``) has its connection's socket shut down, the driver raises its
disconnection error, and ``lost`` makes that one line naming the database and the limit. A new connection is timed
so too, from its start to its first checkout: the queries the dialect runs on it (its version, its schema), which
no statement event reaches, through our engines' pool (``WatchedPool``). Not timed: SQLite's files (a lock held
elsewhere is SQLite's own busy timeout) and other drivers.

The watch is the process's own (``watch()``, once), its events on SQLAlchemy's classes: Optuna's ``RDBStorage``
creates its engine and tables inside its constructor, where no event on the engine would reach. Only our engines are
timed, marked by their execution option (``WATCHED``, set by ``database.engine_kwargs``): an engine of the user's own
in the same process (``autotune.apply()`` runs inside their training) keeps its statements unlimited.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.pool import Pool, QueuePool

from .errors import StorageError, UsageError, error_chain, one_line, seconds_variable

log = logging.getLogger(__name__)

WATCHED = "autotune_statement_limit"  # the execution option that marks our engines (``database.engine_kwargs``)
_SQLITE_ERROR = 1  # SQLite's generic result code: a statement of ours it cannot run, not a database in trouble
LIMIT_S = 30.0  # a statement on a loopback or LAN server takes milliseconds; a study's whole history seconds
LIMIT_VARIABLE = "AUTOTUNE_DB_TIMEOUT_S"


def limit_s() -> float:
    """The limit a statement is given: ``$AUTOTUNE_DB_TIMEOUT_S`` (seconds, a positive number), else ``LIMIT_S``."""
    return seconds_variable(LIMIT_VARIABLE, LIMIT_S, "a database statement may take", UsageError)


@dataclass
class _Busy:
    since: float  # time.monotonic() when the statement, commit or rollback was sent
    connection: Any  # the DBAPI connection: kept while it is marked, its socket read again when it is cut
    url: str  # the database, its password masked


class _Watch:
    """The statements in flight on sockets (by their DBAPI connection's id), and the thread that cuts the overdue."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.lock = threading.Lock()
        self.busy: dict[int, _Busy] = {}
        self.cut: str | None = None  # the database whose connection was cut last, until told or answered since
        self.thread: threading.Thread | None = None

    def start(self, dbapi_connection: Any, url: str) -> None:
        with self.lock:
            self.busy[id(dbapi_connection)] = _Busy(time.monotonic(), dbapi_connection, url)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="autotune-statement-limit", daemon=True)
                self.thread.start()

    def end(self, dbapi_connection: Any, answered: bool | None = False) -> None:
        """``answered``: the database answered it (a cut before, a heartbeat's retried, explains no later error);
        None: where it was marked (a new connection checked out once its first queries answered)."""
        with self.lock:
            marked = self.busy.pop(id(dbapi_connection), None) is not None
            if answered or (answered is None and marked):
                self.cut = None

    def _run(self) -> None:
        while True:
            time.sleep(max(0.05, min(1.0, self.limit / 4)))
            now = time.monotonic()
            with self.lock:  # cut while marked: a connection closes (its ``close`` event) only after its mark is gone
                for key, busy in [(k, b) for k, b in self.busy.items() if now - b.since > self.limit]:
                    del self.busy[key]
                    # SQLAlchemy tells no commit's or rollback's end: a connection kept after one is idle, not hung
                    if _waiting(busy.connection) and _shut_down(busy.connection):
                        self.cut = busy.url
                        log.debug("no answer from %s in %g s: its connection shut down", busy.url, self.limit)


def _waiting(dbapi_connection: Any) -> bool:
    """Whether the driver waits for the server's answer (libpq: a command in progress, ``PQTRANS_ACTIVE``, read by
    psycopg 3 or psycopg2); False for a driver that cannot tell (its engines are not marked: ``database``)."""
    active = 1  # libpq's PQTRANS_ACTIVE
    try:
        status = getattr(getattr(dbapi_connection, "info", None), "transaction_status", None)  # psycopg 3
        if status is not None:
            return int(status) == active
        read = getattr(dbapi_connection, "get_transaction_status", None)  # psycopg2
        return callable(read) and int(read()) == active
    except Exception:  # noqa: BLE001 - closed meanwhile: nothing to cut
        return False


def _shut_down(dbapi_connection: Any) -> bool:
    """End the TCP connection under the driver's socket without closing its descriptor (a duplicate is shut down
    and closed): the driver's wait sees the end of its stream and raises its own disconnection error. False where
    it has no socket any more."""
    try:
        duplicate = socket.socket(fileno=os.dup(int(dbapi_connection.fileno())))
    except Exception:  # noqa: BLE001 - closed meanwhile (psycopg raises its own error), or no socket
        return False
    try:
        duplicate.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already ended
    finally:
        duplicate.close()
    return True


_watch: _Watch | None = None  # the process's; its events are registered once, on SQLAlchemy's classes
_registering = threading.Lock()


def watch() -> None:
    """Time every statement our engines send to PostgreSQL from now on (see the module): the events once, the limit
    as ``limit_s`` reads it now (a bad value: ``UsageError``, before the database is opened)."""
    global _watch
    limit = limit_s()
    with _registering:
        if _watch is not None:
            _watch.limit = limit
            return
        _watch = _Watch(limit)
        _register(_watch)


def _register(current: _Watch) -> None:
    def raw(conn: Any) -> Any:  # its DBAPI connection; None once invalidated (asking would try to reconnect)
        return None if conn.invalidated or conn.closed else conn.connection.dbapi_connection

    def sent(conn: Any, *_: Any) -> None:
        dbapi_connection = raw(conn)
        if dbapi_connection is None or not conn.get_execution_options().get(WATCHED):
            return
        # kept with the DBAPI connection for the pool's rollback of it, whose event has no engine; as messages show
        # it (``WatchedPool.watched_url``: SQLAlchemy's own hides only a user's password, not a ?password=)
        pool = conn.engine.pool
        shown = pool.watched_url if isinstance(pool, WatchedPool) else None
        conn.connection.info[WATCHED] = url = shown or conn.engine.url.render_as_string(hide_password=True)
        current.start(dbapi_connection, url)

    def answered(conn: Any, *_: Any) -> None:
        dbapi_connection = raw(conn)
        if dbapi_connection is not None:
            current.end(dbapi_connection, answered=True)

    def failed(context: Any) -> None:  # no answer: a cut's own error comes here
        dbapi_connection = raw(context.connection) if context.connection is not None else None
        if dbapi_connection is not None:
            current.end(dbapi_connection)

    def reset(dbapi_connection: Any, record: Any, reset_state: Any) -> None:  # the pool's rollback, handing it back
        url = getattr(record, "info", {}).get(WATCHED)
        if url is not None:
            current.start(dbapi_connection, url)

    for name in ("before_cursor_execute", "commit", "rollback"):
        event.listen(Engine, name, sent)
    event.listen(Engine, "after_cursor_execute", answered)
    event.listen(Engine, "handle_error", failed)
    event.listen(Pool, "reset", reset)
    # a connection handed back: its commit or rollback answered; one invalidated or closed is no longer watched (its
    # socket's number may soon be another connection's, and its id another object's)
    for name in ("checkin", "invalidate", "soft_invalidate", "close", "close_detached"):
        event.listen(Pool, name, lambda dbapi_connection, *_: current.end(dbapi_connection))


class WatchedPool(QueuePool):
    """The pool of our PostgreSQL engines (``database.engine_kwargs``, its ``watched_url`` the database as messages
    show it): SQLAlchemy's ``QueuePool``, each new connection timed (``watch``) from its start to its first checkout,
    the dialect's first queries on it among them."""

    # not keyword-only: create_engine hands a pool the arguments its signature names
    def __init__(self, creator: Any, watched_url: str | None = None, **kw: Any) -> None:
        super().__init__(creator, **kw)
        self.watched_url = watched_url
        if watched_url is not None:  # a pool recreated (``Engine.dispose``) takes these with its ``_dispatch``
            url = watched_url

            def connecting(dbapi_connection: Any, record: Any) -> None:
                if _watch is not None:
                    record.info[WATCHED] = url
                    _watch.start(dbapi_connection, url)

            event.listen(self, "connect", connecting, insert=True)
            event.listen(self, "checkout", _checked_out)

    def recreate(self) -> QueuePool:
        pool = super().recreate()  # its listeners come with its dispatch, the database as shown does not
        if isinstance(pool, WatchedPool):
            pool.watched_url = self.watched_url
        return pool


def _checked_out(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    if _watch is not None:
        _watch.end(dbapi_connection, answered=None)


def overdue() -> StorageError | None:
    """The one line for a statement this process's limit cut (``watch``), told once; None where none was cut."""
    if _watch is None or _watch.cut is None:
        return None
    url, _watch.cut = _watch.cut, None  # a later failure of the database is its own
    return StorageError(
        f"the database {url} did not answer within {_watch.limit:g} s (is its server hung, or the network dropping "
        f"its replies?): stopped; what was recorded before is kept. {LIMIT_VARIABLE}=SECONDS gives it longer")


def cut_line(error: Any) -> StorageError | None:
    """The limit's line (``overdue``) where the limit cut the connection SQLAlchemy's ``error`` came from: it ended
    (``connection_invalidated``), or the driver's error is none the server said (no SQLSTATE: psycopg's end of the
    stream where SQLAlchemy could not ask the connection, a dialect's first query on a raw cursor); else None."""
    orig = getattr(error, "orig", None)
    said = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return overdue() if getattr(error, "connection_invalidated", False) or not said else None


def lost(error: BaseException, shown_url: str) -> StorageError | None:
    """The one line for a verb whose database failed midway (``error``, or an exception in its chain, is SQLAlchemy's
    ``OperationalError`` or a connection's end), the database as messages show it (``shown_url``): the limit's
    line where this process's limit cut it (``overdue``); "lost" where the connection ended; else the driver's
    words (a lock not released in time, a disk full). None for any other error, SQLite's generic one among them
    (no such table, a syntax error): a bug of ours."""
    chain = list(error_chain(error))
    ended = next((e for e in chain if isinstance(e, DBAPIError) and e.connection_invalidated), None)
    seen = ended or next((e for e in chain if isinstance(e, OperationalError)), None)
    if seen is None or getattr(getattr(seen, "orig", None), "sqlite_errorcode", None) == _SQLITE_ERROR:
        return None
    cut = cut_line(seen)  # a cut ends the connection; an error the server said is its own
    if cut is not None:
        return cut
    said = one_line(str(getattr(seen, "orig", None) or seen))
    what = f"lost the database {shown_url}" if ended is not None else f"the database {shown_url} failed"
    return StorageError(f"{what} midway: {said}; what was recorded before is kept")
