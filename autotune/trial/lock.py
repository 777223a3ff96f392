"""One trial at a time on this host (``host_lock``), and who owns what a process leaves on it, so that a
later process can tell whether its owner still runs.

A pid alone is not enough: pids are reused. An owner is ``{"host", "pid", "pid_started"}``: the host is
its name with the kernel's boot id (a reboot restarts pids), and the start time tells a reused pid
from the process that wrote the record. A study's RUNNING trials (``autotune.study.liveness.fail_orphans``) and
the trial runner's temporary directories (``autotune.trial.runner.remove_abandoned``) carry one.

>>> owner_gone(owner())
False
"""
from __future__ import annotations

import fcntl
import logging
import os
import socket
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@contextmanager
def host_lock() -> Iterator[None]:
    """One trial at a time on this host: parallel trials would measure each other."""
    path = os.path.join(tempfile.gettempdir(), "autotune-trials.lock")
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("another autotune trial runs on this host; waiting for it to end")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def host_id() -> str:
    """This machine, as far as one boot goes: host name and the kernel's boot id."""
    boot = Path("/proc/sys/kernel/random/boot_id")
    return f"{socket.gethostname()}/{boot.read_text().strip() if boot.exists() else '?'}"


def process_started(pid: int) -> float | None:
    """When process ``pid`` started (psutil's create time), or None when there is no such process."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None


def owner(pid: int | None = None) -> dict[str, Any]:
    """The owner record of process ``pid`` (default: this one)."""
    pid = os.getpid() if pid is None else pid
    return {"host": host_id(), "pid": pid, "pid_started": process_started(pid)}


def owner_gone(record: Mapping[str, Any]) -> bool | None:
    """True when the owner named by ``record`` ran on this host and no longer runs; False while it runs;
    None when it cannot be told here (another host, or no owner in the record)."""
    if record.get("host") != host_id() or "pid" not in record:
        return None
    # The same pid started at the very same time is the same process (or a reuse that cannot be told apart).
    return process_started(int(record["pid"])) != record.get("pid_started")


__all__ = ["host_id", "host_lock", "owner", "owner_gone", "process_started"]
