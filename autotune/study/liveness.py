"""Who is alive: a trial's heartbeat while it is measured, and the trials a dead search left RUNNING.

Every trial records the host and search process that runs it, so a search killed with ``kill -9`` leaves a
RUNNING trial that the next search on the same host fails at once (``fail_orphans``); other hosts' workers fail
it when its heartbeat is older than the storage's grace period.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..trial.lock import owner, owner_gone
from ..trial.spec import Status
from .records import Attr, optuna_storage, trial_id

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)

HEARTBEAT_S = 5.0  # as the storage's heartbeat_interval (``driver.rdb_storage``)


def fail_orphans(study: optuna.Study) -> list[int]:
    """Fail the RUNNING trials whose search process, on this host, is gone; returns their numbers."""
    import optuna

    failed = []
    storage, _ = optuna_storage(study)
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        attrs = t.user_attrs
        if not owner_gone(attrs):
            continue  # its search still runs, or ran on another host (whose workers fail it by heartbeat)
        try:
            storage.set_trial_user_attr(trial_id(t), Attr.STATUS, Status.INTERRUPTED.value)
            storage.set_trial_user_attr(
                trial_id(t), Attr.ERROR, f"its search (pid {attrs['pid']}) died during the trial"
            )
            storage.set_trial_state_values(trial_id(t), state=optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another worker got there first
        failed.append(t.number)
        log.warning("trial %d was left running by a search that died; recorded as failed", t.number)
    return failed


@contextlib.contextmanager
def heartbeat(study: optuna.Study, trial: optuna.Trial, every_s: float = HEARTBEAT_S) -> Iterator[None]:
    """Record the trial's heartbeat every ``every_s`` while it is measured (a measurement call may take
    longer than the storage's grace period), as ``Study.optimize`` does in a thread of its own."""
    storage, _ = optuna_storage(study)
    if not hasattr(storage, "record_heartbeat"):
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while True:
            with contextlib.suppress(Exception):  # a storage hiccup: the next beat tries again
                storage.record_heartbeat(trial_id(trial))
            if stop.wait(every_s):
                return

    thread = threading.Thread(target=beat, name=f"heartbeat-{trial.number}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def claim(trial: optuna.Trial, role: str, params: dict[str, Any]) -> None:
    """Record who runs the trial, so a search that dies leaves a trial the next one can fail."""
    trial.set_user_attr(Attr.ROLE, role)
    trial.set_user_attr(Attr.PARAMS, params)
    for key, value in owner().items():  # host, pid, pid_started: read back by ``owner_gone``
        trial.set_user_attr(key, value)
