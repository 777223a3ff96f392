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

import errno
import fcntl
import logging
import math
import os
import signal
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import TrialError
from .signals import handled

log = logging.getLogger(__name__)


LOCK_NAME = "autotune-trials.lock"
NAME_HOLDER_AFTER_S = 60.0  # a wait this long names who holds the lock


@contextmanager
def host_lock(name_holder_after_s: float = NAME_HOLDER_AFTER_S, wait_s: float | None = None) -> Iterator[None]:
    """One trial at a time on this host: parallel trials would measure each other, a second user's too. The lock
    file in the shared temporary folder is opened without following a link (another user's link would have a
    root search create or lock a file of their choosing) and without waiting on a FIFO; a wait over
    ``name_holder_after_s`` names the holder's user and process id. ``wait_s``: ``LockBusy`` where it is not taken
    by then (a search's budget: another search stopped with Ctrl-Z holds it for as long as it is stopped)."""
    path = os.path.join(tempfile.gettempdir(), LOCK_NAME)
    descriptor = _open_lock(path)
    try:
        _acquire(descriptor, path, name_holder_after_s, wait_s)
        try:
            yield
        finally:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
    finally:
        os.close(descriptor)


def _open_lock(path: str) -> int:
    flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        descriptor = os.open(path, flags, 0o644)
    except OSError as e:
        what = "a symbolic link" if e.errno == errno.ELOOP else e.strerror
        raise TrialError(f"cannot open the host's trial lock {path} ({what}): remove it, or set TMPDIR to a folder "
                         "of your own") from e
    info = os.fstat(descriptor)
    if not stat.S_ISREG(info.st_mode):
        os.close(descriptor)
        raise TrialError(f"the host's trial lock {path} is not a regular file: remove it, or set TMPDIR to a folder "
                         "of your own")
    if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) != 0o644:
        os.fchmod(descriptor, 0o644)  # readable by the host's other users, whose searches take it too
    return descriptor


class LockBusy(TrialError):
    """The host's trial lock was not taken in the time given (``host_lock``'s ``wait_s``)."""


def _acquire(descriptor: int, path: str, name_holder_after_s: float, wait_s: float | None = None) -> None:
    """Take the lock, waiting in the kernel's queue (a waiter polling it was starved by a holder that took it back at
    once: two workers of one study, one of them measured every trial); a wait over ``name_holder_after_s`` is named
    once, from a timer, with who holds it."""
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        log.warning("another autotune trial runs on this host; waiting for it to end")
    started = time.monotonic()

    def name_holder() -> None:
        log.warning(f"still waiting after {time.monotonic() - started:.0f} s for the host's trial lock {path}, held by "
                    f"{lock_holder(descriptor)}")

    timer = threading.Timer(name_holder_after_s, name_holder)
    timer.daemon = True
    timer.start()
    try:
        _wait(descriptor, wait_s)
    except _Expired:  # also where the timer fired as the lock was taken: its descriptor's close releases it
        raise LockBusy(f"the host's trial lock {path} was not free within {wait_s or 0:.0f} s, held by "
                       f"{lock_holder(descriptor)}") from None
    finally:
        timer.cancel()


class _Expired(Exception):
    pass


def _wait(descriptor: int, wait_s: float | None) -> None:
    """Wait in the kernel's queue for the lock, at most ``wait_s`` where given: an interval timer's signal ends the
    wait (``_Expired``; on the main thread only, where Python takes signals: elsewhere it waits as long as it
    takes)."""
    def expired(signum: int, frame: Any) -> None:
        raise _Expired

    timed = wait_s is not None and math.isfinite(wait_s)
    with handled({signal.SIGALRM: expired} if timed else {}) as set_:
        if not (timed and set_):
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            return
        try:
            signal.setitimer(signal.ITIMER_REAL, max(0.01, wait_s or 0.0))
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)


def lock_holder(descriptor: int) -> str:
    """Who holds the lock on the open file ``descriptor``: ``user NAME, process PID`` from the kernel's table of
    locks (``/proc/locks``: ``ID: FLOCK ADVISORY WRITE PID MAJOR:MINOR:INODE ...``), or ``an unknown process``."""
    import psutil

    info = os.fstat(descriptor)
    device = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[1] != "->" and fields[5] == device and fields[4].isdigit():
            pid = int(fields[4])
            try:
                user = psutil.Process(pid).username()
            except (psutil.Error, KeyError):  # gone, or a uid with no name
                user = "?"
            return f"user {user}, process {pid}"
    return "an unknown process"


def host_id() -> str:
    """This machine, as far as one boot goes: host name and the kernel's boot id."""
    boot = Path("/proc/sys/kernel/random/boot_id")
    return f"{socket.gethostname()}/{boot.read_text().strip() if boot.exists() else '?'}"


def process_started(pid: int) -> float | None:
    """When process ``pid`` started (psutil's create time), or None when there is no such process."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, ValueError, OverflowError):  # a record's pid that no process can have
        return None


def owner(pid: int | None = None) -> dict[str, Any]:
    """The owner record of process ``pid`` (default: this one)."""
    pid = os.getpid() if pid is None else pid
    return {"host": host_id(), "pid": pid, "pid_started": process_started(pid)}


def owner_gone(record: Any) -> bool | None:
    """True when the owner named by ``record`` ran on this host and no longer runs; False while it runs;
    None when it cannot be told here (another host, no owner in the record, or a record no search writes: it is
    read from a shared study or a shared temporary folder)."""
    if not isinstance(record, Mapping) or record.get("host") != host_id():
        return None
    pid = record.get("pid")
    if type(pid) is not int or pid <= 0:
        return None
    # The same pid started at the very same time is the same process (or a reuse that cannot be told apart).
    return process_started(pid) != record.get("pid_started")


__all__ = ["LockBusy", "host_id", "host_lock", "lock_holder", "owner", "owner_gone", "process_started"]
