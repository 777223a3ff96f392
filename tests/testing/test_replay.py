"""A recorded paired grid and ReplayMeasurer: the PairedMeasurer protocol answered from the file."""
from __future__ import annotations

import inspect
import itertools
import json
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.errors import AutotuneError
from autotune.measure import Noise, PairedMeasurer, combine, stats
from autotune.measure.live.candidate import round_factor
from autotune.testing.grid import GridConfig, GridMiss, RecordedGrid
from autotune.testing.replay import ReplayMeasurer
from autotune.trial.spec import Status, TrialResult

REPO = Path(__file__).resolve().parents[2]
DEFAULTS = {"threads": 2, "batch_size": 64, "channels_last": False, "affinity": "none", "device": "cpu"}
NOISE = {"window_s": 0.3, "pairs": 8, "half_width": 0.03, "margin": 0.02, "spread": 0.08,
         "aa": [1.0, 0.97, 1.03], "timed_s": 4.8, "wall_s": 9.0}
FAST = [1.20 + i / 100 for i in range(12)]  # 1.20 .. 1.31
AA = [0.96 + i / 100 for i in range(9)]  # 0.96 .. 1.04
FACTORS = [0.5, 0.55, 0.6]


def _grid() -> RecordedGrid:
    return RecordedGrid(
        workload="cnn", searched=["threads", "batch_size", "channels_last"], defaults=DEFAULTS, noise=NOISE,
        configs=[
            GridConfig({"threads": 2, "batch_size": 64, "channels_last": False}, ratios=AA, loss=1.0,
                       loss_samples=1792, window_s=0.3),
            GridConfig({"threads": 2, "batch_size": 64, "channels_last": True}, ratios=FAST, loss=1.01,
                       loss_samples=1792, window_s=0.3, warmup_s=2.0, step_s=0.05),
            GridConfig({"threads": 1, "batch_size": 64, "channels_last": True}, ratios=[2.0] * 8,
                       process_pair_factors=FACTORS, loss=1.0, loss_samples=1792, window_s=0.3),
            GridConfig({"threads": 1, "batch_size": 64, "channels_last": False}, ratios=AA,
                       process_pair_factors=FACTORS, loss=1.0, loss_samples=1792, window_s=0.3),
            GridConfig({"threads": 2, "batch_size": 256, "channels_last": False}, ratios=[3.0] * 8, loss=1.5,
                       loss_samples=1792),  # fast, but its loss is 50% worse: infeasible
            GridConfig({"threads": 2, "batch_size": 128, "channels_last": False}, "oom", "CUDA out of memory",
                       loss=None),
            GridConfig({"threads": 2, "batch_size": 32, "channels_last": False}, "nan", "the loss became nan",
                       ratios=[1.1, 1.2, 1.15]),  # failed after 3 pairs
        ],
        note="synthetic: the test's own figures")


def test_it_answers_the_paired_measurer_protocol() -> None:
    for name in ("calibrate", "begin", "more", "end", "close"):
        ours = inspect.signature(getattr(ReplayMeasurer, name))
        theirs = inspect.signature(getattr(PairedMeasurer, name))
        assert list(ours.parameters) == list(theirs.parameters), name
        assert ours.return_annotation == theirs.return_annotation, name
    noise = ReplayMeasurer(_grid()).calibrate(60.0)
    assert isinstance(noise, Noise) and noise.aa == (1.0, 0.97, 1.03) and noise.pairs == 8
    assert noise.note().startswith("identical arms in one process spread over 8.0% (A/A, max - min)")


def test_more_hands_out_recorded_ratios_in_a_seeded_order_and_never_more_than_recorded() -> None:
    grid = _grid()
    m = ReplayMeasurer(grid, seed=3)
    h = m.begin({**DEFAULTS, "channels_last": True}, 60.0)
    assert not isinstance(h, TrialResult)
    first = m.more(h, 4, 60.0)
    drawn = list(h.drawn)  # type: ignore[attr-defined]
    searched = sorted(grid.configs[1].split(False, 3)[0])
    assert len(drawn) == 4 and set(drawn) <= set(searched) and first == stats.median_interval(drawn)
    everything = m.more(h, 100, 60.0)  # 12 recorded, 6 the search's: no interval claims more
    assert everything.count == 6 and sorted(h.drawn) == searched  # type: ignore[attr-defined]
    again = ReplayMeasurer(grid, seed=3)
    h2 = again.begin({**DEFAULTS, "channels_last": True}, 60.0)
    again.more(h2, 4, 60.0)
    assert h2.drawn == drawn  # type: ignore[attr-defined]  # the same seed draws the same
    orders = set()
    for seed in range(6):
        other = ReplayMeasurer(grid, seed=seed)
        handle = other.begin({**DEFAULTS, "channels_last": True}, 60.0)
        other.more(handle, 4, 60.0)
        orders.add(tuple(handle.drawn))  # type: ignore[attr-defined]
    assert len(orders) > 1  # another seed, another draw
    h3 = m.begin({**DEFAULTS, "channels_last": True}, 60.0)  # begun again in the search: another order
    m.more(h3, 12, 60.0)
    assert h3.order != h.order and sorted(h3.order) == searched  # type: ignore[attr-defined]


def test_the_search_and_the_confirmation_split_the_recording_at_random_not_by_its_order() -> None:
    """Pairs are recorded in time order, and a VM holds a speed for minutes: a split by order (every other ratio,
    the first process pairs to the search) handed one side a speed state. The split is a seeded draw: half the
    ratios each, disjoint, and every replay seed its own."""
    config = GridConfig({"threads": 1}, ratios=FAST, process_pair_factors=[0.8, 0.9, 1.0, 0.5, 0.6, 1.4, 1.5, 1.1])
    splits = set()
    for seed in range(20):
        (ours, our_factors), (theirs, their_factors) = config.split(False, seed), config.split(True, seed)
        assert sorted(ours + theirs) == FAST and len(ours) == len(theirs) == 6
        assert sorted(our_factors + their_factors) == sorted(config.process_pair_factors) and len(our_factors) == 3
        assert config.split(False, seed) == (ours, our_factors)  # the same seed, the same split
        splits.add((tuple(sorted(ours)), tuple(sorted(our_factors))))
    assert len(splits) == 20 and (tuple(FAST[0::2]), (0.8, 0.9, 1.0)) not in splits


def test_a_confirmation_draws_only_what_the_search_did_not_see() -> None:
    """The winner's curse must be able to show in replay: after ``reseed`` (the confirmation) a combination's
    ratios are the other half of those recorded, and its environment's factor is the process pair the search
    did not draw, its spread lent by the search's pairs (``candidate.round_factor``)."""
    grid = _grid()
    m = ReplayMeasurer(grid, seed=0)
    searched = m.begin({**DEFAULTS, "channels_last": True}, 60.0)
    m.more(searched, 100, 60.0)
    m.reseed(5)
    first = m.begin({**DEFAULTS, "channels_last": True}, 60.0)
    iv = m.more(first, 4, 60.0)
    drawn = first.drawn  # type: ignore[attr-defined]
    assert set(drawn) <= set(grid.configs[1].split(True, 0)[0]) and not set(drawn) & set(searched.drawn)  # type: ignore[attr-defined]
    assert iv == stats.median_interval(drawn) and len(drawn) == 4
    # the next round draws what the first left, never a pair twice: 6 held out, 4 drawn, 2 left, then none
    second = m.begin({**DEFAULTS, "channels_last": True}, 60.0)
    assert m.more(second, 100, 60.0).count == 2 and not set(second.drawn) & set(drawn)  # type: ignore[attr-defined]
    third = m.begin({**DEFAULTS, "channels_last": True}, 60.0)
    assert isinstance(third, TrialResult) and third.status == Status.SKIPPED
    assert "no more held-out" in (third.error or "")
    held = grid.configs[3].split(True, 0)[1]
    factor = m.begin({**DEFAULTS, "threads": 1}, 60.0)
    own = m.more(factor, 8, 60.0)
    searched_factors = grid.configs[3].split(False, 0)[1]
    assert held == [factor.held] and own == round_factor(held[0], searched_factors, None)  # type: ignore[attr-defined]


def test_each_confirmation_round_draws_one_of_the_held_out_process_pairs() -> None:
    """A live round's process pair is fresh each time, so rounds of an environment vary as processes do. With one
    fixed held-out pair every round agreed: the CNN grid's environments were confirmed at ~2.1x where all their
    recorded pairs read 1.47x. Eight recorded pairs: the search draws on three (a live search's first round), the
    rounds one of the other five each, never one the search saw nor one an earlier round took; a sixth round is
    skipped (a bootstrap drew pairs again and counted them as new)."""
    factors = [0.8, 0.9, 1.0, 0.5, 0.6, 1.4, 1.5, 1.1]
    grid = _grid()
    grid = replace(grid, configs=[replace(c, process_pair_factors=factors) if c.process_pair_factors else c
                                  for c in grid.configs])
    m = ReplayMeasurer(grid, seed=0)
    searched = m.begin({**DEFAULTS, "threads": 1}, 60.0)
    ours = grid.configs[3].split(False, 0)[1]
    assert m.more(searched, 8, 60.0) == stats.log_mean_interval(ours) and len(ours) == 3
    held = []
    for round_seed in range(5):
        m.reseed(round_seed)
        h = m.begin({**DEFAULTS, "threads": 1}, 60.0)
        iv = m.more(h, 8, 60.0)
        held.append(h.held)  # type: ignore[attr-defined]
        assert iv == round_factor(h.held, ours, None)  # type: ignore[attr-defined]
    assert sorted(held) == sorted(set(factors) - set(ours))  # five rounds, five held-out pairs, each once
    m.reseed(5)
    assert m.begin({**DEFAULTS, "threads": 1}, 60.0).status == Status.SKIPPED  # type: ignore[union-attr]
    # the grid's own score of a combination is everything recorded: all eight pairs (it was all but the last)
    scored = grid.scores()[grid.key({"threads": 1, "batch_size": 64, "channels_last": True})]
    assert scored == pytest.approx(combine(stats.log_mean_interval(factors), [2.0] * 8).median)


def test_another_environment_whose_process_pairs_do_not_fit_is_not_started() -> None:
    """As live (``EnvironmentFactors.too_short``): a candidate of another environment whose process pairs would
    outlast the trial's time is skipped, nothing charged; a 2-minute replay of the CNN grid recorded with 8 pairs
    of 9.5 s each otherwise started them late and ran to 138 s."""
    from autotune.testing.replay import ReplayClock

    grid = replace(_grid(), recorded={"process_pair_s": 10.0})
    clock = ReplayClock()
    m = ReplayMeasurer(grid, seed=0, clock=clock)
    skipped = m.begin({**DEFAULTS, "threads": 1}, 15.0)  # its search's two recorded pairs: 20 s
    assert isinstance(skipped, TrialResult) and skipped.status == "skipped" and "2 process pair" in skipped.error
    assert clock.charged == 0.0
    started = m.begin({**DEFAULTS, "threads": 1}, 25.0)
    assert not isinstance(started, TrialResult) and clock.charged == pytest.approx(20.0)
    m.reseed(3)  # a confirmation round: admitted by the confirmation's estimate, its one pair runs
    round_ = m.begin({**DEFAULTS, "threads": 1}, 5.0)
    assert not isinstance(round_, TrialResult) and clock.charged == pytest.approx(30.0)


def test_end_gives_the_trial_result_of_the_drawn_pairs() -> None:
    m = ReplayMeasurer(_grid(), seed=0)
    h = m.begin({**DEFAULTS, "channels_last": True}, 60.0)
    iv = m.more(h, 8, 60.0)
    result = m.end(h)
    assert result.status == Status.OK and result.method == "in-process pairs" and result.pairs == 6
    assert (result.objective, result.speedup_low, result.speedup_high) == (iv.median, iv.low, iv.high)
    assert 1.2 <= iv.low <= iv.median <= iv.high <= 1.31
    assert (result.loss, result.loss_samples, result.warmup_s) == (1.01, 1792, 2.0)
    assert result.timed_s == pytest.approx(6 * (0.3 + 0.3))


def test_another_environment_multiplies_its_process_pair_factor() -> None:
    m = ReplayMeasurer(_grid(), seed=0)
    h = m.begin({**DEFAULTS, "threads": 1, "channels_last": True}, 60.0)
    iv = m.more(h, 8, 60.0)
    env = stats.log_mean_interval(_grid().configs[2].split(False, 0)[1])  # one of three is the confirmation's
    assert iv == combine(env, [2.0] * 4)
    assert iv.median == pytest.approx(2 * env.median) and iv.low < iv.median < iv.high
    assert m.end(h).method == "process pairs x in-process pairs"
    only = m.begin({**DEFAULTS, "threads": 1}, 60.0)  # that environment's defaults: the factor alone, as live
    assert m.more(only, 8, 60.0) == env
    assert (m.end(only).method, m.end(only).objective, m.end(only).pairs) == ("process pairs", env.median, 2)


def test_the_baseline_is_the_calibrations_aa_as_live() -> None:
    m = ReplayMeasurer(_grid(), seed=0)
    noise = m.calibrate(60.0)
    h = m.begin(dict(DEFAULTS), 60.0)
    result = m.end(h)  # the loop ends the baseline without asking for pairs
    assert result.status == Status.OK and (result.objective, result.speedup_low, result.speedup_high) == noise.aa
    assert result.pairs == len(AA) and result.loss == 1.0 and result.timed_s == NOISE["timed_s"]
    nothing = m.begin({**DEFAULTS, "channels_last": True}, 60.0)
    assert m.end(nothing).status == Status.CRASH  # a candidate no pair was asked for: no speedup invented
    m.reseed(11)
    assert m.seed == 11


def test_failures_replay_as_recorded() -> None:
    m = ReplayMeasurer(_grid(), seed=0)
    oom = m.begin({**DEFAULTS, "batch_size": 128}, 60.0)
    assert isinstance(oom, TrialResult) and oom.status == Status.OOM and oom.error == "CUDA out of memory"
    h = m.begin({**DEFAULTS, "batch_size": 32}, 60.0)
    assert m.more(h, 8, 60.0).count == 2  # the pairs before it failed (the search's: every other one)
    nan = m.end(h)
    assert nan.status == Status.NAN and nan.error == "the loss became nan" and nan.objective is None


def test_a_knob_renamed_since_the_recording_is_read_under_its_new_name() -> None:
    grid = _grid()
    today = {k: v for k, v in {**DEFAULTS, "channels_last": True}.items() if k != "batch_size"}
    handle = ReplayMeasurer(grid).begin({**today, "batch_per_rank": 64}, 60.0)  # recipe format 2's name
    assert handle.config.params == {"threads": 2, "batch_size": 64, "channels_last": True}  # type: ignore[attr-defined]
    assert grid.searched_names() == {"threads", "batch_size", "batch_per_rank", "channels_last"}


def test_a_combination_outside_the_grid_is_named() -> None:
    grid = _grid()
    with pytest.raises(GridMiss, match="not in the recorded grid: threads=2, batch_size=16, channels_last=False"):
        ReplayMeasurer(grid).begin({**DEFAULTS, "batch_size": 16}, 60.0)
    with pytest.raises(GridMiss, match=r"holds these knobs fixed: affinity='compact' \(grid: 'none'\)"):
        ReplayMeasurer(grid).begin({**DEFAULTS, "affinity": "compact"}, 60.0)


def test_the_grids_scores_leave_out_failures_and_worse_losses(tmp_path: Path) -> None:
    path = tmp_path / "grid.json"
    _grid().save(path)
    grid = RecordedGrid.load(path)
    assert grid == _grid()  # every recorded figure survives the file
    scores = grid.scores(max_loss_increase=0.05)
    assert set(scores) == {(2, 64, False), (2, 64, True), (1, 64, True), (1, 64, False)}  # not OOM, NaN, worse loss
    assert scores[(2, 64, True)] == statistics.median(FAST) and scores[(2, 64, False)] == 1.0  # the reference
    assert (2, 256, False) in grid.scores()  # without the guard: every configuration that measured
    (tmp_path / "other.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(AutotuneError, match="not a recorded paired grid"):
        RecordedGrid.load(tmp_path / "other.json")


GRID = REPO / "benchmarks" / "grids" / "cnn-paired.json"


@pytest.mark.skipif(not GRID.exists(), reason="the recorded grid is not in this checkout")
def test_the_recorded_cnn_grid_holds_every_combination_once_with_its_pairs() -> None:
    grid = RecordedGrid.load(GRID)
    keys = [grid.key(c.params) for c in grid.configs]
    values = [sorted({k[i] for k in keys}, key=str) for i in range(len(grid.searched))]
    assert len(keys) == len(set(keys)) == len(list(itertools.product(*values))) >= 48
    home = tuple(grid.defaults[k] for k in ("threads", "interop_threads"))
    for c in grid.configs:
        assert c.state != "ok" or len(c.ratios) >= 6, c.params
        other_env = (c.params["threads"], c.params["interop_threads"]) != home
        assert (len(c.process_pair_factors) >= 3) == other_env, c.params
    assert grid.key(grid.defaults) in grid.scores() and "load average" in grid.note and grid.recorded["loadavg"]


def test_the_baseline_says_how_much_of_its_step_waited_for_data_as_recorded() -> None:
    """The search seeds DataLoader workers first where the defaults wait for data (``turns.seed_the_input``): a
    replay must hand the recorded share on, or an input-bound grid replays a search that never saw it."""
    from dataclasses import replace

    grid = _grid()
    grid = replace(grid, configs=[replace(grid.configs[0], data_wait=0.95), *grid.configs[1:]])
    m = ReplayMeasurer(grid, seed=0)
    m.calibrate(60.0)
    assert m.end(m.begin(dict(DEFAULTS), 60.0)).data_wait == 0.95
    unrecorded = ReplayMeasurer(_grid(), seed=0)  # a grid recorded before: none, and no input seeds
    assert unrecorded.end(unrecorded.begin(dict(DEFAULTS), 60.0)).data_wait is None


def test_the_heuristic_is_scored_as_itself_or_reported_missing() -> None:
    """The run_cpu-style heuristic sets affinity, OpenMP runtime and allocator, which every recorded grid holds
    fixed: it was scored as the grid cell sharing its threads and batch (another recipe's figure), and a heuristic
    outside the feasible cells scored 0.0 silently."""
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    from search_quality import score_heuristic

    grid = _grid()
    scores = grid.scores(0.05)
    pinned = {**DEFAULTS, "channels_last": True, "affinity": "compact", "allocator": "tcmalloc"}
    assert score_heuristic(grid, scores, pinned, DEFAULTS) == (
        None, "not in the grid (it sets affinity='compact', allocator='tcmalloc')")
    itself = {**DEFAULTS, "channels_last": True}
    share, said = score_heuristic(grid, scores, itself, DEFAULTS)
    assert share == pytest.approx(scores[grid.key(itself)] / max(scores.values())) and said == f"{share:.3f}"
    infeasible = {**DEFAULTS, "batch_size": 256}  # its loss 50% worse: no score, and said so
    assert score_heuristic(grid, scores, infeasible, DEFAULTS) == (None, "not feasible in the grid")


def test_an_environment_looked_at_keeps_its_factor_and_worker_as_live() -> None:
    """As live (``WorkerPool``, ``EnvironmentFactors``): a later candidate of an environment whose first look ran its
    process pairs runs none again at its start, in that environment's worker while no other's replaced it (else one
    worker start), and is warm for the search's pricing; a later round of its race adds one pair while the pilot's
    spread asks for more; a confirmation round runs one process pair an environment, however many of its candidates
    share it, and starts a worker again where another environment's came between. Charged the first look's pairs
    again, a 2-minute replay never reached the combination a live search measures as an arm."""
    from autotune.testing.replay import ReplayClock

    six = [0.5, 0.55, 0.6, 0.52, 0.57, 0.58]  # 3 for the search's first look, 3 held out for the rounds
    grid = replace(_grid(), recorded={"process_pair_s": 10.0}, configs=[
        *(c for c in _grid().configs if c.params["threads"] == 2),
        *(GridConfig({"threads": threads, "batch_size": 64, "channels_last": cl}, ratios=[2.0] * 8 if cl else AA,
                     process_pair_factors=six, loss=1.0, loss_samples=1792, window_s=0.3)
          for threads, cl in ((1, False), (1, True), (3, False)))])
    clock = ReplayClock()
    m = ReplayMeasurer(grid, seed=0, clock=clock)
    one, combined, three = ({**DEFAULTS, "threads": t, "channels_last": cl} for t, cl in ((1, False), (1, True),
                                                                                           (3, False)))
    assert m.warm({**DEFAULTS, "channels_last": True}) and not m.warm(combined)
    m.begin(one, 60.0)  # its first look: the search's three process pairs
    assert clock.charged == pytest.approx(30.0) and m.warm(combined)
    handle = m.begin(combined, 60.0)
    assert clock.charged == pytest.approx(30.0)
    m.more(handle, 4, 60.0)  # its race's first round: its four pairs of 0.3 s windows
    m.more(handle, 4, 60.0)  # a later one: one more process pair (three do not settle it), no window left
    assert clock.charged == pytest.approx(30.0 + 2.4 + 10.0)
    m.begin(three, 60.0)  # another environment's first look replaces its worker
    assert clock.charged == pytest.approx(72.4) and not m.warm(combined)
    m.begin(combined, 60.0)  # a worker's start: (10 - 2 x 4 x 0.3) / 2
    assert clock.charged == pytest.approx(76.2) and m.warm(combined)
    for round_, order, charged in ((1, (one, combined, three), 20.0), (2, (one, three, combined), 23.8)):
        m.reseed(round_)
        before = clock.charged
        for params in order:
            m.begin(params, 60.0)
        assert clock.charged - before == pytest.approx(charged), order


def test_an_environment_trials_time_holds_its_process_pairs_and_its_factor_counts_them_as_live() -> None:
    """As live, where the search prices a round or a trial from one (``reserve.floors``, ``costs.round_parts``,
    ``budget.in_process_estimate_s``, ``Confirmation.took``): a trial of another environment holds in its wall the
    process pairs or the worker's start charged to it, the pairs' windows timed and the rest start-up; the defaults
    of that environment count every pair charged to it (the factor is pooled by environment), though the search's
    share of the recording holds fewer; a failed trial keeps what it spent; and a grid whose noise holds no worker's
    start gives the one its recorded process pair implies, as a live calibration measures one. Priced from windows
    and the calibration's wall alone, a 2-minute replay of the input-bound grid kept a round 8 s where it took 11."""
    from autotune.measure import FACTOR
    from autotune.testing.replay import ReplayClock

    six = [0.5, 0.55, 0.6, 0.52, 0.57, 0.58]
    grid = replace(_grid(), recorded={"process_pair_s": 10.0}, configs=[
        *(c for c in _grid().configs if c.params["threads"] == 2),
        *(GridConfig({"threads": threads, "batch_size": 64, "channels_last": cl}, ratios=[2.0] * 8 if cl else AA,
                     process_pair_factors=six, loss=1.0, loss_samples=1792, window_s=0.3, warmup_s=1.5)
          for threads, cl in ((1, False), (1, True), (3, False))),
        GridConfig({"threads": 3, "batch_size": 64, "channels_last": True}, "nan", "the loss became nan",
                   ratios=[1.1, 1.2], process_pair_factors=six, warmup_s=1.5)])
    m = ReplayMeasurer(grid, seed=0, clock=ReplayClock(frozen=True))
    start = (10.0 - 2 * 4 * 0.3) / 2
    assert m.calibrate(60.0).start_s == pytest.approx(start)
    recorded = replace(grid, noise={**NOISE, "start_s": 1.25})
    assert ReplayMeasurer(recorded, seed=0).calibrate(60.0).start_s == 1.25
    assert ReplayMeasurer(_grid(), seed=0).calibrate(60.0).start_s is None  # no process pair recorded: unknown

    one, combined, three, failing = ({**DEFAULTS, "threads": t, "channels_last": cl}
                                     for t, cl in ((1, False), (1, True), (3, False), (3, True)))
    handle = m.begin(one, 60.0)  # its first look: the search's three process pairs
    m.more(handle, 4, 60.0)
    m.more(handle, 4, 60.0)  # three do not settle it: a fourth
    factor = m.end(handle)
    pair_windows = 4 * 2 * 4 * 0.3
    assert factor.method == FACTOR and factor.pairs == 4
    assert (factor.wall_s, factor.startup_s, factor.timed_s) == pytest.approx((1.5 + 40.0, 40.0 - pair_windows,
                                                                               pair_windows))
    handle = m.begin(combined, 60.0)  # its environment's worker alive: nothing of it charged
    m.more(handle, 4, 60.0)
    assert (m.end(handle).wall_s, m.end(handle).startup_s) == pytest.approx((1.5 + 4 * 0.6, 0.0))
    handle = m.begin(failing, 60.0)  # another environment's first look, then its loss fails
    m.more(handle, 2, 60.0)
    failed = m.end(handle)
    assert failed.status == Status.NAN and (failed.wall_s, failed.startup_s, failed.timed_s, failed.warmup_s) == \
        pytest.approx((31.5, 30.0 - 3 * 2.4, 3 * 2.4, 1.5))
    handle = m.begin(combined, 60.0)  # its worker replaced since: started again
    m.more(handle, 4, 60.0)
    assert (m.end(handle).wall_s, m.end(handle).startup_s) == pytest.approx((1.5 + start + 4 * 0.6, start))
    m.reseed(1)
    handle = m.begin(one, 60.0)  # a round: one held-out process pair
    assert m.end(handle).wall_s == pytest.approx(1.5 + 10.0)


def test_a_frozen_replay_clock_counts_the_recorded_time_alone() -> None:
    """``search_quality.py --frozen-clock``: two replays of one seed decided differently where the search's own time
    (a second or a few, longer on a loaded machine) moved a decision near a limit; a frozen clock moves only by what
    the replay charges, so a before/after comparison of a change sees the change alone."""
    import time

    from autotune.testing.replay import ReplayClock

    live, frozen = ReplayClock(), ReplayClock(frozen=True)
    start = frozen.monotonic()
    time.sleep(0.02)
    assert frozen.monotonic() == start and live.monotonic() > 0.0
    frozen.charge(12.5)
    assert frozen.monotonic() == start + 12.5
