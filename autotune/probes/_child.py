"""Measure in a child process: a search's process must hold no CUDA context of its own (it takes device memory
from the trials), so what it measures on a GPU (the kernels' speeds, the limits) runs in a fresh Python, which
prints its result as JSON."""
from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

_CHILD = ("import importlib, json, sys; module, name = sys.argv[1].split(':'); "
          "print(json.dumps(getattr(importlib.import_module(module), name)(*json.loads(sys.argv[2]))))")


CHILD_S = 600.0  # the longest a child may measure where nothing shorter is asked (a hung GPU driver never returns)


def call_in_child(target: str, *args: Any, what: str, timeout_s: float = CHILD_S) -> Any:
    """``target`` (``module:function``) called with ``args`` in a child process: its JSON result. A child that fails
    raises ``RuntimeError`` naming ``what`` and its traceback's last line; one that takes over ``timeout_s`` is
    killed (``subprocess.TimeoutExpired``)."""
    done = subprocess.run([sys.executable, "-c", _CHILD, target, json.dumps(args)], capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise RuntimeError(f"measuring {what} failed: {last[-300:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
