"""Script mode's live copies of the user's script (``autotune.measure.script``): started as trials are, each in a
folder of its own, timed in windows by the steps it tells, frozen between them, and stopped with nothing left."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from autotune import search_spaces as spaces
from autotune.measure import freeze
from autotune.measure.script import ScriptRun
from autotune.recipe import Recipe
from autotune.trial import launch

REPO = Path(__file__).resolve().parent.parent.parent


def test_two_copies_of_a_users_script_take_turns_in_windows_and_none_is_left(facts: Any, tmp_path: Path) -> None:
    params = {**spaces.defaults(facts, spaces.SpaceContext(default_batch_size=64)), "device": "cpu",
              "reference_batch": 64, "threads": 1, "interop_threads": 1}
    recipe = Recipe(params=params, workload="examples/train_cnn.py", fingerprint=facts.fingerprint)
    plan = launch.for_recipe(recipe, [sys.executable, str(REPO / "examples" / "train_cnn.py")],
                             {**os.environ, "TRAIN_S": "300"}, facts=facts)  # longer than the test: it is stopped
    runs = [ScriptRun(plan, tmp_path / name, loss_samples=256) for name in ("a", "b")]
    try:
        for run in runs:
            run.start()
            run.freeze()
        rates, idle_ticks = [], []
        for _ in range(3):
            for run, other in (runs, runs[::-1]):
                before = freeze.cpu_ticks(other.proc.pid)  # type: ignore[union-attr]
                rates.append(run.window(0.4, timeout_s=90))
                idle_ticks.append(freeze.cpu_ticks(other.proc.pid) - before)  # type: ignore[union-attr]
                assert freeze.proc_state(other.proc.pid) == "T"  # type: ignore[union-attr]
        assert all(rate is not None and 200 < rate < 1e6 for rate in rates), rates  # samples/s of a small CNN
        assert idle_ticks == [0] * 6  # the idle copy never ran while the other was timed
        assert all(run.loss is not None and run.loss.samples == 256 for run in runs)  # told once, at 256 samples
        assert all(s.samples % 64 == 0 for run in runs for s in run.steps)
    finally:
        pids = [p for run in runs if run.proc is not None for p in freeze.tree(run.proc.pid)]
        for run in runs:
            run.stop()
    time.sleep(0.1)
    assert [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"] == []
    assert all((tmp_path / name / "script.log").is_file() and (tmp_path / name / "tmp").is_dir() for name in "ab")
