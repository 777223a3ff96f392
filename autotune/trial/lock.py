"""Who owns what a process leaves on this host, so that a later process can tell whether its owner still runs.

A pid alone is not enough: pids are reused. An owner is ``{"host", "pid", "pid_started"}``: the host is
its name with the kernel's boot id (a reboot restarts pids), and the start time tells a reused pid
from the process that wrote the record. A study's RUNNING trials (``_loop.fail_orphans``) and the trial
runner's temporary directories (``runner.remove_abandoned``) carry one.

>>> owner_gone(owner())
False
"""
from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any


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
