"""The search: an Optuna study of real, short training runs, within a time budget.

Imports point one way: ``driver`` (the search: open the study, seed it, run the loop, confirm, choose the
recipe) uses ``seeds``, ``loop``, ``confirm`` and ``choice``; they use ``budget`` (the search's time, ``Budget``:
its one clock, and how it is spent), ``events`` (what the search tells its caller), ``records`` (what is stored in
the study, and how it is read back), ``oom_limits`` and ``options``.
``summaries`` reads stored studies for the CLI's views. Candidates are measured through ``autotune.measure``'s
``PairedMeasurer`` base class; nothing here imports the CLI.
"""
from __future__ import annotations

from .budget import Budget, parse_duration
from .choice import choose_recipe, how_measured
from .driver import run_settings, search, search_context
from .options import SearchOptions, check_options
from .outcome import SearchOutcome
from .script_mode import search_script

__all__ = [
    "Budget",
    "SearchOptions",
    "SearchOutcome",
    "check_options",
    "choose_recipe",
    "how_measured",
    "parse_duration",
    "run_settings",
    "search",
    "search_script",
    "search_context",
]
