"""A started tree never outlives its starter, descendants that left its process group included: torchrun starts
each rank in a session of its own, and once torchrun is dead the rank is no one's descendant."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from autotune.trial import launch

# A middle process (torchrun's part) that starts a grandchild in a new session (a rank's), writes its pid, then
# sleeps or exits as argv[2] says.
MIDDLE = ("import subprocess, sys, time; "
          "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True); "
          "open(sys.argv[1], 'w').write(str(p.pid)); sys.argv[2] == 'sleep' and time.sleep(600)")


def _plan(pid_file: Path, then: str) -> launch.LaunchPlan:
    return launch.LaunchPlan([sys.executable, "-c", MIDDLE, str(pid_file), then], dict(os.environ), None)


def _pid(pid_file: Path) -> int:
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the middle process did not start its grandchild in 30 s"
        time.sleep(0.05)
    return int(pid_file.read_text())


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_grandchild_in_its_own_session_dies_with_a_starter_killed_by_sigkill(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild"
    starter_code = ("import sys; from autotune.trial import launch; "
                    f"launch.start(launch.LaunchPlan({[sys.executable, '-c', MIDDLE, str(pid_file), 'sleep']!r}, "
                    "dict(__import__('os').environ), None)); __import__('time').sleep(600)")
    starter = subprocess.Popen([sys.executable, "-c", starter_code])
    grandchild = None
    try:
        grandchild = _pid(pid_file)
        starter.send_signal(signal.SIGKILL)
        starter.wait()
        assert _gone(grandchild), "the grandchild outlived its starter"
    finally:
        starter.kill()
        starter.wait()
        if grandchild is not None and not _gone(grandchild, 0):
            os.kill(grandchild, signal.SIGKILL)


@pytest.mark.parametrize("then", ["sleep", "exit"])
def test_stop_tree_ends_a_grandchild_in_its_own_session_whether_its_parent_lives_or_not(tmp_path: Path,
                                                                                         then: str) -> None:
    pid_file = tmp_path / "grandchild"
    proc = launch.start(_plan(pid_file, then))
    grandchild = _pid(pid_file)
    try:
        if then == "exit":
            proc.wait(30)  # the grandchild is reparented: no longer the tree's descendant
        launch.stop_tree(proc)
        assert _gone(grandchild), "stop_tree left the grandchild running"
    finally:
        if not _gone(grandchild, 0):
            os.kill(grandchild, signal.SIGKILL)
