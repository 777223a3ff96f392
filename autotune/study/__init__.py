"""The search: an Optuna study of real, short training runs, within a time budget.

Imports point one way: ``run`` (the search) uses ``seeds``, ``loop``, ``confirm`` and ``report``;
they use ``budget``, ``events`` and ``records`` (what is stored in the study, and how it is read
back), ``options``, and ``significance`` (the noise rule). The trials themselves are measured
through ``autotune.trial``'s ``Measurer``; nothing here imports the CLI.

The functions ``confirm.confirm``, ``records.records`` and ``seeds.seeds`` are not re-exported here:
a package attribute named like its submodule would hide the module.
"""
from __future__ import annotations

from .budget import parse_duration
from .events import Event, Progress, SearchDone, SearchStarted, TrialFinished, TrialStarted
from .loop import SearchLoop, fail_orphans
from .options import SearchOptions, check_options
from .records import (
    CONSTRAINTS,
    MEASURED,
    Attr,
    Candidate,
    Confirmation,
    Role,
    SearchOutcome,
    StudyAttr,
    TrialRecord,
    params_key,
)
from .report import choose_recipe
from .run import open_study, rdb_storage, run_settings, search, search_context
from .seeds import enqueue_next_seed, warm_start
from .significance import MIN_NOISE, beats, noise

__all__ = [
    "CONSTRAINTS",
    "MEASURED",
    "MIN_NOISE",
    "Attr",
    "Candidate",
    "Confirmation",
    "Event",
    "Progress",
    "Role",
    "SearchDone",
    "SearchLoop",
    "SearchOptions",
    "SearchOutcome",
    "SearchStarted",
    "StudyAttr",
    "TrialFinished",
    "TrialRecord",
    "TrialStarted",
    "beats",
    "check_options",
    "choose_recipe",
    "enqueue_next_seed",
    "fail_orphans",
    "noise",
    "open_study",
    "params_key",
    "parse_duration",
    "rdb_storage",
    "run_settings",
    "search",
    "search_context",
    "warm_start",
]
