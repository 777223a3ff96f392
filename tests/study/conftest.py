"""Searches as users run them (``autotune search`` subprocesses) and their studies (PostgreSQL: tests/conftest.py)."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from autotune import search_spaces as spaces
from autotune.measure import Noise
from autotune.measure.live.measurer import LiveMeasurer
from autotune.probes import Facts
from autotune.study import SearchOptions, run_settings, search, search_context
from autotune.study.outcome import SearchOutcome
from autotune.trial import TrialSettings

from ..conftest import FAST, defaults_env, held_env

# Quick trials: the tiny MLP, no DataLoader processes or torchrun ranks unless a test asks for them, and no
# torch.compile (compile's tests are its own). A search stops by itself at its budget, so no wait on one is longer.
BUDGET_S = 600
QUICK = (*FAST, "--workload", "tiny", "--budget", f"{BUDGET_S}s", "--fix", "processes=1", "--no-compile")
QUICK_SETTINGS = TrialSettings(warmup_steps=2, measure_steps=6)  # FAST's
MINUTE_S = 60.0


def start_search(*args: str, cwd: Path, prefix: tuple[str, ...] = (), env: dict[str, str] | None = None,
                 environment: bool = False) -> subprocess.Popen[str]:
    """``autotune search ARGS`` started in the background, as a user would in a terminal. Its candidates
    keep the defaults' environment (``defaults_env``) unless ``environment``: the environment's knobs too."""
    held = () if environment else defaults_env()
    return subprocess.Popen([*prefix, sys.executable, "-m", "autotune", "search", *QUICK, *held, *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def trials(storage: Any, study: str) -> list:
    """The study's trials, from a storage's URL or an open storage (``running_trial``'s)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)


def wait_for(condition: Callable[[], object], timeout: float, what: str,
             search: subprocess.Popen[Any] | None = None, log: Path | None = None) -> Any:
    """``condition()``'s value once true, polled 5 times a second; fails after ``timeout``, or at once when
    ``search`` has ended without it (with ``log``, else its output)."""
    def value() -> Any:
        try:
            return condition()
        except Exception:  # noqa: BLE001 - the study may not exist yet
            return None

    deadline = time.monotonic() + timeout
    while not (found := value()):
        if search is not None and search.poll() is not None and not (found := value()):  # not just as it ended
            told = log.read_text() if log is not None else search.communicate()
            raise AssertionError(f"the search ended (exit {search.returncode}) before {what}:\n{told}")
        if found:
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)
    return found


def running_trial(storage: str, study: str, number: int) -> Callable[[], object]:
    """True once trial ``number`` (or a later one) is being measured. Its polls share one storage: by URL, each
    built an engine, checked the tables and ran alembic's migration scripts, five times a second."""
    import optuna

    opened: list[optuna.storages.RDBStorage] = []

    def running() -> bool:
        if not opened:  # an open that fails (the search still creating the schema) is tried at the next poll
            opened.append(optuna.storages.RDBStorage(storage))
        return any(t.number >= number and t.state == optuna.trial.TrialState.RUNNING and "run_started" in t.user_attrs
                   for t in trials(opened[0], study))

    return running


def own_host(tmp_path: Path) -> dict[str, str]:
    """A TMPDIR for the searches a test starts: their host lock (``autotune.trial.lock``) is theirs alone, so no
    other search on the machine (another test run's) makes them wait, while they serialise each other."""
    temp = tmp_path / "tmp"
    temp.mkdir(exist_ok=True)
    return {"TMPDIR": str(temp)}


@pytest.fixture
def own_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``own_host`` for searches run in this process: their host lock, trial directories and workers' are the
    test's own. Run alone (not under pytest-xdist) the lock in /tmp is every other search's on the machine:
    beside another test run a scripted search took 115 s waiting for it, 8 s with a lock of its own."""
    temp = Path(own_host(tmp_path)["TMPDIR"])
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    return temp


class QuickMeasurer(LiveMeasurer):
    """The live measurer ``search()`` builds for ``options``, with the fewest A/A pairs (6) and a race sized as a
    one-minute budget sizes it (``LiveMeasurer.calibrate``), for searches whose subject is not the noise: a race
    round is then 4 pairs however busy the machine, where given 10 minutes a busy one asked for up to 30. No
    calibration is too wide for them (``busy``): beside another test run tiny's 6 A/A pairs read [0.53-1.36]. Nor
    are the defaults profiled (``profile_s``): 2 s a search, for the report's top operators."""

    def __init__(self, workload: str, facts: Facts, options: SearchOptions) -> None:
        _, ctx = search_context(workload, facts, options)
        defaults = {**spaces.defaults(facts, ctx), **run_settings(ctx, options)}
        super().__init__(workload, defaults, facts, options.settings, calibration_pairs=6, seed=options.seed,
                         busy=math.inf, profile_s=0.0)

    def calibrate(self, timeout_s: float) -> Noise:
        return super().calibrate(min(timeout_s, MINUTE_S))


def search_here(workload: str, facts: Facts, **options: Any) -> SearchOutcome:
    """``search()`` in this process as ``autotune search`` runs it with ``QUICK`` (``defaults_env()`` and
    ``processes=1`` held, more in ``fixed``), measured by ``QuickMeasurer``: the same loop, worker processes and
    trials, without the CLI's start and report, for tests whose subject is not the CLI (its searches:
    ``start_search``, tests/test_end_to_end.py)."""
    fixed = {**held_env(), "processes": 1, **options.pop("fixed", {})}
    chosen = SearchOptions(**{"budget_s": BUDGET_S, "compile": False, "settings": QUICK_SETTINGS, "fixed": fixed,
                              **options})
    return search(workload, options=chosen, measurer=QuickMeasurer(workload, facts, chosen), facts=facts)


# ``search_here`` in a process of its own: ``python -c SEARCH_ALONE WORKLOAD OPTIONS`` (JSON) from the repository.
SEARCH_ALONE = ("import json, sys; from autotune import probes; from tests.study.conftest import search_here; "
                "search_here(sys.argv[1], probes.probe(), **json.loads(sys.argv[2]))")
