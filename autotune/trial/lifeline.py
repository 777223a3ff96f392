"""A started process tree never outlives the process that started it (Linux).

Two independent mechanisms, because either alone leaves processes behind when the search is killed
with ``kill -9`` (no Python code of the search runs then):

1. ``PR_SET_PDEATHSIG`` (prctl(2)), set between fork and exec: the kernel sends SIGKILL to the
   *direct* child when its parent dies. It is not inherited by the child's own children
   (DataLoader workers, inductor compile workers, torchrun ranks), and it fires when the *thread*
   that forked the child exits, so processes are started from the main thread only.
2. A watchdog process per started tree (``python -I lifeline.py PGID``), in a session of its own
   (so a Ctrl-C in the terminal does not reach it). Its stdin is the read end of a pipe whose only
   write end the starting process holds; the kernel closes that end however the starter dies, the
   watchdog reads end-of-file and SIGKILLs the tree's process group. Every descendant of the
   tree stays in that group unless it calls ``setsid``: none of PyTorch's do (DataLoader workers,
   ``torch._inductor`` compile workers, torchrun's ranks). A pipe rather than polling ``getppid``:
   no delay, no pid-reuse race, and nothing to poll while the trial is being measured.

``stop_tree`` closes the pipe itself once the tree is stopped, so the watchdog also sweeps what a
finished trial left in its group.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class Lifeline:
    """The watchdog of one process group and the write end of its pipe."""

    def __init__(self, pgid: int) -> None:
        read_end, self._write_end = os.pipe()  # both non-inheritable: no other child holds the write end
        try:
            self._watchdog = subprocess.Popen(
                [sys.executable, "-I", os.path.abspath(__file__), str(pgid)], stdin=read_end,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )
        finally:
            os.close(read_end)

    def release(self, timeout_s: float = 2.0) -> None:
        """Close the pipe: the watchdog kills what is left of the group and exits."""
        if self._write_end < 0:
            return
        os.close(self._write_end)
        self._write_end = -1
        try:
            self._watchdog.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._watchdog.kill()
            self._watchdog.wait()


def load_libc() -> ctypes.CDLL | None:
    """Load libc in the parent (never dlopen between fork and exec); None where prctl is missing."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def die_with_parent(libc: ctypes.CDLL | None, parent_pid: int) -> None:
    """In the child between fork and exec: SIGKILL me when my parent dies (and if it already has)."""
    if libc is None:
        return
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl: the signal will never come
        os._exit(1)


def _watch(pgid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while os.read(0, 4096):  # nothing is ever written: this returns b"" when the starter is gone
        pass
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already empty


if __name__ == "__main__":
    _watch(int(sys.argv[1]))
