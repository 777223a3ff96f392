"""Script mode's live copies of the user's script (``autotune.measure.script.copies``): started as trials are, each in a
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
from autotune.measure.script.copies import EXIT_WAIT_S, ScriptRun, failure
from autotune.recipe import Recipe
from autotune.trial import launch

REPO = Path(__file__).resolve().parent.parent.parent


def test_two_copies_of_a_users_script_take_turns_in_windows_and_none_is_left(facts: Any, tmp_path: Path) -> None:
    params = {**spaces.defaults(facts, spaces.SpaceContext(default_batch_size=16)), "device": "cpu",
              "reference_batch": 16, "threads": 1, "interop_threads": 1}  # small: the subject is the turns
    recipe = Recipe(params=params, workload="examples/train_cnn.py", fingerprint=facts.fingerprint)
    plan = launch.for_recipe(recipe, [sys.executable, str(REPO / "examples" / "train_cnn.py")],
                             {**os.environ, "TRAIN_S": "300"}, facts=facts)  # longer than the test: it is stopped
    runs = [ScriptRun(plan, tmp_path / name, loss_samples=64) for name in ("a", "b")]
    try:
        for run in runs:
            run.start()
            run.freeze()
        rates, idle_ticks = [], []
        for _ in range(3):
            for run, other in (runs, runs[::-1]):
                before = freeze.cpu_ticks(other.proc.pid)  # type: ignore[union-attr]
                rates.append(run.window(0.2, timeout_s=90))
                idle_ticks.append(freeze.cpu_ticks(other.proc.pid) - before)  # type: ignore[union-attr]
                assert freeze.proc_state(other.proc.pid) == "T"  # type: ignore[union-attr]
        # samples/s of a small CNN on one thread: 169-322 at batch 64 in a loaded suite on a 2-vCPU Zen 3 (a rate)
        assert all(rate is not None and 50 < rate < 1e6 for rate in rates), rates
        assert idle_ticks == [0] * 6  # the idle copy never ran while the other was timed
        assert all(run.loss is not None and run.loss.samples == 64 for run in runs)  # told once, at 64 samples
        assert all(s.samples % 16 == 0 for run in runs for s in run.steps)
    finally:
        pids = [p for run in runs if run.proc is not None for p in freeze.tree(run.proc.pid)]
        temporaries = [run.temporary for run in runs]
        for run in runs:
            run.stop()
    time.sleep(0.1)
    assert [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"] == []
    assert all((tmp_path / name / "script.log").is_file() for name in "ab")
    # each its own TMPDIR, short enough for a DataLoader's sockets (AF_UNIX), removed with the copy
    assert len(set(temporaries)) == 2 and all(t is not None and len(str(t)) < 80 for t in temporaries), temporaries
    assert not any(t.exists() for t in temporaries if t is not None)


def test_a_script_that_crashes_or_never_steps_gives_no_rate_and_costs_at_most_its_timeout(facts: Any,
                                                                                      tmp_path: Path) -> None:
    params = {**spaces.defaults(facts, spaces.SpaceContext(default_batch_size=32)), "device": "cpu"}
    recipe = Recipe(params=params, workload="faulty", fingerprint=facts.fingerprint)

    def copy(name: str, code: str) -> ScriptRun:
        run = ScriptRun(launch.for_recipe(recipe, [sys.executable, "-c", code], dict(os.environ), facts=facts),
                        tmp_path / name)
        run.start()
        return run

    crashed, silent = copy("crash", "import sys; print('a bug', flush=True); sys.exit(3)"), copy(
        "silent", "import time; time.sleep(600)")
    try:
        started = time.monotonic()
        assert crashed.window(0.2, timeout_s=30) is None and crashed.exited == 3  # ends the window at once
        assert time.monotonic() - started < 10
        started = time.monotonic()
        assert silent.window(0.2, timeout_s=1.5) is None and silent.exited is None  # no step: its timeout, no more
        assert 1.5 <= time.monotonic() - started < 5 and freeze.proc_state(silent.proc.pid) == "T"  # type: ignore[union-attr]
    finally:
        for run in (crashed, silent):
            run.stop()
    assert silent.exited is not None and "a bug" in (tmp_path / "crash" / "script.log").read_text()


def test_an_environment_knob_is_set_before_the_copy_starts_and_read_over_fresh_pairs(facts: Any,
                                                                                    tmp_path: Path) -> None:
    """``paced_train.py``'s step sleeps four times as long with one torch thread as with two; ``threads`` is set
    before Python starts (``OMP_NUM_THREADS`` and the recipe): two fresh process pairs each read near 0.25x, far
    from the 1x of a knob not set and the 4x of one set on the wrong copy."""
    from autotune.measure.script.measurer import ScriptMeasurer

    base = {**spaces.defaults(facts, spaces.SpaceContext(default_batch_size=32)), "device": "cpu",
            "reference_batch": 32, "threads": 2, "interop_threads": 1}
    measurer = ScriptMeasurer([sys.executable, str(REPO / "tests" / "scripts" / "paced_train.py")], base, facts,
                              tmp_path, workload="script:paced", loss_samples=64, min_window_s=0.2)
    try:
        handle = measurer.begin({**base, "threads": 1}, timeout_s=60)
        interval = measurer.more(handle, 4, timeout_s=60)
        result = measurer.end(handle)
    finally:
        measurer.close()
    assert result.status == "ok" and interval.count == 2, result
    # each pair's ratio, not the interval: two pairs alone give a t-interval of one degree of freedom, 12.7
    # standard errors wide. The step's own work beside the sleep lifts the ratio above 0.25 (a pair read 0.61
    # against 0.5 in the loaded suite when the sleeps were 5 and 10 ms: about 2.7 ms of work per step)
    assert 0.15 < result.objective < 0.6 and all(0.15 < r < 0.6 for r in handle.medians), (interval, result)


def test_a_pair_of_your_runs_runs_each_copy_alone_one_after_the_other(facts: Any, tmp_path: Path) -> None:
    """The claim's pair of your runs in script mode (``alone_pair``): the defaults' copy and the candidate's, each
    started, warmed up and timed alone, one after the other; their rates and their ratio, nothing left running. A
    copy that cannot start in the time given is the pair's failure, said as such."""
    import pytest

    from autotune.measure import PairFailed
    from autotune.measure.script.copies import alone_pair

    # batch 16 and windows of 0.1 s: no assertion reads a rate's size, and 0.3-s windows of batch 64 were the CPU's
    params = {**spaces.defaults(facts, spaces.SpaceContext(default_batch_size=16)), "device": "cpu",
              "reference_batch": 16, "threads": 1, "interop_threads": 1}
    plans = {side: launch.for_recipe(Recipe(params=p, workload="examples/train_cnn.py", fingerprint=facts.fingerprint),
                                     [sys.executable, str(REPO / "examples" / "train_cnn.py")],
                                     {**os.environ, "TRAIN_S": "300"}, facts=facts)
             for side, p in (("base", params), ("cand", {**params, "channels_last": True}))}
    live: list[ScriptRun] = []
    pair = alone_pair(plans, tmp_path / "yours", 0.1, 2, 0, 120.0, live)
    assert pair.samples_per_s and pair.baseline_samples_per_s and not live
    assert pair.ratio == pytest.approx(pair.samples_per_s / pair.baseline_samples_per_s)
    assert all((tmp_path / "yours" / side / "script.log").is_file() for side in ("base", "cand"))
    with pytest.raises(PairFailed, match="copy: the time ran out|did not call"):
        alone_pair(plans, tmp_path / "late", 0.3, 2, 0, 0.5, live)  # its windows alone outlast the 1 s given
    assert not live


def test_an_evaluation_between_a_windows_steps_is_no_training_time(tmp_path: Path) -> None:
    """``Tuned.evaluate``'s seconds (told with the step they followed) come off the span between two steps that hold
    them, and only those: one that follows the last step, or lies outside, is not taken off."""
    from autotune.steps import Step

    run = ScriptRun(launch.LaunchPlan(["true"], {}, None), tmp_path)  # never started: its steps are given
    run.paused = [(2.0, 0.5), (4.0, 0.25), (9.0, 1.0)]
    steps = [Step(t, 8 * i) for i, t in enumerate((1.0, 2.0, 3.0, 4.0, 5.0))]
    assert run.span(steps[0], steps[4]) == 4.0 - 0.75
    assert run.span(steps[0], steps[1]) == 1.0  # the pause after step 2 lies beyond this span's last step
    assert run.span(steps[1], steps[2]) == 0.5


def test_a_copy_that_ended_is_named_without_waiting_on_the_other_recipes_copy(tmp_path: Path) -> None:
    """A crashed candidate's pair: its defaults' copy, healthy, would not end, so it is not waited on; a copy of
    the same recipe (an A/A) is, a moment, since a script that fails fails in both."""
    def copy(name: str, code: str, delay_s: float | None = None) -> ScriptRun:
        run = ScriptRun(launch.LaunchPlan([sys.executable, "-c", code], {}, None), tmp_path / name)
        run.folder.mkdir(parents=True)
        if delay_s is not None:
            (run.folder / "delay").write_text(str(delay_s))  # the same command, its own folder (its cwd)
        run.start()
        return run

    crashing = "import time; time.sleep(float(open('delay').read())); print('boom at step 5'); raise SystemExit(3)"
    for same in (False, True):
        base = copy(f"base-{same}", crashing, 1.0) if same else copy("base", "import time; time.sleep(60)")
        cand = copy(f"cand-{same}", crashing, 0.0)
        try:
            cand.proc.wait(timeout=30)
            started = time.monotonic()
            said = failure([base, cand])
            waited = time.monotonic() - started
        finally:
            base.stop()
            cand.stop()
        whose = "the defaults'" if same else "the candidate's"  # the defaults' named first where both ended
        assert said == f"{whose} copy exited with status 3: boom at step 5", said
        assert (0.2 < waited < EXIT_WAIT_S) if same else (waited < 0.5), (same, waited)
