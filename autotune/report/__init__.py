"""The search as one self-contained HTML page (``autotune report``, and the end of ``autotune search``).

``collect`` reads a study as stored, read-only (no database is created), into plain data; ``render``
turns it into HTML with plotly's JavaScript inline once, so the file opens offline.

>>> path = write_report("sqlite:///studies.db", "tiny-v3-6df7a97e7c9c", "report.html")   # doctest: +SKIP
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ._data import MIN_IMPORTANCE_TRIALS, PAIRED, ReportData, Row, collect
from ._html import render, write

if TYPE_CHECKING:
    from ..probes import Facts


def write_report(url: str, study: str, path: str | Path, facts: Facts | None = None) -> Path:
    """Read ``study`` from the storage at ``url`` and write its report to ``path``."""
    return write(collect(url, study, facts), path)


__all__ = ["MIN_IMPORTANCE_TRIALS", "PAIRED", "ReportData", "Row", "collect", "render", "write", "write_report"]
