"""Trial execution: one short, real training run of a workload in a fresh process tree.

- ``spec``: the contract between the search and a trial process (``TrialSpec``, ``TrialResult``,
  ``Status``, ``TrialSettings``) and the ``Measurer`` interface the search measures through;
- ``runner``: the parent side (``run_trial``, ``SubprocessMeasurer``): trial directory, time limit,
  pruning, classification of the outcome;
- ``child``: the trial process itself (``python -m autotune.trial.child SPEC.json``);
- ``launch``: a process's command, environment and CPUs as plain data, for trials and ``autotune run``;
- ``lifeline``, ``distributed``, ``lock``: the process tree dies with its starter; DDP plumbing;
  one trial at a time on a host and who owns what a dead search left.
"""
from __future__ import annotations

from .lock import host_lock
from .runner import SubprocessMeasurer, loss_samples, remove_abandoned, run_trial
from .spec import Measurer, OnWindow, Status, TrialResult, TrialSettings, TrialSpec

__all__ = [
    "Measurer",
    "OnWindow",
    "Status",
    "SubprocessMeasurer",
    "TrialResult",
    "TrialSettings",
    "TrialSpec",
    "host_lock",
    "loss_samples",
    "remove_abandoned",
    "run_trial",
]
