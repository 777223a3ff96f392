"""Script mode (``autotune search -- python train.py``): the user's own script measured against its defaults' copies
in fresh process pairs, its faults recorded as failed trials with their reason, a search that stores its recipe."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from autotune import search_spaces as spaces
from autotune.measure.script_pairs import ScriptMeasurer
from autotune.study import search_script
from autotune.trial.spec import Status

from ..conftest import run_cli

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "faulty_train.py"
pytestmark = pytest.mark.slow


def _measurer(facts: Any, folder: Path, fault: str = "") -> tuple[ScriptMeasurer, dict[str, Any]]:
    ctx = spaces.SpaceContext(default_batch_size=8, conv=True)
    defaults = {**spaces.defaults(facts, ctx), "device": "cpu", "reference_batch": 8, "threads": 1,
                "interop_threads": 1}
    measurer = ScriptMeasurer([sys.executable, str(SCRIPT)], defaults, facts, folder, workload="script:faulty",
                              loss_samples=64, env={**os.environ, "FAULT": fault}, min_window_s=0.2,
                              start_limit_s=8.0)
    return measurer, {**defaults, "channels_last": True}


@pytest.mark.parametrize(("fault", "status", "said"), [
    ("crash", Status.CRASH, "the candidate's copy exited with status 1: RuntimeError: boom at step 5"),
    ("exit", Status.CRASH, "the candidate's copy exited with status 0"),
    ("hang", Status.TIMEOUT, "the candidate's copy told no step in its window's time"),
    ("no-step", Status.TIMEOUT, "the candidate's copy told 0 of 3 steps in 8 s"),
])
def test_a_scripts_fault_is_the_trials_failure_with_its_reason(facts: Any, tmp_path: Path, fault: str,
                                                               status: Status, said: str) -> None:
    measurer, candidate = _measurer(facts, tmp_path, fault)
    try:
        handle = measurer.begin(candidate, timeout_s=60)
        interval = measurer.more(handle, 4, timeout_s=60)
        result = measurer.end(handle)
    finally:
        measurer.close()
    assert interval.count == 0
    assert result.status == status and result.error is not None and result.error.startswith(said), result.error


def test_a_script_that_prints_heavily_is_measured_and_its_loss_taken(facts: Any, tmp_path: Path) -> None:
    """10 kB of output a step goes to the copy's log, not to the search's pipe; channels_last's copy steps in
    half the defaults' time: two fresh process pairs read about 2x, and the loss is told at the study's samples."""
    measurer, candidate = _measurer(facts, tmp_path, "print")
    try:
        handle = measurer.begin(candidate, timeout_s=60)
        interval = measurer.more(handle, 4, timeout_s=60)
        result = measurer.end(handle)
    finally:
        measurer.close()
    assert result.status == Status.OK, result
    assert interval.count == 2 and 1.5 < result.objective < 2.6, (interval, result)  # type: ignore[operator]
    assert result.method == "script process pairs (2)" and result.pairs == 8
    assert result.loss is not None and result.loss_samples is not None and 64 <= result.loss_samples < 72
    assert (tmp_path / "1-candidate" / "script.log").stat().st_size > 100_000


def test_a_script_mode_search_stores_the_faster_recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The baseline is the A/A of fresh copy pairs; the seed with channels_last (held by --fix in every trial
    but the baseline) steps in half the time; the recipe says so, named after the script."""
    from autotune.study import SearchOptions

    monkeypatch.chdir(tmp_path)
    options = SearchOptions(budget_s=120, trials=2, storage=f"sqlite:///{tmp_path / 'studies.db'}",
                            fixed={"channels_last": True, "threads": 1, "interop_threads": 1, "batch_per_rank": 8},
                            confirm_top=0,
                            busy_limit=float("inf"))
    outcome = search_script([sys.executable, str(SCRIPT), "--flag"], batch_size=8, options=options,
                            folder=tmp_path / "copies", min_window_s=0.1)
    seen = [(r.number, r.role, r.result.status, r.result.objective, r.result.speedup_low, r.result.speedup_high,
             r.result.error, r.result.warnings, r.reason) for r in outcome.records], outcome.recipe.notes
    assert outcome.study == f"faulty_train-{outcome.recipe.fingerprint}"
    assert outcome.recipe.workload == f"script:{SCRIPT}"
    assert outcome.recipe.params["channels_last"] is True and outcome.recipe.params["processes"] == 1, seen
    assert 1.5 < outcome.recipe.speedup < 2.6, seen
    assert outcome.baseline.result.method == "script process pairs (A/A)"
    assert outcome.best.result.loss is not None and outcome.baseline.result.loss is not None


def test_a_script_without_the_apply_pattern_is_one_line(tmp_path: Path) -> None:
    out = run_cli("search", "--batch-size", "8", "--", sys.executable, "-c", "print('training')", cwd=tmp_path)
    assert out.returncode == 2, out
    line = out.stderr.strip()
    assert "\n" not in line and "did not call tuned.prepare_model(model)" in line and "exited with status 0" in line
    assert not (tmp_path / "studies.db").exists()  # nothing was written


@pytest.mark.parametrize(("args", "said"), [
    (("--", "python", "train.py"), "script mode needs --batch-size N"),
    (("--workload", "tiny", "--batch-size", "8", "--", "python", "train.py"), "search one or the other"),
    (("--batch-size", "8"), "--batch-size is for script mode"),
])
def test_script_modes_usage_errors(tmp_path: Path, args: tuple[str, ...], said: str) -> None:
    out = run_cli("search", *args, cwd=tmp_path)
    assert out.returncode == 2 and said in out.stderr, out
