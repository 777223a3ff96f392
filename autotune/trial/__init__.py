"""Trial execution: one short, real training run of a workload in a fresh process tree.

- ``spec``: the contract between the search and a trial process (``TrialSpec``, ``TrialResult``,
  ``Status``, ``TrialSettings``) and the ``Measurer`` interface the search measures through;
- ``runner``: the parent side (``run_trial``, ``SubprocessMeasurer``): trial directory, time limit,
  pruning, classification of the outcome;
- ``child``: the trial process itself (``python -m autotune.trial.child SPEC.json``);
- ``launch``: a process's command, environment and CPUs as plain data, for trials and ``autotune run``;
- paired measurement, several arms trained alternately in one process: ``stats`` (the median of per-pair
  ratios with its exact interval, the verdict, calibration arithmetic), ``protocol`` (the worker's typed
  commands and replies), ``paired`` (arms and windows, inside the worker), ``worker`` (``python -m
  autotune.trial.worker SPEC.json`` and ``PairedWorker``, its parent's side); across processes:
  ``process_pair`` (``ProcessPair``: two live workers alternated, the idle one frozen by ``freeze``;
  ``across_processes``: over several process pairs, more where the machine is noisier); ``score``
  (``PairedScorer``: a candidate against the defaults, in one worker or across processes x in one);
- ``lifeline``, ``distributed``, ``lock``: the process tree dies with its starter; DDP plumbing;
  one trial at a time on a host and who owns what a dead search left.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .lock import host_lock
from .runner import SubprocessMeasurer, loss_samples, remove_abandoned, run_trial
from .spec import Measurer, OnWindow, Status, TrialResult, TrialSettings, TrialSpec
from .stats import Comparison, Interval, Verdict, compare, median_interval, verdict

if TYPE_CHECKING:
    from .process_pair import AcrossProcesses, ProcessPair, across_processes
    from .score import PairedScorer, Score
    from .worker import Calibration, PairedWorker, WorkerError

# The worker's names load on first use (PEP 562): ``worker`` brings the trial process's code (``child``, which
# needs ``autotune.apply``), and ``autotune.apply`` itself imports this package for ``distributed``.
_LAZY = {"Calibration": "worker", "PairedWorker": "worker", "WorkerError": "worker",
         "AcrossProcesses": "process_pair", "ProcessPair": "process_pair", "across_processes": "process_pair",
         "PairedScorer": "score", "Score": "score"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AcrossProcesses",
    "Calibration",
    "Comparison",
    "Interval",
    "Measurer",
    "OnWindow",
    "PairedScorer",
    "PairedWorker",
    "ProcessPair",
    "Score",
    "Status",
    "SubprocessMeasurer",
    "TrialResult",
    "TrialSettings",
    "TrialSpec",
    "Verdict",
    "WorkerError",
    "across_processes",
    "compare",
    "host_lock",
    "loss_samples",
    "median_interval",
    "remove_abandoned",
    "run_trial",
    "verdict",
]
