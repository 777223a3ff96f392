"""Measure in a child process: a search's process must hold no CUDA context of its own (it takes device memory
from the trials), so what it measures on a GPU (the kernels' speeds, the limits) runs in a fresh Python, which
prints its result as JSON."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

_CHILD = ("import importlib, json, sys; module, name = sys.argv[1].split(':'); "
          "print(json.dumps(getattr(importlib.import_module(module), name)(*json.loads(sys.argv[2]))))")
CHILD_S = 600.0  # the longest a child may measure where nothing shorter is asked (a hung GPU driver never returns)
REAPED_S = 5.0  # after its kill, the longest this process waits for the child to go: one stuck in a driver may not


def call_in_child(target: str, *args: Any, what: str, timeout_s: float = CHILD_S) -> Any:
    """``target`` (``module:function``) called with ``args`` in a child process: its JSON result. A child that fails
    raises ``RuntimeError`` naming ``what`` and its traceback's last line; one that takes over ``timeout_s`` is
    killed with its process group, and ``RuntimeError`` says so (it is not waited for past ``REAPED_S``)."""
    child = subprocess.Popen([sys.executable, "-c", _CHILD, target, json.dumps(args)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            child.communicate(timeout=REAPED_S)
        except subprocess.TimeoutExpired:
            pass  # stuck beyond a kill (uninterruptible in a driver): left to the system rather than waited for
        raise RuntimeError(f"measuring {what} took over {timeout_s:.0f} s: stopped") from None
    if child.returncode != 0:
        last = (err.strip().splitlines() or [f"exit status {child.returncode}"])[-1]
        raise RuntimeError(f"measuring {what} failed: {last[-300:]}")
    return json.loads(out.strip().splitlines()[-1])
