"""Freezing a process tree: SIGSTOP while another process is timed, SIGCONT before its own turn.

Two processes compared across processes run alternately on the same cores. The idle one must not run at
all: its OpenMP threads spin-wait after each parallel region (GOMP_SPINCOUNT, KMP_BLOCKTIME) and its
DataLoader workers prefetch, which would take CPU from the one being timed. SIGSTOP cannot be caught or
ignored and stops every thread of a process (signal(7)); the whole tree is stopped, the process group at
once (``killpg``: nothing can fork in between) and then every descendant that left it.

A paired worker stops its idle arms' DataLoader workers itself (``autotune.measure.worker.arms``); those were
stopped before the freeze and stay stopped after the thaw, so the worker's own bookkeeping still holds.

    >>> frozen = freeze(pid)        # doctest: +SKIP
    >>> thaw(frozen)                # doctest: +SKIP
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass


def proc_state(pid: int) -> str:
    """The state letter of /proc/PID/stat (proc(5): ``R`` running, ``S`` sleeping, ``T`` stopped), ``?`` if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return "?"
    return text[text.rindex(")") + 2]  # the command name in parentheses may hold spaces


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (empty when it is gone)."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [pid, *(child.pid for child in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def cpu_ticks(pid: int) -> int:
    """User + system CPU time of the process and all its threads so far, in clock ticks (proc(5): fields 14
    and 15 of /proc/PID/stat count every thread of the process); -1 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return -1
    return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15, counted from the state (3)


@dataclass(frozen=True)
class Frozen:
    """A stopped tree: its root, and the processes that were already stopped before (left so by ``thaw``)."""

    pid: int
    stopped_before: frozenset[int]


def freeze(pid: int) -> Frozen:
    """Stop the process ``pid`` (the leader of its own process group) and all its descendants."""
    before = frozenset(p for p in tree(pid) if proc_state(p) == "T")
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGSTOP)
    for p in tree(pid):  # descendants that left the group (setsid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGSTOP)
    wait_stopped(tree(pid))
    return Frozen(pid, before)


def wait_stopped(pids: Sequence[int], timeout_s: float = 2.0) -> None:
    """Wait until every thread of ``pids`` is stopped: a signal is delivered when its target next runs, which
    on busy cores can be milliseconds later, and the other process's window must not start before."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(state in ("T", "t", "?", "Z", "X") for p in pids for state in thread_states(p)):
            return
        time.sleep(0.001)


def thread_states(pid: int) -> list[str]:
    """The state letter of every thread of ``pid`` (empty when it is gone)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    states = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                text = f.read()
        except OSError:
            continue
        states.append(text[text.rindex(")") + 2])
    return states


def thaw(frozen: Frozen) -> None:
    """Continue what ``freeze`` stopped; what was stopped before stays stopped."""
    for p in tree(frozen.pid):
        if p not in frozen.stopped_before:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)


class Freezable:
    """A holder of a started process tree (``proc``) that is frozen while another process is timed: a paired
    worker, a live copy of a user's script. ``frozen`` is set while its tree is stopped."""

    proc: subprocess.Popen[bytes] | None
    frozen: Frozen | None

    def freeze(self) -> None:
        """Stop its whole tree (SIGSTOP) while another process is timed; ``thaw()`` before it runs again."""
        if self.proc is not None and self.frozen is None and self.proc.poll() is None:
            self.frozen = freeze(self.proc.pid)

    def thaw(self) -> None:
        if self.frozen is not None:
            thaw(self.frozen)
            self.frozen = None
