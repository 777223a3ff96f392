"""Opening a database by its URL, for the recipe store and Optuna's studies alike: the default (``studies.db`` here,
or ``$AUTOTUNE_STORAGE``), the checks made before anything is written, secrets masked wherever a URL is shown, the
drivers' errors as one line, SQLite's write-ahead log, read-only opening, the schema race of workers started
together, and a PostgreSQL connection's time limits (``engine_kwargs``)."""
from __future__ import annotations

import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, DBAPIError, OperationalError

from .errors import StorageError, UsageError, printable
from .statement_limit import WATCHED, WatchedPool, cut_line, watch

DEFAULT_STORAGE = "sqlite:///studies.db"
STORAGE_VARIABLE = "AUTOTUNE_STORAGE"  # a shared storage's URL kept off the command line (the process list shows it)


def default_storage() -> str:
    """The storage when none is given: ``$AUTOTUNE_STORAGE``, else ``studies.db`` in the working directory."""
    return os.environ.get(STORAGE_VARIABLE) or DEFAULT_STORAGE


T = TypeVar("T")


# Query and fragment parameters that hold a secret (libpq's password and sslpassword, a token, a secret key).
_SECRET_PARAMETER = re.compile(r"([?&;#][^=&;#]*(?:pass|secret|token)[^=&;#]*=)([^&;#]*)", re.IGNORECASE)


def _userinfo(url: str) -> tuple[str, str, str] | None:
    """``(before, password, after)`` of a URL whose authority holds ``user:password@``, with or without a scheme;
    the authority ends at the last ``@`` (a password may hold ``@``, ``/``, ``#`` unencoded). None: no password
    there (an SQLite path starts with ``/`` after the scheme)."""
    scheme, sep, rest = url.partition("://")
    head = scheme + sep if sep else ""
    rest = rest if sep else url
    if rest.startswith("/") or "@" not in rest:
        return None
    info, _, host = rest.rpartition("@")
    user, colon, password = info.partition(":")
    return (f"{head}{user}:", password, f"@{host}") if colon else None


def secrets_of(url: str) -> list[str]:
    """The secrets a storage URL holds as written and percent-decoded: its password and secret parameters."""
    from urllib.parse import unquote

    found = [m.group(2) for m in _SECRET_PARAMETER.finditer(url)]
    parts = _userinfo(url)
    found += [parts[1]] if parts else []
    return sorted({form for s in found if s for form in (s, unquote(s), unquote(s).replace("+", " "))}, key=len,
                  reverse=True)


def shown_url(url: str) -> str:
    """``url`` as messages, logs and reports show it, every secret masked so that it lands in no terminal, CI log
    or report: the password of ``user:password@`` (one holding ``@`` or ``/`` too, with or without a scheme), and
    a ``password=`` (or other secret) parameter.

    >>> shown_url("postgresql+psycopg://u:s3cr3t@host/db"), shown_url("sqlite:///studies.db")
    ('postgresql+psycopg://u:***@host/db', 'sqlite:///studies.db')
    >>> shown_url("u:p@x@h/db"), shown_url("postgresql://h/db?user=u&password=p")
    ('u:***@h/db', 'postgresql://h/db?user=u&password=***')
    """
    parts = _userinfo(url)
    shown = f"{parts[0]}***{parts[2]}" if parts else url
    return _SECRET_PARAMETER.sub(r"\1***", shown)


def hide_secrets(text: str, url: str) -> str:
    """``text`` (a driver's message, say) with every secret of ``url`` in it masked, and each part of one that a
    parser could have cut at ``@``, ``#``, ``/``, ``:`` or ``?`` (of 3 characters or more)."""
    for secret in secrets_of(url):
        for found in dict.fromkeys([secret, printable(secret)]):  # an error's message is cleaned when it is made
            for part in [found, *(p for p in re.split(r"[@#/:?]", found) if len(p) >= 3)]:
                text = text.replace(part, "***")
    return text


def bad_url(url: str) -> UsageError:
    """The one error for a storage URL SQLAlchemy cannot read or use, the URL shown masked."""
    return UsageError(f"bad storage URL {shown_url(url)!r}: use e.g. sqlite:///studies.db or postgresql+psycopg://…")


def check_storage_url(url: str) -> None:
    """Refuse a URL SQLAlchemy cannot read (a port that is no number), one whose password SQLAlchemy would cut
    short (an unencoded ``@``: the rest would be taken for the host and shown in the driver's errors), and an SQLite
    path that exists but is not an SQLite database (before anyone writes to it)."""
    from urllib.parse import unquote

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as e:
        raise bad_url(url) from e
    ours = _userinfo(url)
    if ours and parsed.password is not None and unquote(ours[1]) != parsed.password:
        raise UsageError(f"the password of storage URL {shown_url(url)!r} holds an unencoded '@', '/' or '?', which "
                         "ends it early: percent-encode them (%40, %2F, %3F), or keep it in ~/.pgpass")
    if not url.startswith("sqlite:///"):
        return
    path = Path(url.removeprefix("sqlite:///").partition("?")[0])
    if not path.exists():
        return
    if not path.is_file() and not path.is_dir():  # a FIFO would hang the reader until killed (a folder: below)
        raise StorageError(f"{path} exists but is not a regular file, so not an SQLite database: move it away or "
                           "pass --storage URL")
    unreadable = "Is a directory" if path.is_dir() else None if os.access(path, os.R_OK) else "Permission denied"
    if unreadable is not None:
        raise StorageError(f"{path} exists but cannot be read as an SQLite database ({unreadable}): move it away "
                           "or pass --storage URL")
    try:
        journal_mode(path)
    except sqlite3.OperationalError:
        pass  # busy, or a rollback journal to recover (no read-only connection can): the verb's own connection says
    except sqlite3.DatabaseError as e:  # "file is not a database"
        raise StorageError(f"{path} exists but is not an SQLite database: move it away or pass --storage URL") from e


def journal_mode(path: Path, timeout_s: float = 5.0) -> str:
    """The journal mode of the SQLite database at ``path`` (``wal``, ``delete``, ...), read through SQLite on a
    read-only connection; ``sqlite3.DatabaseError`` where it is no database. Never read with ``open()``: closing
    any descriptor of the file drops every POSIX lock this process holds on it, its SQLite connections' too, and
    another process that closes its last connection then takes the database for unused and deletes its
    write-ahead log, which this process's later commits still go to: they are lost (SQLite's "How To Corrupt",
    section 2.2). SQLite's own connections share their locks within the process."""
    connection = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True, timeout=timeout_s)
    try:
        return str(connection.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        connection.close()


# SQLSTATEs of a schema another worker created first: unique_violation (PostgreSQL's catalog of types),
# duplicate_table, duplicate_object, duplicate_column.
_SCHEMA_RACE = {"23505", "42P07", "42710", "42701"}


def create_schema(create: Callable[[], T], attempts: int = 5) -> T:
    """Run ``create`` (which creates tables if missing). Workers started together on an empty PostgreSQL
    database race to create the same tables; the losers get a duplicate-object error and retry once the
    schema is there."""
    for attempt in range(attempts):
        try:
            return create()
        except DBAPIError as e:
            if attempt == attempts - 1 or getattr(e.orig, "sqlstate", None) not in _SCHEMA_RACE:
                raise
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


@contextmanager
def storage_errors(url: str) -> Iterator[None]:
    """Opening a database (the recipe store's or Optuna's): SQLAlchemy's errors as one-line autotune errors."""
    try:
        yield
    except ArgumentError as e:
        raise bad_url(url) from e
    except (DatabaseError, OperationalError) as e:
        cut = cut_line(e)  # the limit cut it (``statement_limit``)
        raise cut or StorageError(f"cannot open the database {shown_url(url)}: {e.orig}") from e
    except ModuleNotFoundError as e:
        raise StorageError(
            f"no driver for {shown_url(url)}: pip install 'autotune[postgres]' ({e.name} missing)") from e


def use_wal(url: str) -> None:
    """Put an SQLite database in WAL mode (it stays so: the mode is recorded in the file). A search writes
    while ``autotune best``/``studies`` read: in WAL mode neither waits for the other, where SQLite's
    default rollback journal makes a reader holding its snapshot stall the search's commits (and fail it
    with "database is locked"). Other databases, and SQLite in memory or as a URI, are left as they are.

    A read-only reader of a WAL database that no writer has open leaves its ``-wal``/``-shm`` files
    behind (it may not check the log back in): empty, and reused by the next writer."""
    parsed = make_url(url)
    path = parsed.database
    if parsed.get_backend_name() != "sqlite" or not path or path == ":memory:" or path.startswith("file:"):
        return
    try:
        try:
            if Path(path).is_file() and journal_mode(Path(path)) == "wal":
                return  # already so: nothing to write, and no wait for a writer's transaction
        except sqlite3.OperationalError:
            pass  # busy, or a rollback journal to recover: the connection below waits, or recovers it
        connection = sqlite3.connect(path, timeout=30)  # waits for a writer's transaction to end
        try:
            connection.execute("PRAGMA journal_mode=WAL")
        finally:
            connection.close()
    except sqlite3.Error as e:
        raise StorageError(f"cannot open the database {shown_url(url)}: {e}") from e


def readonly_connect(url: str) -> Callable[[], sqlite3.Connection] | None:
    """How to open ``url`` so that nothing can be created: an SQLite file is opened with ``mode=ro`` (a
    missing one is an error, not a new empty database); None for other databases (only read from, their
    schema left as found), an in-memory database or an SQLite URI the user wrote (opened as written)."""
    parsed = make_url(url)
    path = parsed.database
    if parsed.get_backend_name() != "sqlite" or not path or path == ":memory:" or path.startswith("file:"):
        return None
    if not Path(path).is_file():
        where = f"{path} here" if Path(path).parent == Path(".") else f"database {path}"
        raise UsageError(f"no {where}: run 'autotune search' first")
    uri = f"file:{quote(str(Path(path).resolve()))}?mode=ro"
    return lambda: sqlite3.connect(uri, uri=True)


# A host that does not answer, or something on its port that accepts and says nothing: psycopg's own default waits
# 130 s (psycopg2's libpq, for ever), again for each address of the host, past a short budget.
CONNECT_TIMEOUT_S = 10
# A server's machine or network gone mid-search: the kernel's probes end an idle connection in about a minute (its
# default: two hours), and data unacknowledged for a minute ends one that is sending (the default: about 15 minutes).
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}
UNACKNOWLEDGED_MS = 60_000  # libpq's tcp_user_timeout, from libpq 12 (an older one refuses to connect with it)
LIBPQ_DRIVERS = ("psycopg", "psycopg2", "psycopg2cffi")


def engine_kwargs(url: str, readonly: bool = False) -> dict[str, Any]:
    """SQLAlchemy's engine arguments for ``url``: ``readonly``, an SQLite file's connection as ``readonly_connect``
    opens it; for a PostgreSQL driver built on libpq, a connect timeout (``CONNECT_TIMEOUT_S``) and TCP limits
    (``KEEPALIVES``), each where neither the URL nor libpq's variable (``PGCONNECT_TIMEOUT``) sets its own, and its
    statements' time limited (``statement_limit``: the engine marked, its pool's new connections timed, the watch
    started); nothing for other databases.

    >>> engine_kwargs("postgresql+psycopg://h/db?connect_timeout=3&keepalives=0&tcp_user_timeout=0")["connect_args"]
    {'keepalives_idle': 30, 'keepalives_interval': 10, 'keepalives_count': 3}
    >>> engine_kwargs("sqlite:///studies.db")
    {}
    """
    connect = readonly_connect(url) if readonly else None
    if connect is not None:
        return {"creator": connect}
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql" or parsed.get_driver_name() not in LIBPQ_DRIVERS:
        return {}
    watch()
    # its statements get a limit (``statement_limit``), and so do its new connections' first queries
    marked = {"execution_options": {WATCHED: True}, "poolclass": WatchedPool,
              "watched_url": shown_url(parsed.render_as_string(hide_password=True))}  # a ?password= too
    ours: dict[str, Any] = {} if os.environ.get("PGCONNECT_TIMEOUT") else {"connect_timeout": CONNECT_TIMEOUT_S}
    if _libpq_version(parsed.get_driver_name()) >= 120000:
        ours["tcp_user_timeout"] = UNACKNOWLEDGED_MS
    return {**marked, "connect_args": {k: v for k, v in {**ours, **KEEPALIVES}.items() if k not in parsed.query}}


def _libpq_version(driver: str) -> int:
    """The version of the libpq ``driver`` runs on (170004: 17.4), 0 where it cannot be told (not installed)."""
    try:
        if driver == "psycopg":
            import psycopg
            return int(psycopg.pq.version())
        import psycopg2.extensions  # type: ignore[import-untyped]
        return int(psycopg2.extensions.libpq_version())
    except (ImportError, AttributeError):
        return 0


def open_engine(url: str, readonly: bool = False) -> Engine:
    """SQLAlchemy's engine for ``url`` (``engine_kwargs``)."""
    return create_engine(url, **engine_kwargs(url, readonly))
