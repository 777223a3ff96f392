"""A candidate's speedup over the defaults, measured paired: in one worker, or across processes x in one.

Workloads whose speed answers to the knob through a sleep (``tests.quality_workloads:slow``, the
threads-bound one of ``test_process_pair``), so that verdicts hold on a loaded 2-core machine.
"""
from __future__ import annotations

from typing import Any

import pytest

from autotune.measure import environment_key, stats
from autotune.measure.environment import paired_method, same_environment
from autotune.search_spaces import SpaceContext, defaults
from autotune.trial.spec import TrialSettings

SETTINGS = TrialSettings(warmup_steps=2, measure_steps=6, windows=2, max_extra_windows=0, eval_samples=128)


def _params(facts: Any, batch_size: int, **changes: Any) -> dict[str, Any]:
    base = defaults(facts, SpaceContext(default_batch_size=batch_size))
    return {**base, "device": "cpu", "reference_batch": batch_size, "threads": 1, "interop_threads": 1, **changes}


def test_same_environment_compares_only_the_environment_knobs() -> None:
    assert same_environment({"threads": 1, "batch_size": 8}, {"threads": 1, "batch_size": 64})
    assert not same_environment({"threads": 1}, {"threads": 2})
    # as the live measurer measures them: what the time kept for a raced candidate's confirmation is counted by
    defaults = {"threads": 2, "batch_size": 64}
    assert paired_method({"threads": 2, "batch_size": 16}, defaults) == "in-process pairs"
    assert paired_method({"threads": 1, "batch_size": 64}, defaults) == "process pairs"
    assert paired_method({"threads": 1, "batch_size": 16}, defaults) == "process pairs x in-process pairs"


def test_the_live_measurer_calibrates_once_and_measures_each_candidate_as_an_arm(facts: Any) -> None:
    """``slow`` sleeps per forward pass: batch 16 runs a quarter of the default's samples/s. Its samples are
    tensors in memory and its step sleeps 40 ms: its defaults hardly wait for data (0.01 here; an input-bound
    workload's: ``tests/measure/test_arms.py``). No profile (2 s asked of a 300-s budget): nothing here reads it
    (``tests/measure/test_phases.py`` does)."""
    from autotune.measure.live.measurer import LiveMeasurer
    from autotune.study.seeds import INPUT_BOUND

    base, phases = _params(facts, 64), []
    measurer = LiveMeasurer("tests.quality_workloads:slow", base, facts, SETTINGS, calibration_pairs=6,
                            window_s=0.15, on_phase=lambda name, detail: phases.append(name), profile_s=0.0)
    try:
        noise = measurer.calibrate(300)
        assert noise.window_s == 0.15 and noise.pairs >= 8 and noise.margin >= stats.MIN_MARGIN
        assert noise.aa[1] <= noise.aa[0] <= noise.aa[2] and noise.wall_s > noise.timed_s > 0
        # its worker's start to the defaults' arm settled: part of its time outside windows (the A/A)
        assert noise.start_s is not None and 0 < noise.start_s < noise.wall_s - noise.timed_s
        # and a fresh trial process of the defaults, the price of a pair of your runs: its start and its steps
        assert noise.run_s is not None and noise.run_s > (2 + 6) * measurer.calibration.step_s
        worker = measurer.pool.worker
        assert worker is not None and worker.ready is not None

        baseline = measurer.end(measurer.begin(base, 60))  # the baseline trial IS the calibration
        assert baseline.status == "ok" and baseline.method == "in-process pairs" and baseline.pairs == 6
        assert baseline.objective == 1.0 and (baseline.speedup_low, baseline.speedup_high) == noise.aa[1:]
        assert baseline.loss and baseline.loss_samples == worker.spec.loss_samples and baseline.startup_s
        assert baseline.data_wait is not None and baseline.data_wait < INPUT_BOUND / 5, baseline

        handle = measurer.begin({**base, "batch_size": 16}, 120)
        first = measurer.more(handle, 4, 120)
        assert first.count == 4 and first.high < 0.6, first  # slower with confidence after one round
        both = measurer.more(handle, 2, 120)
        early = measurer.loss(handle)  # what the race reads: the guard's loss once the arm has trained to it
        slow = measurer.end(handle)
        measurer.reseed(7)  # the confirmation: in a fresh worker process, calibration kept
        fresh = measurer.begin({**base, "batch_size": 16}, 120)
        measurer.more(fresh, 4, 120)
        measurer.skip_loss(fresh)  # as the race does for a candidate slower with confidence: no training for its loss
        again = measurer.end(fresh)
        assert measurer.pool.worker is not None and measurer.pool.worker is not worker
        assert worker.proc.poll() is not None
        assert again.status == "ok" and again.startup_s and again.objective < 0.6  # the new worker's start, paid
        assert again.loss is None and again.loss_samples is None  # 4 rounds of windows trained under 512 samples
    finally:
        measurer.close()
    assert both.count == 6 and slow.status == "ok" and slow.method == "in-process pairs" and slow.pairs == 6
    assert (slow.objective, slow.speedup_low, slow.speedup_high) == (both.median, both.low, both.high)
    assert slow.loss and slow.loss_samples == baseline.loss_samples  # the guard's one sample count
    assert early in (None, slow.loss)
    assert slow.timed_s and slow.timed_s >= 6 * 2 * 0.15 and slow.wall_s > slow.timed_s + (slow.warmup_s or 0)
    assert slow.startup_s == 0.0 and slow.samples_per_s and slow.in_effect["threads"] == 1  # no worker started
    assert worker.proc is not None and worker.proc.poll() is not None  # closed with the measurer
    assert {"calibrating noise", "starting", "warm-up", "paired windows", "evaluating"} <= set(phases)


def _threads_measurer(facts: Any, process_pairs: tuple[int, int]) -> tuple[Any, dict, dict, str]:
    """A live measurer of ``threads_bound`` (two threads the defaults) and a candidate of one thread: another
    environment. No half width is narrow enough: only ``most`` process pairs are (sleep-bound, two process pairs
    agreed within 0.01% and were enough at 0.0001). Windows of 0.1 s: ``threads_bound`` reads its 2x from whole
    sleep-bound steps (2 with two threads, 1 with one), and each process pair runs the fewest pairs of windows (4):
    these tests count process pairs, not windows."""
    from autotune.measure import LiveMeasurer, environment_key

    base = _params(facts, 32, threads=2, interop_threads=2)
    one = {**base, "threads": 1, "interop_threads": 1}
    measurer = LiveMeasurer("tests.measure.test_process_pair:threads_bound", base, facts, SETTINGS,
                            calibration_pairs=6, window_s=0.1, half_width=0.0, process_pairs=process_pairs,
                            profile_s=0.0)  # the report's top operators are not the subject
    return measurer, base, one, environment_key(one)


def test_a_factor_cut_short_keeps_its_pair_and_a_confirmation_round_measures_its_own(facts: Any) -> None:
    """A candidate whose process pairs cannot fit is not started; a factor cut short for time keeps the pairs it
    ran. A confirmation round (``reseed``) measures one fresh process pair of its own, and its factor is that
    pair's ratio alone, never pooled with the search's (the winner's curse); the search's pairs lend it only their
    spread, and one pair has none: unbounded (the spread lent by several: ``test_stats``)."""
    from autotune.trial.spec import TrialResult

    measurer, _, one, key = _threads_measurer(facts, (2, 3))
    try:
        measurer.calibrate(20)
        skipped = measurer.begin(one, 1.0)  # 2 process pairs do not fit in 1 s: not started (``too_short``)
        assert isinstance(skipped, TrialResult) and skipped.status == "skipped" and key not in measurer.factor_ratios
        measurer.pool.start_s = 0.0  # no start measured: nothing to refuse by, so a pair runs and outlasts the time
        cut = measurer.begin(one, 1.0)  # one pair, then the time runs out: its pair is kept, not the factor
        assert len(measurer.factor_ratios[key]) == 1 and key not in measurer.factors, cut
        if not isinstance(cut, TrialResult):
            measurer.end(cut)
        searched = list(measurer.factor_ratios[key])
        measurer.reseed(7)
        again = measurer.begin(one, 300)
        # the round's worker of that environment: its fresh process pair's environment side, its heap fixed since
        assert measurer.pool.env is not None and measurer.pool.env[0] == key, measurer.pool.env
        assert measurer.pool.env[1].heap_fixed
        measurer.more(again, 2, 300)
        measurer.more(again, 2, 300)  # a confirmation grows nothing in its rounds
        result = measurer.end(again)
        # a pair of your runs for the claim (``user_pair``): the search's workers end first, then a fresh trial
        # process of each, alone, one after the other: their rates told
        yours = measurer.user_pair(one, 3, 300)
        assert measurer.pool.worker is None and measurer.pool.env is None
    finally:
        measurer.close()
    assert yours.ratio < 1 and yours.run_s > 0, yours
    # the claim's price of a pair (``reserve.claim_pair_s``): two trial processes of the defaults as the calibration's
    # worker started (``Noise.run_s``), the settle steps of its first arm left out (a process of yours settles no
    # arm: with them a quiet pair was priced 1.37x what it took) and the calibration's windows too
    from autotune.measure.runs import trial_run_s
    from autotune.study.reserve import claim_pair_s
    noise, cal = measurer.noise, measurer.calibration
    assert noise is not None and cal is not None and noise.start_s is not None and noise.run_s is not None
    batch, step_s = measurer.defaults["batch_per_rank"], cal.step_s
    assert claim_pair_s(noise) == 2 * noise.run_s
    assert trial_run_s(noise.start_s, step_s, SETTINGS, batch) - noise.run_s > 0.5
    assert noise.start_s + noise.timed_s < noise.wall_s, noise
    # and its process's start is in it (a price from windows alone leaves the start out: a fifth of a slow
    # transformer's process): most of the calibration worker's start, less its first arm's settle steps. Not a
    # bound against the pair's wall: the price is the calibration's moment's, and a process start under the CI's
    # load took 2.5x its quiet time (priced 6.6 s, took 15.1 s: below what a windows-alone price reads quiet, so no
    # timed bound tells the two apart); the claim prices its later pairs by their own time (``claim.py``)
    started = noise.run_s - trial_run_s(0.0, step_s, SETTINGS, batch)
    assert 0.5 * noise.start_s < started < noise.start_s - 0.5, (started, noise)
    assert yours.ratio == pytest.approx((yours.samples_per_s or 0) / (yours.baseline_samples_per_s or 1)), yours
    own = measurer.environments._round_factors[key]
    assert result.status == "ok" and measurer.factor_ratios[key] == searched, result  # the search's pair, alone
    assert (result.objective, result.speedup_low, result.speedup_high) == (own.median, own.low, own.high)
    assert own.median not in searched and own.low == 0.0 and own.high == float("inf"), own
    assert searched[0] < 1 and own.median < 1  # one thread here is slower: it measured what it was asked


def test_a_factor_grows_a_process_pair_a_race_round_and_its_worker_takes_the_environments_arms(facts: Any) -> None:
    """``begin`` measures the fewest pairs; each later round of the race adds one until the factor is enough (a
    candidate stopped after its first round costs the fewest). A candidate of that environment with an in-process
    knob besides is an arm in its worker, factor x in-process: where the fewest pairs ran and the worker lives, it
    starts no process for its first look, settled or not (``warm``, which the search prices and fills by), and its
    own later rounds grow the factor."""
    from autotune.measure.live.process_pair import HopelessEnvironment
    from autotune.trial.spec import TrialResult

    measurer, _, one, key = _threads_measurer(facts, (1, 2))

    def pairs() -> tuple[int, bool]:
        return len(measurer.factor_ratios[key]), key in measurer.factors  # pooled pairs, cached (enough)

    # batch 64 in that environment: half the sleep-bound steps per sample
    mixed_params = {**one, "batch_size": 64}
    try:
        measurer.calibrate(20)
        assert not measurer.warm(mixed_params)  # no pair of its environment yet: a first look starts processes
        race = measurer.begin(one, 300)
        measurer.more(race, 2, 300)
        first = measurer.end(race)  # stopped after its first round: the fewest pairs, its factor not settled
        seen = [pairs()]
        assert measurer.warm(mixed_params) and measurer.pool.env_alive(key)
        mixed = measurer.begin(mixed_params, 300)
        assert not isinstance(mixed, TrialResult) and mixed.startup_s == 0.0, mixed  # an arm in the live worker
        seen.append(pairs())
        for _ in range(3):
            inner = measurer.more(mixed, 4, 300)
            seen.append(pairs())
        combined = measurer.end(mixed)
        searched = measurer.factors[key]
        measurer.environments.hopeless[key] = HopelessEnvironment(40.0, None)  # type: ignore[arg-type]
        assert not measurer.warm(mixed_params)  # an environment that gave up is not offered as cheap
    finally:
        measurer.close()
    assert seen == [(1, False), (1, False), (1, False), (2, True), (2, True)], seen
    assert first.status == "ok" and first.method == "process pairs" and first.pairs == 1, first
    assert combined.startup_s > 0.0, combined  # its second round's process pair
    assert combined.status == "ok" and combined.method == "process pairs x in-process pairs", combined
    assert combined.objective == inner.median and combined.objective / searched.median > 1.5, (combined, searched)
    assert searched.median < 1  # one thread here is slower


class _Worker:
    """What the live measurer asks of a paired worker when it sets one aside: the calls, in order."""

    def __init__(self) -> None:
        from types import SimpleNamespace

        self.frozen: object | None = None
        self.proc = SimpleNamespace(poll=lambda: None)
        self.calls: list[str] = []

    def empty_cache(self) -> int:
        self.calls.append("empty_cache")
        return 1 << 30

    def freeze(self) -> None:  # as PairedWorker's: a frozen worker stays as it is
        if self.frozen is None:
            self.calls.append("freeze")
            self.frozen = object()

    def thaw(self) -> None:
        if self.frozen is not None:
            self.calls.append("thaw")
            self.frozen = None


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_a_worker_set_aside_on_a_gpu_returns_its_cache_first(facts: Any, device: str) -> None:
    """A frozen worker keeps its device memory: on CUDA it returns its allocator's unused cache before it is
    frozen beside the worker or processes that run next (on the CPU there is nothing to return)."""
    from autotune.measure.live.measurer import LiveMeasurer

    measurer = LiveMeasurer("tiny", {"device": device}, facts, TrialSettings())
    defaults_worker, env_worker = _Worker(), _Worker()
    measurer.pool.worker, measurer.pool.env = defaults_worker, ("key", env_worker)  # type: ignore[assignment]
    measurer.pool.use(defaults_worker)  # type: ignore[arg-type]
    measurer.pool.use(defaults_worker)  # type: ignore[arg-type]  # already set aside: nothing more to ask
    assert env_worker.calls == (["empty_cache", "freeze"] if device == "cuda" else ["freeze"])
    assert defaults_worker.calls == []  # it was not frozen: nothing to thaw


def test_a_candidate_of_another_environment_is_not_started_without_the_time_its_processes_take(facts: Any) -> None:
    """Worker starts measured at 12 s (an H100's): with 10 s left, a candidate of another environment, whose
    process pairs start workers, is skipped at once instead of stopped halfway 20 s later."""
    import time
    from types import SimpleNamespace

    from autotune.measure.live.measurer import LiveMeasurer

    base = {**defaults(facts, SpaceContext()), "device": "cpu"}
    measurer = LiveMeasurer("tiny", base, facts, TrialSettings())
    measurer.pool.start_s = 12.0
    measurer.calibration = SimpleNamespace(pairs=16, window_s=0.05)  # type: ignore[assignment]
    other = {**base, "affinity": "compact" if base["affinity"] != "compact" else "none"}
    started = time.monotonic()
    result = measurer.begin(other, timeout_s=10.0)
    assert time.monotonic() - started < 1.0 and measurer.pool.env is None  # nothing was started
    assert result.status == "skipped"  # type: ignore[union-attr]
    assert result.error == ("not started: another environment needs 3 process pair(s), about 38 s; "  # type: ignore[union-attr]
                            "10 s were left")
    measurer.factors[environment_key(other)] = stats.Interval(1.0, 1.0, 1.0, 0.0, 3)  # its factor measured
    assert too_short(measurer, environment_key(other), 10.0) == (
        "not started: another environment needs its worker's start, about 12 s; 10 s were left")
    assert too_short(measurer, environment_key(other), 13.0) is None
    # The calibration's worker was ready (started, its arm built and settled) after 5 s: a first pair starts two
    del measurer.factors[environment_key(other)]
    measurer.pool.start_s, measurer.noise = 2.0, SimpleNamespace(start_s=5.0)  # type: ignore[assignment]
    assert too_short(measurer, environment_key(other), 30.0) == (
        "not started: another environment needs 3 process pair(s), about 32 s; 30 s were left")


def test_a_confirmation_round_runs_the_process_pair_the_confirmation_admitted_it_with(facts: Any,
                                                                                      monkeypatch: Any) -> None:
    """The confirmation admits a round by its own estimate (``reserve.rounds_s``, which also sized the time kept for
    the rounds); the measurer does not judge it again by another. Asked for 1.5x the last process pair, a 2-minute
    search of ``tiny`` skipped its last round with 6-9 s left and 6-s pairs, and left a gain read 1.15x and 1.43x
    in two rounds at [0.31-5.34], unconfirmed."""
    import time
    from types import SimpleNamespace

    from autotune.measure.live.candidate import LiveTrial
    from autotune.measure.live.measurer import LiveMeasurer

    base = {**defaults(facts, SpaceContext()), "device": "cpu"}
    measurer = LiveMeasurer("tiny", base, facts, TrialSettings())
    measurer.pool.start_s, measurer.environments._pair_s = 2.5, 6.0  # as that search measured them
    measurer.calibration = SimpleNamespace(pairs=16, window_s=0.05)  # type: ignore[assignment]
    other = {**base, "affinity": "compact" if base["affinity"] != "compact" else "none"}
    key, ran = environment_key(other), []
    monkeypatch.setattr(measurer.environments, "_process_pair", lambda *args, last, seed: ran.append(last) or 1.2)
    assert too_short(measurer, key, 7.0) is not None  # in the search: its 3 pairs do not fit
    measurer.reseed(7)
    trial = LiveTrial(other, "c1", 7, time.monotonic())
    assert too_short(measurer, key, 7.0) is None
    factor = measurer.environments.factor(key, other, trial, time.monotonic() + 7.0, measurer.cal)
    assert ran == [True] and factor.median == pytest.approx(1.2) and trial.warnings == [], trial.warnings
    measurer.close()


def test_fresh_pairs_whose_defaults_run_out_of_time_are_a_timeout_not_a_crash(facts: Any) -> None:
    """A two-process candidate is measured in fresh process pairs; when the time left ends inside the defaults'
    process, the trial ran out of time (a 2-minute demo recorded it as a crash of the defaults). Seed 1 starts the
    defaults' side first; its 1 s (the least a process is given) is less than a fresh process takes to import torch
    and train ``slow``'s 8 steps of 40 ms (``tiny`` in 1.5 s finished here: a Zen 5 VM, torch in the page cache)."""
    import time

    from autotune.measure.live.candidate import LiveTrial

    base = _params(facts, 64)
    trial = LiveTrial({**base, "threads": 1}, "c1", 1, time.monotonic())
    trial.fresh_pairs(1, "tests.quality_workloads:slow", base, facts, SETTINGS, time.monotonic() + 0.5,
                      lambda name, detail: None)
    assert trial.failed is not None and trial.failed.status == "timeout", trial.failed
    assert trial.failed.error.startswith("the defaults failed in a fresh process: ") and not trial.fresh


@pytest.mark.parametrize("case", ["a run failed", "the budget's end"])
def test_a_pair_of_your_runs_is_whole_and_within_the_time_it_was_given(facts: Any, case: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A pair of your runs for the claim (``user_pair``) whose recipe's process ran out of memory is no pair; one
    given 1 s stops at its first process's start, its trial process ended there."""
    import time

    from autotune.measure import LiveMeasurer, PairFailed
    from autotune.trial import runner
    from autotune.trial.spec import Status, TrialResult

    base = _params(facts, 32)
    measurer = LiveMeasurer("tiny", base, facts, SETTINGS, profile_s=0.0)
    if case == "a run failed":
        def run_trial(workload: str, params: dict[str, Any], *args: Any, **kwargs: Any) -> TrialResult:
            if params == base:
                return TrialResult(Status.OK, samples_per_s=100.0, timed_s=1.0)
            return TrialResult(Status.OOM, error="out of memory")
        monkeypatch.setattr(runner, "run_trial", run_trial)
    started = time.monotonic()
    try:
        with pytest.raises(PairFailed) as failed:
            measurer.user_pair({**base, "channels_last": True}, 0, 1.0)
    finally:
        measurer.close()
    if case == "a run failed":
        assert str(failed.value) == "the recipe's run: oom: out of memory"
    else:
        assert time.monotonic() - started < 10.0 and "timeout" in str(failed.value), failed.value


def too_short(measurer: Any, key: str, left_s: float) -> str | None:
    """Why a candidate of environment ``key`` would not start with ``left_s`` seconds left
    (``EnvironmentFactors.too_short`` with the measurer's calibration)."""
    import time

    return measurer.environments.too_short(key, time.monotonic() + left_s, measurer.calibration, measurer.noise)
