"""The recipe store: a ``recipes`` table (SQLAlchemy) in the same database as the Optuna studies.

Any SQLAlchemy URL works (``sqlite:///studies.db`` by default, ``postgresql+psycopg://…`` for several
machines). A file that is not a database is reported, never overwritten. The verbs that only read
(``best``, ``export``, ``run``, ``apply(recipe_id)``) open it read-only: they create no file and no table.
"""
from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from sqlalchemy import (
    JSON,
    DateTime,
    Engine,
    Float,
    Integer,
    String,
    create_engine,
    inspect,
    make_url,
    select,
    text,
)
from sqlalchemy.exc import ArgumentError, DatabaseError, DBAPIError, OperationalError
from sqlalchemy.orm import DeclarativeBase, InstrumentedAttribute, Mapped, Session, defer, mapped_column

from .errors import StorageError, UsageError, printable
from .recipe import Recipe

DEFAULT_STORAGE = "sqlite:///studies.db"
STORAGE_VARIABLE = "AUTOTUNE_STORAGE"  # a shared storage's URL kept off the command line (the process list shows it)


def default_storage() -> str:
    """The storage when none is given: ``$AUTOTUNE_STORAGE``, else ``studies.db`` in the working directory."""
    return os.environ.get(STORAGE_VARIABLE) or DEFAULT_STORAGE


T = TypeVar("T")


class _Base(DeclarativeBase):
    pass


class _RecipeRow(_Base):
    __tablename__ = "recipes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study: Mapped[str | None] = mapped_column(String(512), index=True)
    workload: Mapped[str] = mapped_column(String(1024), index=True)
    fingerprint: Mapped[str | None] = mapped_column(String(64), index=True)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    samples_per_s: Mapped[float | None] = mapped_column(Float)
    baseline_samples_per_s: Mapped[float | None] = mapped_column(Float)
    speedup: Mapped[float | None] = mapped_column(Float)
    loss: Mapped[float | None] = mapped_column(Float)
    baseline_loss: Mapped[float | None] = mapped_column(Float)
    notes: Mapped[list[str]] = mapped_column(JSON, default=list)
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # Recipe fields added after the table's first version (the speedup's interval, peak memory, ...): one JSON
    # column, so a new field needs no schema change. Added to older tables when a search opens them.
    details: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


_COLUMNS = {"study", "workload", "fingerprint", "params", "samples_per_s", "baseline_samples_per_s", "speedup", "loss",
            "baseline_loss", "notes", "created", "id"}
# Recipe fields kept in ``details``: every field that has no column of its own (``source`` is where a copy was read)
_DETAILS = tuple(f.name for f in fields(Recipe) if f.name not in _COLUMNS | {"source"})


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
        raise StorageError(f"cannot open the database {shown_url(url)}: {e.orig}") from e
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


def _readonly_engine(url: str) -> Engine:
    connect = readonly_connect(url)
    return create_engine(url) if connect is None else create_engine(url, creator=connect)


class RecipeStore:
    """Save and look up recipes. Use as a context manager: ``with RecipeStore.open(url) as store``."""

    def __init__(self, engine: Engine, *, has_table: bool = True, has_details: bool = True) -> None:
        self._engine = engine
        self._has_table = has_table  # False: a read-only store of a database no search has written to
        self._has_details = has_details  # False: a read-only store of a table older than the details column

    @classmethod
    def open(cls, url: str = DEFAULT_STORAGE, *, readonly: bool = False) -> RecipeStore:
        """The store in the database at ``url``, its table created unless ``readonly``: then nothing is
        written, a missing SQLite file raises ``UsageError``, and a database without recipes has none."""
        check_storage_url(url)
        with storage_errors(url):
            if readonly:
                engine = _readonly_engine(url)
                columns = _columns(engine)
                return cls(engine, has_table=columns is not None, has_details="details" in (columns or ()))
            use_wal(url)
            engine = create_engine(url)
            create_schema(lambda: _create_or_upgrade(engine))
        return cls(engine)

    def __enter__(self) -> RecipeStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self._engine.dispose()

    def save(self, recipe: Recipe) -> Recipe:
        """Store a recipe; returns it with its id and creation time."""
        row = _RecipeRow(
            study=recipe.study, workload=recipe.workload, fingerprint=recipe.fingerprint,
            params=json.loads(json.dumps(recipe.params)), samples_per_s=recipe.samples_per_s,
            baseline_samples_per_s=recipe.baseline_samples_per_s, speedup=recipe.speedup, loss=recipe.loss,
            baseline_loss=recipe.baseline_loss, notes=list(recipe.notes), created=datetime.now(timezone.utc),
            details=json.loads(json.dumps({k: getattr(recipe, k) for k in _DETAILS if getattr(recipe, k) is not None})),
        )
        with Session(self._engine) as session, session.begin():
            session.add(row)
            session.flush()
            return _to_recipe(row)

    def get(self, recipe_id: int) -> Recipe:
        if not 1 <= recipe_id < 2**63:  # no row has it, and SQLite cannot even be asked (OverflowError)
            raise UsageError(f"no recipe {recipe_id} in this database: 'autotune best' lists the latest")
        with Session(self._engine) as session:
            row = session.get(_RecipeRow, recipe_id, options=self._options()) if self._has_table else None
            if row is None:
                raise UsageError(f"no recipe {recipe_id} in this database: 'autotune best' lists the latest")
            return _to_recipe(row)

    def latest(
        self, *, workload: str | None = None, fingerprint: str | None = None, study: str | None = None
    ) -> Recipe | None:
        """The newest recipe matching every filter given, or None."""
        if not self._has_table:
            return None
        query = select(_RecipeRow).options(*self._options()).order_by(_RecipeRow.id.desc()).limit(1)
        filters = ((_RecipeRow.workload, workload), (_RecipeRow.fingerprint, fingerprint), (_RecipeRow.study, study))
        for column, value in filters:
            if value is not None:
                query = query.where(column == value)
        with Session(self._engine) as session:
            row = session.scalars(query).first()
            return _to_recipe(row) if row else None

    def all(self) -> list[Recipe]:
        """Every stored recipe, newest first."""
        if not self._has_table:
            return []
        with Session(self._engine) as session:
            query = select(_RecipeRow).options(*self._options()).order_by(_RecipeRow.id.desc())
            return [_to_recipe(row) for row in session.scalars(query)]

    def _options(self) -> list[Any]:
        """Query options: a table older than the details column is read without it (read-only: not upgraded)."""
        return [] if self._has_details else [defer(_RecipeRow.details, raiseload=True)]

    def studies(self) -> list[str]:
        """The studies that have a recipe, sorted."""
        return self._distinct(_RecipeRow.study)

    def workloads(self) -> list[str]:
        """The workload specs that have a recipe, sorted."""
        return self._distinct(_RecipeRow.workload)

    def _distinct(self, column: InstrumentedAttribute[str] | InstrumentedAttribute[str | None]) -> list[str]:
        if not self._has_table:
            return []
        with Session(self._engine) as session:
            return sorted(v for v in session.scalars(select(column).distinct()) if v is not None)


def _columns(engine: Engine) -> set[str] | None:
    """The recipes table's column names, or None when there is no such table."""
    inspector = inspect(engine)
    if not inspector.has_table(_RecipeRow.__tablename__):
        return None
    return {c["name"] for c in inspector.get_columns(_RecipeRow.__tablename__)}


def _create_or_upgrade(engine: Engine) -> None:
    """Create the table, or add the columns a table written by an older autotune lacks (its rows kept)."""
    _Base.metadata.create_all(engine)
    if "details" not in (_columns(engine) or {"details"}):
        with engine.begin() as connection:
            connection.execute(text(f"ALTER TABLE {_RecipeRow.__tablename__} ADD COLUMN details JSON"))


def _to_recipe(row: _RecipeRow) -> Recipe:
    details = {k: v for k, v in (row.__dict__.get("details") or {}).items() if k in _DETAILS}
    return Recipe(
        params=dict(row.params), workload=row.workload, fingerprint=row.fingerprint, study=row.study,
        samples_per_s=row.samples_per_s, baseline_samples_per_s=row.baseline_samples_per_s, speedup=row.speedup,
        loss=row.loss, baseline_loss=row.baseline_loss, id=row.id,
        created=_utc(row.created).isoformat() if row.created else None, notes=list(row.notes or []), **details,
    )


def _utc(moment: datetime) -> datetime:
    """A stored creation time with its time zone: SQLite keeps no zone, and ``save`` writes UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)
