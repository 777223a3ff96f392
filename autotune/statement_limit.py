"""A database that stops answering: a client-side limit on each statement of a networked storage.

A PostgreSQL server can hang while its machine's kernel still acknowledges every packet (a stopped or wedged server
process, a storage stall under it): TCP's keepalives and libpq's ``tcp_user_timeout`` (``database.engine_kwargs``)
see a live peer, the server's own ``statement_timeout`` never fires, and libpq waits for its reply for ever, with the
search's budget and its workers held. So each statement, commit and rollback this process sends to a database over a
socket is timed from the outside (SQLAlchemy's engine and pool events): one that has not answered within the limit
(``limit_s``: ``AUTOTUNE_DB_TIMEOUT_S``, else ``LIMIT_S``) has its connection's socket shut down, the driver raises
its disconnection error, and ``lost`` makes that one line naming the database and the limit. SQLite's files are not
watched: a lock held elsewhere is SQLite's own busy timeout.

The watch is the process's own (``watch()``, once), its events on SQLAlchemy's classes: Optuna's ``RDBStorage``
creates its engine and tables inside its constructor, where no event on the engine would reach. Only our engines are
timed, marked by their execution option (``WATCHED``, set by ``database.engine_kwargs``): an engine of the user's own
in the same process (``autotune.apply()`` runs inside their training) keeps its statements unlimited.
"""
from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from .errors import StorageError, UsageError, one_line

log = logging.getLogger(__name__)

WATCHED = "autotune_statement_limit"  # the execution option that marks our engines (``database.engine_kwargs``)
LIMIT_S = 30.0  # a statement on a loopback or LAN server takes milliseconds; a study's whole history seconds
LIMIT_VARIABLE = "AUTOTUNE_DB_TIMEOUT_S"


def limit_s() -> float:
    """The limit a statement is given: ``$AUTOTUNE_DB_TIMEOUT_S`` (seconds, a positive number), else ``LIMIT_S``."""
    given = os.environ.get(LIMIT_VARIABLE)
    if given is None or not given.strip():
        return LIMIT_S
    try:
        value = float(given)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"{LIMIT_VARIABLE}={given!r} is not a positive number of seconds")
    return value


@dataclass
class _Busy:
    since: float  # time.monotonic() when the statement, commit or rollback was sent
    fileno: int  # the connection's socket
    url: str  # the database, as messages show it


class _Watch:
    """The statements in flight on sockets (by their DBAPI connection's id), and the thread that cuts the overdue."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.lock = threading.Lock()
        self.busy: dict[int, _Busy] = {}
        self.cut: list[str] = []  # the databases whose connection was cut, in order
        self.thread: threading.Thread | None = None

    def start(self, dbapi_connection: Any, url: str) -> None:
        try:
            fileno = int(dbapi_connection.fileno())
        except Exception:  # noqa: BLE001 - no socket to cut (SQLite, a closed or foreign connection): not watched
            return
        with self.lock:
            self.busy[id(dbapi_connection)] = _Busy(time.monotonic(), fileno, url)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="autotune-statement-limit", daemon=True)
                self.thread.start()

    def end(self, dbapi_connection: Any) -> None:
        with self.lock:
            self.busy.pop(id(dbapi_connection), None)

    def _run(self) -> None:
        while True:
            time.sleep(min(1.0, self.limit / 4))
            now = time.monotonic()
            with self.lock:
                overdue = [(key, busy) for key, busy in self.busy.items() if now - busy.since > self.limit]
                for key, busy in overdue:
                    del self.busy[key]
                    self.cut.append(busy.url)
            for _, busy in overdue:
                _shut_down(busy.fileno)
                log.debug("no answer from %s in %.0f s: its connection shut down", busy.url, self.limit)


def _shut_down(fileno: int) -> None:
    """End the TCP connection under ``fileno`` without closing the driver's descriptor (a duplicate is shut down and
    closed): the driver's wait sees the end of its stream and raises its own disconnection error."""
    try:
        duplicate = socket.socket(fileno=os.dup(fileno))
    except OSError:
        return
    try:
        duplicate.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already ended
    finally:
        duplicate.close()


_watch: _Watch | None = None  # the process's; its events are registered once, on SQLAlchemy's classes


def watch() -> None:
    """Time every statement this process sends to a database over a socket from now on (see the module): the events
    once, the limit as ``limit_s`` reads it now (a bad value: ``UsageError``, before the database is opened)."""
    global _watch
    if _watch is not None:
        _watch.limit = limit_s()
        return
    from sqlalchemy import Engine, event
    from sqlalchemy.pool import Pool

    _watch = current = _Watch(limit_s())
    urls: dict[int, str] = {}  # each watched connection's database, for the pool's rollback of it, which has no URL

    def raw(conn: Any) -> Any:  # its DBAPI connection; None once invalidated (asking would try to reconnect)
        return None if conn.invalidated or conn.closed else conn.connection.dbapi_connection

    def sent(conn: Any, *_: Any) -> None:
        dbapi_connection = raw(conn)
        if dbapi_connection is None or not conn.get_execution_options().get(WATCHED):
            return
        urls[id(dbapi_connection)] = url = conn.engine.url.render_as_string(hide_password=True)
        current.start(dbapi_connection, url)

    def answered(conn: Any, *_: Any) -> None:
        dbapi_connection = raw(conn)
        if dbapi_connection is not None:
            current.end(dbapi_connection)

    def failed(context: Any) -> None:
        if context.connection is not None:
            answered(context.connection)

    def reset(dbapi_connection: Any, *_: Any) -> None:  # the pool's rollback of a connection handed back
        if id(dbapi_connection) in urls:
            current.start(dbapi_connection, urls[id(dbapi_connection)])

    for name in ("before_cursor_execute", "commit", "rollback"):
        event.listen(Engine, name, sent)
    event.listen(Engine, "after_cursor_execute", answered)
    event.listen(Engine, "handle_error", failed)
    event.listen(Pool, "reset", reset)
    # a connection handed back: its commit or rollback answered; one invalidated or closed is no longer watched (its
    # socket's number may soon be another connection's, and its id another object's)
    event.listen(Pool, "checkin", lambda dbapi_connection, record: current.end(dbapi_connection))

    def gone(dbapi_connection: Any, *_: Any) -> None:
        current.end(dbapi_connection)
        urls.pop(id(dbapi_connection), None)

    for name in ("invalidate", "soft_invalidate", "close", "close_detached"):
        event.listen(Pool, name, gone)


def lost(error: BaseException, shown_url: str) -> StorageError | None:
    """The one line for a verb that lost its database midway (``error``, or an exception in its chain, is a driver's
    error of a connection that ended or could not be made: SQLAlchemy's ``OperationalError``), the database as
    messages show it (``shown_url``): where this process's limit cut it, what the limit was and how to raise it;
    else the driver's own words. None for any other error."""
    from sqlalchemy.exc import DBAPIError, OperationalError

    chain: list[BaseException] = []
    link: BaseException | None = error
    while link is not None and link not in chain:  # its causes, each once
        chain.append(link)
        link = link.__cause__ or link.__context__
    seen = next((e for e in chain if isinstance(e, OperationalError)
                 or isinstance(e, DBAPIError) and e.connection_invalidated), None)
    if seen is None:
        return None
    if _watch is not None and _watch.cut:
        _watch.cut.clear()  # told once: a later loss of the database is its own
        return StorageError(
            f"the database {shown_url} did not answer within {_watch.limit:g} s (is its server hung, or the "
            f"network dropping its replies?): stopped; what was recorded before is kept. {LIMIT_VARIABLE}=SECONDS "
            "gives it longer")
    orig = getattr(seen, "orig", None) or seen
    return StorageError(f"lost the database {shown_url} midway: {one_line(str(orig))}; what was recorded before is "
                        "kept")
