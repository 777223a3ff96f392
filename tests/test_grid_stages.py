"""The search benchmark's two stages (issue 58, item 1): the screen visits every environment in more than one
worker, in random order, and resumes; the verification re-measures the cells that decide a score, says when a cell
counts as verified, and a replay is scored against it, not against the screen it drew from."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import grid_screen as gs  # noqa: E402 - the benchmark's stages under test
import search_quality as sq  # noqa: E402
import verify_grid as vg  # noqa: E402

from autotune.testing.grid import GridConfig, RecordedGrid  # noqa: E402
from autotune.testing.replay import ReplayMeasurer  # noqa: E402

ZEN4 = BENCHMARKS / "grids" / "cnn-paired-zen4.json"


def _lines(path: Path, cell: vg.Cell, session: str, start: float, ratios: list[float | None]) -> None:
    with path.open("a") as f:
        for i, r in enumerate(ratios):
            row = {"label": cell.label, "key": list(cell.key), "changes": cell.changes, "session": session,
                   "ratio": r, "unix": start + 60 * i}
            f.write(json.dumps({**row, **({"failed": "crash"} if r is None else {})}) + "\n")


def test_the_cells_that_may_be_the_best_and_every_returned_recipe_are_verified_once() -> None:
    """The Zen 4 grid's best (1.85x) rests on one arm's reading; every cell whose upper bound reaches its lower
    bound is a contender, the defaults are the A/A, the heuristic is measured as itself, and a returned recipe
    already among them is not measured twice."""
    grid = RecordedGrid.load(ZEN4)
    scores = grid.scores(0.05)
    interval = lambda k: sq._interval(grid, k)  # noqa: E731
    best = max(scores, key=lambda k: scores[k])
    returned = [dict(zip(grid.searched, best, strict=True)),
                {"threads": 2, "interop_threads": 2, "amp_dtype": "bfloat16", "batch_per_rank": 64,
                 "channels_last": True}]
    cells = vg.choose(grid, scores, interval, {"affinity": "compact"}, returned)
    names = [c.name for c in cells]
    assert len(names) == len(set(names))
    assert [c.label for c in cells[:2]] == ["defaults", "heuristic"] and cells[1].changes == {"affinity": "compact"}
    keys = {c.key for c in cells if c.label == "cell"}
    floor = interval(best)[0]
    home = grid.key(grid.defaults)
    assert keys == {k for k in scores if k != home and interval(k)[1] >= floor} | {grid.key(r) for r in returned}
    assert any(interval(k)[1] < floor for k in keys)  # the returned 1.40x: below the contenders, verified anyway


def test_a_cell_is_verified_with_16_pairs_from_two_sessions_an_hour_apart_that_agree(tmp_path: Path) -> None:
    out = tmp_path / "v.jsonl"
    cell = vg.Cell("cell", (2, 1), {"threads": 2, "interop_threads": 1})
    _lines(out, cell, "s1", 0.0, [1.18, 1.22] * 4)
    _lines(out, cell, "s2", 1800.0, [1.18, 1.22] * 3 + [1.2, None])
    with out.open("a") as f:
        f.write('{"label": "cell", "key": [2, 1], "changes": {}, "session": "s2", "rat')  # torn by a stop
    vg.append_line(out, {"label": "cell", "key": [2, 1], "changes": cell.changes, "session": "s2", "ratio": 1.2,
                         "unix": 1900.0})  # written after the torn line, not onto it
    v = vg.read(out)[cell.name]
    assert len(v.ratios) == 16 and v.failed == {"s2": 1} and v.status() == "partial"  # 30 minutes apart
    assert vg._to_run([cell], {cell.name: v}, "s2", 9) == {}  # the failed pair counts as run: no endless retry
    assert vg._to_run([cell], {cell.name: v}, "s3", 8) == {cell.name: 8}
    _lines(out, cell, "s3", 3600.0, [1.19, 1.21] * 4)
    v = vg.read(out)[cell.name]
    t, low, high = v.truth()
    assert v.status() == "verified" and low < t < high and v.session_means()["s1"] == pytest.approx(1.2, rel=1e-3)
    fresh = vg.Cell("cell", (1, 1), {"threads": 1, "interop_threads": 1})
    assert vg._to_run([cell, fresh], {cell.name: v}, "s4", 8, unsettled_only=True) == {fresh.name: 8}
    assert vg.truth_of({cell.name: v})[(2, 1)][3:] == ("verified", 1)
    assert vg.read(out, grid="cnn@another recording") == {}  # rows of another recording at this path: not this one
    far = tmp_path / "far.jsonl"
    _lines(far, cell, "s1", 0.0, [1.18, 1.22] * 4)
    _lines(far, cell, "s2", 7200.0, [1.48, 1.52] * 4)  # a machine state an hour later: pooled, it would be +-10%
    assert vg.read(far)[cell.name].status() == "sessions disagree"
    _lines(far, cell, "s3", 10800.0, [1.33, 1.35] * 4)  # a third: T over the sessions' means, their interval
    v = vg.read(far)[cell.name]
    t, low, high = v.truth()
    assert v.status() == "verified" and v.over_sessions()
    assert t == pytest.approx((1.2 * 1.5 * 1.34) ** (1 / 3), rel=1e-3)
    assert low < 1.2 and high > 1.5  # t with 2 degrees of freedom over three means: wider than any session's
    assert vg._to_run([cell], {cell.name: v}, "s4", 8, unsettled_only=True) == {cell.name: 8}  # more narrow it
    six = tmp_path / "six.jsonl"  # six sessions within 3.5%: one pair of them tested alone at 95% would disagree
    for i, mean in enumerate([1.0, 1.035, 1.015, 1.015, 1.02, 1.01]):
        _lines(six, cell, f"s{i}", 3600.0 * i, [mean * 0.98, mean * 1.02] * 4)
    v = vg.read(six)[cell.name]
    assert v.status() == "verified" and not v.over_sessions() and len(v.ratios) == 48
    lopsided = tmp_path / "lopsided.jsonl"
    _lines(lopsided, cell, "s1", 0.0, [1.2] * 15)
    _lines(lopsided, cell, "s2", 7200.0, [1.2])
    assert vg.read(lopsided)[cell.name].status() == "partial"  # one pair is no session


def test_a_replay_is_scored_against_the_verified_truth_not_the_screen(tmp_path: Path) -> None:
    """Verified, the screen's 1.85x best reads 1.45x and a 1.40x cell 1.43x: T* is the verified best, and the cell
    the replays return scores near-optimal, where the screen's own figures scored it 0.54. One session is not
    verified: the screen stays the truth, and says so."""
    grid = RecordedGrid.load(ZEN4)
    truth, scores = grid.scores(), grid.scores(0.05)
    best = max(scores, key=lambda k: scores[k])
    other = grid.key({**grid.defaults, "amp_dtype": "bfloat16", "channels_last": True})
    out = tmp_path / "v.jsonl"

    def session(name: str, start: float) -> None:
        for key, ratios in ((best, [1.40, 1.50, 1.45, 1.45]), (other, [1.42, 1.44, 1.43, 1.43])):
            _lines(out, vg.Cell("cell", key, dict(zip(grid.searched, key, strict=True))), name, start, ratios * 2)
    session("s1", 0.0)
    same, t_star, _, keys, said = sq.held_out_truth(grid, vg.truth_of(vg.read(out)), truth, best, 0.05)
    assert same == truth and t_star == truth[best] and not keys and "none verified" in said
    assert "provisional" in sq.held_out_truth(grid, vg.truth_of(vg.read(out)), truth, best, 0.05, True)[4]
    session("s2", 3600.0)
    new, t_star, half, keys, said = sq.held_out_truth(grid, vg.truth_of(vg.read(out)), truth, best, 0.05)
    assert t_star == pytest.approx(1.45, rel=1e-3) and "held out: 2 cells" in said and 0 < half < 0.05
    assert keys == {best, other, grid.key(grid.defaults)}
    assert new[other] == pytest.approx(1.43, rel=1e-3) and new[grid.key(grid.defaults)] == 1.0
    assert sq.qm.gain(truth[other], truth[best]) < 0.6 < 0.9 < sq.qm.gain(new[other], t_star)
    assert sq.qm.near_optimal(new[other], t_star, half)
    assert sq.held_out_truth(grid, vg.truth_of(vg.read(out)), truth, best, 0.05, feasible={other})[1] == \
        pytest.approx(1.43, rel=1e-3)  # a cell the quality guard refuses is no T*, however fast


def test_the_screen_visits_every_environment_twice_in_random_order_after_the_calibration() -> None:
    envs = [(2, 2), (1, 1), (1, 2), (2, 1)]
    order = gs.visits(envs, (2, 2), workers=2, seed=3)
    assert order[0] == (2, 2) and sorted(order) == sorted(envs * 2)
    assert order != gs.visits(envs, (2, 2), workers=2, seed=4)  # the seed draws the order: not the grid's own
    assert [gs.shares(9, 2, i) for i in range(2)] == [5, 4] and [gs.shares(16, 2, i) for i in range(2)] == [8, 8]


def test_a_cell_merges_its_visits_and_one_failed_visit_fails_it() -> None:
    ok = GridConfig({"threads": 1}, ratios=[1.1, 1.2], loss=2.0, loss_samples=512, warmup_s=1.0, step_s=0.1)
    other = GridConfig({"threads": 1}, ratios=[1.3], loss=2.2, loss_samples=512, warmup_s=3.0, step_s=0.3)
    cell = gs.merge([ok, other], [0.9, 0.95, 1.0])
    assert cell.state == "ok" and cell.ratios == [1.1, 1.2, 1.3] and cell.process_pair_factors == [0.9, 0.95, 1.0]
    assert cell.loss == pytest.approx(2.1) and cell.warmup_s == pytest.approx(2.0) and cell.step_s == pytest.approx(0.2)
    failed = gs.merge([ok, GridConfig({"threads": 1}, "oom", "out of memory")], [0.9])
    assert failed.state == "oom" and failed.ratios == [1.1, 1.2]  # what ran before stays, the cell is infeasible


def test_a_cell_far_slower_in_its_warm_up_is_given_up_there_and_replays_as_failed() -> None:
    """float16 on a CPU without its kernels read 0.01x: 10 pairs and a loss of it took minutes a cell. The screen
    asks the worker to give up as the search does (``HOPELESS``, against the defaults' arm) and records why, no pairs
    run; the replay answers it as the search records it, far slower (it had answered a crash)."""
    from autotune.measure.hopeless import HOPELESS
    from autotune.measure.protocol import ArmStatus

    asked: list[tuple[str, dict[str, object]]] = []

    class Worker:  # the worker's side of a CPU where float16's steps are 120x slower (not this machine's)
        def add_arm(self, name: str, params: dict[str, object], **kw: object) -> ArmStatus:
            asked.append((name, kw))
            return ArmStatus(name, "ok", gave_up=120.0)

        def drop_arm(self, name: str) -> None:
            asked.append((f"drop {name}", {}))

        def run_pairs(self, *a: object, **kw: object) -> None:
            raise AssertionError("a cell given up runs no pairs")

    out = gs._record_arms(Worker(), {"amp_dtype": "float32"}, [{"amp_dtype": "float16"}], 10, 0.5, 24, 0)
    assert asked == [("c0", {"give_up": HOPELESS, "against": "defaults"}), ("drop c0", {})]
    assert out[0].state == "gave_up" and not out[0].ratios and "120x" in (out[0].error or "")
    replayed = ReplayMeasurer._failed(out[0])  # as the live search records it: far slower, not a crash
    assert replayed.status == "ok" and replayed.speedup_high == 1 / HOPELESS and replayed.pairs == 0, replayed


def test_a_stopped_screen_resumes_with_the_visits_not_done_and_refuses_other_options(tmp_path: Path) -> None:
    partial = tmp_path / "g.partial.jsonl"
    header = {"options": {"workload": "cnn", "pairs": 10}, "order": [[2, 2], [1, 1], [2, 1]], "noise": {}}
    partial.write_text(json.dumps(header) + "\n" + json.dumps({"visit": 0, "env": [2, 2], "configs": []}) + "\n"
                       + '{"visit": 1, "env": [1, 1], "conf')  # the second visit torn by a stop, no newline
    got, done = gs._resume(partial, {"options": {"workload": "cnn", "pairs": 10}})
    assert got == header and sorted(done) == [0]
    with partial.open("a") as f:  # the third visit, written after the resume: a line of its own
        f.write(json.dumps({"visit": 2, "env": [2, 1], "configs": []}) + "\n")
    got, done = gs._resume(partial, {"options": {"workload": "cnn", "pairs": 10}})
    assert sorted(done) == [0, 2]  # the torn one runs again, the third is not run twice
    with pytest.raises(SystemExit, match="other options"):
        gs._resume(partial, {"options": {"workload": "cnn", "pairs": 16}})
    # a session may run on another CPU model: its visits are never merged into one grid
    partial.write_text(json.dumps({**header, "fingerprint": "v3-e802a6ed303a"}) + "\n")
    assert gs._resume(partial, {"options": header["options"], "fingerprint": "v3-e802a6ed303a"})[0] is not None
    with pytest.raises(SystemExit, match="another machine"):
        gs._resume(partial, {"options": header["options"], "fingerprint": "v3-0123456789ab"})


def test_the_replayed_claim_draws_your_runs_from_the_verification_without_replacement() -> None:
    """A live search spends up to 40% of its budget on fresh process pairs of your runs, then the budget's end; the
    replay draws them from the verification (which the screen never saw), charges their time, never reuses one and
    never draws a recipe's last 2 (its truth); a pair that no longer fits is charged the time left, as a live one
    runs on until the budget's end stops it."""
    import math
    import statistics

    from autotune.measure import PairFailed
    from autotune.testing.replay import ReplayClock

    grid = RecordedGrid.load(ZEN4)
    params = {**grid.defaults, "amp_dtype": "bfloat16"}
    clock = ReplayClock()
    pool = [(1.3, 20.0, 8.0), (1.2, 18.0, 7.0), (1.1, 19.0, 7.5), (1.4, 21.0, 8.5), (1.25, 17.0, 7.2)]
    m = sq.WithYourRuns(grid, 0, clock, {}, {}, {grid.key(params): pool})
    noise = m.calibrate(60.0)
    assert noise.start_s is not None and 0 < noise.start_s < grid.recorded["process_pair_s"] / 2 and noise.run_s
    before = clock.charged
    drawn = [m.user_pair(params, i, 100.0) for i in range(3)]
    left = [p for p in pool if p[0] not in {d.ratio for d in drawn}]
    assert len(left) == 2 and clock.charged - before == pytest.approx(sum(d.wall_s for d in drawn))
    beside = math.exp(statistics.fmean(math.log(r) for r, _, _ in left))
    assert m.truth_beside(grid.key(params), 1.2) == pytest.approx(beside)  # scored by the pairs it did not draw
    with pytest.raises(PairFailed, match="keeps its last 2"):
        m.user_pair(params, 3, 100.0)
    cut = sq.WithYourRuns(grid, 0, clock, {}, {}, {grid.key(params): pool})
    before = clock.charged
    with pytest.raises(PairFailed, match="no time left"):
        cut.user_pair(params, 0, 5.0)
    assert clock.charged - before == pytest.approx(5.0)
    with pytest.raises(PairFailed, match="not re-measured"):
        m.user_pair({**grid.defaults, "channels_last": True}, 0, 100.0)


def test_an_option_the_replayed_search_refuses_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """``--confirm-rounds 0`` is refused as ``autotune search`` refuses it: its line and the usage, no traceback."""
    with pytest.raises(SystemExit) as stopped:
        sq.main(["--grid", str(ZEN4), "--seeds", "1", "--confirm-rounds", "0"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "error: --confirm-rounds must be at least 1 (got 0)" in err, err
    assert "Traceback" not in err


def test_an_environment_knob_grid_is_screened_by_its_environments_and_replayed_without_a_miss(
        facts: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The grids held the OpenMP runtime, the allocator and the affinity at their defaults (proposal k): a grid that
    searches them keys its environments by every environment-level knob it searches, records Intel's OpenMP at the
    heuristic's blocktime alone, and is replayed with the blocktime held there (the space offers 0, 1 and 200: any
    other value missed the grid) and GNU's seeds recorded without a blocktime. Here a synthetic grid of a machine with
    libiomp5 and tcmalloc (faked paths: not this machine's), whose best is Intel's OpenMP x tcmalloc x compact x the
    largest batch: the replay runs without a miss and returns it."""
    from dataclasses import replace

    from autotune import search_spaces as spaces
    from autotune.study import SearchOptions, run_settings, search_context
    from autotune.trial import TrialSettings

    runtime = replace(facts.runtime, openmp="gnu", iomp5_path="/opt/x/libiomp5.so", jemalloc_path=None,
                      tcmalloc_path="/usr/lib/x/libtcmalloc_minimal.so.4")
    machine = replace(facts, runtime=runtime)
    options = SearchOptions(budget_s=None, settings=TrialSettings(), compile=False)
    _, ctx = search_context("tiny", machine, options)
    searched = ("interop_threads", "openmp", "allocator", "affinity", "batch_size")
    combos = gs.combinations(sq._axes(machine, ctx, searched))
    assert gs.environment_keys(combos) == ("interop_threads", "openmp", "kmp_blocktime", "allocator", "affinity")
    assert {(c["openmp"], c["kmp_blocktime"]) for c in combos} == {("gnu", None), ("intel", 1)}
    defaults = {**spaces.defaults(machine, ctx), **run_settings(ctx, options)}
    home = {k: defaults[k] for k in gs.environment_keys(combos)}
    spread = (0.97, 0.98, 0.99, 1.0, 1.0, 1.01, 1.02, 1.03)
    configs = []
    for combo in combos:
        env = {k: combo[k] for k in home}
        factor = (1.15 if env["openmp"] == "intel" else 1.0) * (1.2 if env["allocator"] == "tcmalloc" else 1.0) \
            * (1.05 if env["affinity"] == "compact" else 1.0) * (0.95 if env["interop_threads"] == 1 else 1.0)
        inner = 1.1 ** math.log2(combo["batch_per_rank"] / ctx.default_batch_size)
        ratios = [inner * (1 + 0.01 * ((i * 7) % 5 - 2)) for i in range(48)]
        configs.append(GridConfig(combo, "ok", None, ratios, [factor * f for f in spread] if env != home else [],
                                  loss=1.0, loss_samples=512, window_s=0.3))
    keys = sq._searched_keys(searched)
    assert sq._names(keys) == searched
    grid = RecordedGrid("tiny", keys, defaults, {"window_s": 0.3, "pairs": 8, "half_width": 0.03, "margin": 0.02,
                                                  "spread": 0.06, "aa": [1.0, 0.98, 1.02], "timed_s": 4.8,
                                                  "wall_s": 9.0},
                        configs, note="synthetic, written by the test", recorded={"aa_pairs": 16},
                        facts=machine.to_dict())
    assert sq.narrowed(grid) == {"kmp_blocktime": 1}
    path = tmp_path / "env-grid.json"
    grid.save(path)
    sq.main(["--grid", str(path), "--seeds", "1", "--confirm", "1", "--confirm-rounds", "2", "--fraction", "0.1"])
    out = capsys.readouterr().out
    summary = json.loads(next(line for line in out.splitlines() if line.startswith('{"benchmark"')))
    returned = summary["returned"]["autotune"][0]
    assert set(summary["tested"]) == set(summary["returned"])  # what each strategy's claims tested, listed apart
    assert (returned["openmp"], returned["kmp_blocktime"], returned["allocator"]) == ("intel", 1, "tcmalloc"), out
    assert "GridMiss" not in out and "not in the recorded grid" not in out, out


def test_the_recipes_a_replayed_claim_tested_are_verified_too(tmp_path: Path) -> None:
    """A replayed claim draws your runs from the verification's pairs: a candidate it tests that the verification
    never re-measured fails there, where live it runs. So what the replays' claims tested is verified beside what
    they returned."""
    out = tmp_path / "replay.txt"
    summary = {"benchmark": "search_quality", "returned": {"autotune": [{"threads": 1}]},
               "tested": {"autotune": [{"threads": 2}, {"threads": 1}], "random": [{"threads": 4}]}}
    out.write_text("seed  0: ...\n" + json.dumps(summary) + "\n")
    assert vg.returned_recipes([out]) == [{"threads": 1}, {"threads": 2}, {"threads": 4}]
