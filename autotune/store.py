"""The recipe store: a ``recipes`` table (SQLAlchemy) in the same database as the Optuna studies.

Any SQLAlchemy URL works (``sqlite:///studies.db`` by default, ``postgresql+psycopg://…`` for several
machines), opened as ``autotune.database`` opens a database. A file that is not a database is reported, never
overwritten. The verbs that only read (``best``, ``export``, ``run``, ``apply(recipe_id)``) open it read-only: they
create no file and no table.
"""
from __future__ import annotations

import json
from dataclasses import fields
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, DateTime, Engine, Float, Integer, String, inspect, select, text
from sqlalchemy.orm import DeclarativeBase, InstrumentedAttribute, Mapped, Session, defer, mapped_column

from .database import DEFAULT_STORAGE, check_storage_url, create_schema, open_engine, storage_errors, use_wal
from .errors import UsageError
from .recipe import Recipe


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
                engine = open_engine(url, readonly=True)
                columns = _columns(engine)
                return cls(engine, has_table=columns is not None, has_details="details" in (columns or ()))
            use_wal(url)
            engine = open_engine(url)
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
