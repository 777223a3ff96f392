"""A started process tree never outlives the process that started it (Linux).

Two independent mechanisms, because either alone leaves processes behind when the search is killed
with ``kill -9`` (no Python code of the search runs then):

1. ``PR_SET_PDEATHSIG`` (prctl(2)), set between fork and exec: the kernel sends SIGKILL to the
   *direct* child when its parent dies. It is not inherited by the child's own children
   (DataLoader workers, inductor compile workers, torchrun ranks), and it fires when the *thread*
   that forked the child exits, so processes are started from the main thread only.
2. A watchdog process per started tree (``python -I lifeline.py PGID TOKEN``), in a session of its own
   (so a Ctrl-C in the terminal does not reach it). Its stdin is the read end of a pipe whose only
   write end the starting process holds; the kernel closes that end however the starter dies, the
   watchdog reads end-of-file and SIGKILLs the tree's process group, then every process whose
   environment carries the tree's token in ``AUTOTUNE_TREE``: descendants that left the group do
   (torchrun starts its ranks in sessions of their own, and once torchrun is dead they are no
   longer anyone's descendants), and a tree started inside the tree adds its own token to the list.
   A pipe rather than polling ``getppid``: no delay, no pid-reuse race, and nothing to poll while
   the trial is being measured.

``stop_tree`` closes the pipe itself once the tree is stopped, so the watchdog also sweeps what a
finished trial left behind.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import uuid

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
TREE = "AUTOTUNE_TREE"  # the tokens of the trees a process belongs to, space-separated, innermost last
SWEEPS = 5  # a process not yet killed may start another between a sweep's reading and its killing


class Lifeline:
    """The watchdog of one process group and the write end of its pipe."""

    def __init__(self, pgid: int, token: str) -> None:
        read_end, self._write_end = os.pipe()  # both non-inheritable: no other child holds the write end
        # The watchdog carries no tree's token: an outer tree's sweep must not end it before it sweeps its own.
        env = {k: v for k, v in os.environ.items() if k != TREE}
        try:
            self._watchdog = subprocess.Popen(
                [sys.executable, "-I", os.path.abspath(__file__), str(pgid), token], stdin=read_end,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env,
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


def new_token(env: dict[str, str]) -> str:
    """A fresh token for a tree about to start with ``env``, added to its ``AUTOTUNE_TREE`` (after the tokens of
    the trees the starter itself is in)."""
    token = uuid.uuid4().hex
    env[TREE] = f"{env.get(TREE, '')} {token}".strip()
    return token


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


def _watch(pgid: int, token: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while os.read(0, 4096):  # nothing is ever written: this returns b"" when the starter is gone
        pass
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already empty
    for _ in range(SWEEPS):
        if not _kill_carriers(token):
            break


def _kill_carriers(token: str) -> int:
    """SIGKILL every process whose environment lists ``token`` in ``AUTOTUNE_TREE``: how many were found."""
    prefix, wanted = f"{TREE}=".encode(), token.encode()
    found = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                environ = f.read()
        except OSError:  # gone, or another user's
            continue
        for entry in environ.split(b"\0"):
            if entry.startswith(prefix) and wanted in entry[len(prefix):].split():
                found += 1
                try:
                    os.kill(int(name), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                break
    return found


if __name__ == "__main__":
    _watch(int(sys.argv[1]), sys.argv[2])
