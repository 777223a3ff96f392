"""Searches as users run them (``autotune search`` subprocesses) and their studies (PostgreSQL: tests/conftest.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ..conftest import FAST, defaults_env

# Quick trials: the tiny MLP, no DataLoader processes or torchrun ranks unless a test asks for them, and no
# torch.compile (a sampled compile_mode took 22 s of the fault table's 61; compile's tests are its own).
QUICK = (*FAST, "--workload", "tiny", "--budget", "10m", "--fix", "processes=1", "--no-compile")


def start_search(*args: str, cwd: Path, prefix: tuple[str, ...] = (), env: dict[str, str] | None = None,
                 environment: bool = False) -> subprocess.Popen[str]:
    """``autotune search ARGS`` started in the background, as a user would in a terminal. Its candidates
    keep the defaults' environment (``defaults_env``) unless ``environment``: the environment's knobs too."""
    held = () if environment else defaults_env()
    return subprocess.Popen([*prefix, sys.executable, "-m", "autotune", "search", *QUICK, *held, *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def trials(storage: str, study: str) -> list:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = condition()
        except Exception:  # noqa: BLE001 - the study may not exist yet
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def running_trial(storage: str, study: str, number: int) -> Callable[[], object]:
    """True once trial ``number`` (or a later one) is being measured."""
    import optuna

    return lambda: any(
        t.number >= number and t.state == optuna.trial.TrialState.RUNNING and "run_started" in t.user_attrs
        for t in trials(storage, study)
    )


def own_host(tmp_path: Path) -> dict[str, str]:
    """A TMPDIR for the searches a test starts: their host lock (``autotune.trial.lock``) is theirs alone, so no
    other search on the machine (another test run's) makes them wait, while they serialise each other."""
    temp = tmp_path / "tmp"
    temp.mkdir(exist_ok=True)
    return {"TMPDIR": str(temp)}
