"""One trial: a short, real training run of a workload in a fresh process tree.

- ``spec``: the contract between the search and a trial process (``TrialSpec``, ``TrialResult``, ``Status``,
  ``TrialSettings``);
- ``runner``: the parent side (``run_trial``): trial directory, time limit, pruning, classification of the outcome;
- ``child``: the trial process itself (``python -m autotune.trial.child SPEC.json``);
- ``training``: what a trial process and the measuring engine's arms share: the batches, the held-out loss, the
  loss schedule, what is in effect, a failure as a trial records it;
- ``launch``: a process's command, environment and CPUs as plain data, for trials and ``autotune run``;
- ``lifeline``, ``lock``, ``oom``: the process tree dies with its starter; one trial at a time on a host and who
  owns what a dead search left; out of memory, whichever library ran out;
- ``signals``: signal handlers set for a block and put back after it.

The paired measuring engine, which runs several arms in one worker process, is ``autotune.measure``.
"""
from __future__ import annotations

from .lock import host_lock
from .runner import loss_samples, remove_abandoned, run_trial
from .spec import OnWindow, Status, TrialResult, TrialSettings, TrialSpec

__all__ = [
    "OnWindow",
    "Status",
    "TrialResult",
    "TrialSettings",
    "TrialSpec",
    "host_lock",
    "loss_samples",
    "remove_abandoned",
    "run_trial",
]
