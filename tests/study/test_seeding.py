"""What a study measures first (baseline, warm start, seeds, --fix), and the confirmation's verdict."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from autotune.cli.search import parse_fixes
from autotune.errors import UsageError
from autotune.recipe import Recipe
from autotune.search_spaces import SpaceContext, defaults
from autotune.store import RecipeStore
from autotune.study import Budget, SearchOptions
from autotune.study.seeds import enqueue_next_seed
from autotune.study.seeds import seeds as search_seeds

from ..stubs import StubMeasurer

CTX = SpaceContext(default_batch_size=32)


def _queued(study) -> list[tuple[str, dict]]:
    return [(t.user_attrs["role"], t.system_attrs["fixed_params"]) for t in study.get_trials(deepcopy=False)
            if t.state == optuna.trial.TrialState.WAITING]


def _measure_seeds(study, seeds, count: int) -> list[tuple[str, dict]]:
    """Ask and complete ``count`` trials as the search loop does: the next seed is enqueued before each ask."""
    order = []
    for _ in range(count):
        assert enqueue_next_seed(study, seeds)
        assert not enqueue_next_seed(study, seeds)  # one waits already: nothing more is queued
        trial = study.ask()
        frozen = study.get_trials(deepcopy=False)[trial.number]  # the live Trial does not show the fixed params
        order.append((frozen.user_attrs["role"], frozen.system_attrs["fixed_params"]))
        study.tell(trial, 1.0)
    return order


@pytest.mark.parametrize("stored_for", ["this", "other", None])
def test_the_stored_recipe_for_this_workload_and_hardware_comes_right_after_the_baseline(
        facts, tmp_path: Path, stored_for: str | None) -> None:
    storage = f"sqlite:///{tmp_path}/s.db"
    ctx = replace(CTX, conv=True)  # channels_last is a promising single change on every CPU
    recipe = {**defaults(facts, ctx), "batch_size": 64, "threads": 1, "device": "cpu", "reference_batch": 32}
    if stored_for:
        with RecipeStore.open(storage) as store:
            store.save(Recipe(params=recipe, workload="tiny",
                              fingerprint=facts.fingerprint if stored_for == "this" else "0123456789ab"))
    study = optuna.create_study(storage=storage)
    queued = _measure_seeds(study, search_seeds(facts, ctx, SearchOptions(storage=storage), "tiny"), 2)
    assert queued[0] == ("baseline", defaults(facts, ctx))
    if stored_for == "this":
        assert queued[1][0] == "warm-start"
        # run settings left out; a format-1 recipe's batch_size (global, of one process here) as batch_per_rank
        assert queued[1][1] == {**defaults(facts, ctx), "batch_per_rank": 64, "threads": 1}
    else:
        assert "warm-start" not in [role for role, _ in queued]
        assert queued[1][0] == "seed"  # a promising single change: measured before the heuristic (see below)


def test_seeds_of_the_defaults_environment_come_before_those_that_change_it(facts, tmp_path: Path) -> None:
    """An arm in the defaults' worker costs no process start; another environment costs process pairs."""
    from autotune.measure import environment_differences

    seeds = search_seeds(facts, SpaceContext(default_batch_size=32, conv=True),
                         SearchOptions(storage=f"sqlite:///{tmp_path}/s.db"), "cnn")
    other = [bool(environment_differences(seeds[0][1], params)) for _, params in seeds]
    assert seeds[0][0] == "baseline" and [r for r, _ in seeds].index("heuristic") > 1
    assert other[1:] == sorted(other[1:]) and other[-1], seeds  # every same-environment seed first


def _with_allocator(facts, found: bool):
    """``facts`` with tcmalloc found or not, and neither jemalloc nor libiomp5: the heuristic's allocator is
    tcmalloc or glibc's, whatever this machine has installed."""
    return replace(facts, runtime=replace(facts.runtime, tcmalloc_path="/lib/libtcmalloc.so.4" if found else None,
                                          jemalloc_path=None, iomp5_path=None))


def test_where_every_trial_starts_processes_the_seeds_that_change_the_environment_come_first(facts,
                                                                                             tmp_path: Path) -> None:
    """Script mode: each seed costs fresh process pairs of copies, whichever knobs it changes; the heuristic, which
    changes several at once, comes right after the baseline, the rest in the order they had, and a part of the
    heuristic's environment last in both modes."""
    from autotune.measure import environment_differences

    facts = _with_allocator(facts, found=True)
    ctx, options = SpaceContext(default_batch_size=32, conv=True), SearchOptions(storage=f"sqlite:///{tmp_path}/s.db")
    live = search_seeds(facts, ctx, options, "cnn")
    script = search_seeds(facts, ctx, options, "cnn", fresh_processes=True)
    other = [bool(environment_differences(script[0][1], params)) for _, params in script[:-1]]
    assert script[0] == live[0] and script[1][0] == "heuristic" and len(script) == len(live), script
    assert other[1:] == sorted(other[1:], reverse=True) and not other[-1], script
    assert [s for s in script if s[0] == "seed"] == [s for s in live if s[0] == "seed"]
    assert script[-1] == live[-1] == ("seed", {**live[0][1], "allocator": "tcmalloc"})


@pytest.mark.parametrize("bf16_speed", [1.5, 1.05])
def test_in_a_long_lived_copy_a_promising_precision_then_the_environments_seeds_come_first(
        facts, tmp_path: Path, bf16_speed: float) -> None:
    """Script mode's long-lived copy (``copy``): an in-process seed there is cheaper than a pair of fresh copies,
    not by a worker's margin; a precision whose kernels ran 1.1x float32's or more goes first, then the heuristic,
    then the other in-process seeds (live mode's order had put a recommender's heuristic, 2.3-2.9x, behind two of
    them and out of a 5-minute search), and a part of the heuristic's environment last."""
    from autotune.measure import environment_differences

    facts = _with_isa(_with_allocator(facts, found=True), "avx512_bf16")
    options = SearchOptions(storage=f"sqlite:///{tmp_path}/s.db")
    measured = _measured(facts, bfloat16=(bf16_speed, bf16_speed))
    live = search_seeds(facts, CTX, options, "tiny", measured)
    copy = search_seeds(facts, CTX, options, "tiny", measured, copy=True)
    assert sorted(map(str, copy)) == sorted(map(str, live)) and copy[0] == live[0], copy
    promising = [s for s in copy[1:] if s[0] == "seed" and s[1]["amp_dtype"] == "bfloat16"] if bf16_speed > 1.1 else []
    assert copy[1:1 + len(promising)] == promising and copy[1 + len(promising)][0] == "heuristic", copy
    rest = copy[2 + len(promising):-1]
    assert rest and not any(environment_differences(copy[0][1], p) for _, p in rest), copy
    assert copy[-1] == live[-1] == ("seed", {**live[0][1], "allocator": "tcmalloc"})


@pytest.mark.parametrize("fix", [{}, {"threads": 1}, {"affinity": "compact"}])
@pytest.mark.parametrize("fresh_processes", [False, True])
def test_the_heuristics_allocator_alone_is_seeded_last(facts, tmp_path: Path, fresh_processes: bool, fix: dict) -> None:
    """``run_cpu`` changes several knobs at once; where another of them costs, the allocator's own gain is measured on
    its own (``docs/search.md``): after the heuristic and the in-process seeds, measured fastest first, in both modes,
    whatever knob of the environment ``--fix`` holds."""
    from autotune.measure import environment_differences

    facts = _with_isa(_with_allocator(facts, found=True), "avx512_bf16")
    options = SearchOptions(storage=f"sqlite:///{tmp_path}/s.db", fixed=fix)
    seeded = search_seeds(facts, CTX, options, "tiny", _measured(facts, bfloat16=(1.5, 1.5)),
                          fresh_processes=fresh_processes)
    roles = [r for r, _ in seeded]
    base = {**seeded[0][1], **fix}
    assert seeded[-1] == ("seed", {**base, "allocator": "tcmalloc"}), seeded
    assert roles.index("heuristic") == (1 if fresh_processes else len(seeded) - 2), seeded
    inner = [p for r, p in seeded[1:-1] if r == "seed"]
    assert inner and not any(environment_differences(base, p) for p in inner), seeded
    assert inner[0]["amp_dtype"] == "bfloat16", seeded  # measured faster than float32: first of them


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_heuristics_allocator_alone_is_not_seeded_where_the_heuristic_keeps_glibcs(facts, tmp_path: Path,
                                                                                      device: str) -> None:
    """None where the heuristic keeps glibc's malloc: none found, or on CUDA (the CPU runtimes stay at their defaults);
    and on CUDA, tcmalloc found changes no seed."""
    options = SearchOptions(storage=f"sqlite:///{tmp_path}/s.db")
    ctx = SpaceContext(default_batch_size=32, device=device)
    with_it = search_seeds(_with_allocator(facts, found=True), ctx, options, "tiny")
    without = search_seeds(_with_allocator(facts, found=False), ctx, options, "tiny")
    assert not any(p.get("allocator") == "tcmalloc" for _, p in without)
    if device == "cuda":
        assert with_it == without
    else:
        assert with_it[:-1] == [(r, {**p, "allocator": "tcmalloc"} if r == "heuristic" else p) for r, p in without]


def test_fixed_knobs_hold_in_every_seed_but_the_baseline(facts, tmp_path: Path) -> None:
    options = SearchOptions(storage=f"sqlite:///{tmp_path}/s.db", fixed={"threads": 1})
    seeds = search_seeds(facts, CTX, options, "tiny")
    assert seeds[0] == ("baseline", defaults(facts, CTX))
    assert len(seeds) > 1 and all(params["threads"] == 1 for _, params in seeds[1:])
    assert len({str(sorted(p.items())) for _, p in seeds}) == len(seeds)  # no seed measured twice


def test_a_fixed_knob_that_another_knob_makes_moot_leaves_a_seed_in_the_defaults_environment(facts,
                                                                                               tmp_path: Path) -> None:
    """``--fix kmp_blocktime=1`` holds under Intel's OpenMP; a seed that keeps GNU's runs without it, as its trial
    records it. Read with it, every seed of the defaults' worker was priced as another environment's process pairs
    and went after the heuristic (a 2-minute replay of the Xeon's environment grid kept the defaults in 5 seeds of
    30), and the defaults with the moot blocktime were a seed of their own."""
    from autotune import search_spaces as spaces
    from autotune.measure import environment_differences
    from autotune.study.records import params_key

    if "intel" not in spaces.preload.openmp_choices(facts):
        pytest.skip("this machine offers no Intel OpenMP: the blocktime is never asked")
    options = SearchOptions(storage=f"sqlite:///{tmp_path}/s.db", fixed={"kmp_blocktime": 1})
    seeds = search_seeds(facts, SpaceContext(default_batch_size=32, conv=True), options, "cnn")
    base = seeds[0][1]
    same = [params for _, params in seeds[1:] if not environment_differences(base, params)]
    assert same and all(params["kmp_blocktime"] is None for params in same), seeds
    assert [role for role, _ in seeds].index("heuristic") == len(same) + 1, seeds  # after every arm of the defaults
    assert all(params_key(params) != params_key(base) for _, params in seeds[1:]), seeds


def test_an_interrupted_seed_comes_first_again_but_not_a_finished_one(facts, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(storage=storage)
    seeds = search_seeds(facts, SpaceContext(default_batch_size=32, conv=True), SearchOptions(storage=storage), "cnn")
    assert len(seeds) >= 3  # baseline, channels_last and at least one more seed still to come
    assert _measure_seeds(study, seeds, 1) == [seeds[0]]
    assert enqueue_next_seed(study, seeds)
    first = study.ask()
    first.set_user_attr("status", "interrupted")  # Ctrl-C, or failed after a kill -9
    study.tell(first, state=optuna.trial.TrialState.FAIL)
    assert _queued(study) == []  # nothing else was queued while it ran
    # The resumed search (or another worker): the interrupted seed before any later seed, once.
    assert _measure_seeds(study, seeds, 2) == [seeds[1], seeds[2]]
    measured = [(t.user_attrs["role"], t.system_attrs["fixed_params"]) for t in study.get_trials(deepcopy=False)]
    assert [r for r, _ in measured].count("baseline") == 1 and measured.count(seeds[1]) == 2


def test_fix_values_are_json_or_text() -> None:
    assert parse_fixes(["threads=2", "channels_last=true", "prefetch_factor=null", "compile_mode=none"]) == {
        "threads": 2, "channels_last": True, "prefetch_factor": None, "compile_mode": "none"}
    with pytest.raises(UsageError, match="KNOB=VALUE"):
        parse_fixes(["threads"])


def test_a_compile_trial_gets_its_own_time_estimate(facts) -> None:
    """Compiling takes far longer than the timed steps: a compile mode not measured yet may use a quarter of
    the budget (or what it leaves after the confirmation runs), not 5x the median of uncompiled trials."""
    from autotune.study.loop import SearchLoop

    study = optuna.create_study(direction="maximize")
    for wall, mode in [(8.0, "none"), (10.0, "none"), (9.0, "none")]:
        study.add_trial(optuna.trial.create_trial(
            value=1.0, user_attrs={"wall_s": wall, "status": "ok", "role": "search", "params": {"compile_mode": mode}}))
    options = SearchOptions(budget_s=600, confirm_top=0)
    loop = SearchLoop(study, "tiny", facts, CTX, {}, options, budget=Budget(0.0), notify=lambda *a: None)
    estimate = loop.turns.estimate_s()
    assert estimate == pytest.approx(1.2 * 9.0)
    assert loop.timeout_s({"compile_mode": "none"}, 500.0, estimate) == 60.0  # max(60, 5 x 10.8)
    assert loop.timeout_s({"compile_mode": "default"}, 500.0, estimate) == 150.0  # unmeasured: a quarter of 600 s
    assert loop.timeout_s({"compile_mode": "default"}, 100.0, estimate) == 100.0  # or what is left
    study.add_trial(optuna.trial.create_trial(
        value=1.0,
        user_attrs={"wall_s": 50.0, "status": "ok", "role": "search", "params": {"compile_mode": "default"}},
    ))
    assert loop.timeout_s({"compile_mode": "default"}, 500.0, estimate) == pytest.approx(5 * 1.2 * 50.0)
    assert loop.timeout_s({"compile_mode": "default"}, 100.0, estimate) == 100.0  # never past the budget


def test_a_confirmation_of_a_compiled_recipe_gets_a_time_limit_from_its_own_trial(facts) -> None:
    """A confirmation round is limited by what its candidate's trial took (3x, at least 60 s): a compiled
    candidate is not killed at the limit of an uncompiled one."""
    from autotune.measure import Noise
    from autotune.study.confirm import confirm
    from autotune.study.loop import SearchLoop
    from autotune.trial import TrialResult

    study = optuna.create_study(direction="maximize")
    for role, wall, mode, speed in [("baseline", 9.0, "none", 1.0), ("search", 10.0, "none", 1.1),
                                    ("search", 50.0, "default", 1.5)]:
        params = {"compile_mode": mode, "batch_size": 32 if role == "baseline" else 64}
        study.add_trial(optuna.trial.create_trial(value=speed, user_attrs={
            "wall_s": wall, "status": "ok", "objective": speed, "role": role, "params": params}))
    limits: dict[str, float] = {}

    class Calibrating(StubMeasurer):  # a continued study's workers are calibrated before they confirm
        def calibrate(self, timeout_s: float) -> Noise:
            return Noise(window_s=0.5, pairs=6, half_width=0.05, margin=0.03, spread=0.1, aa=(1.0, 0.97, 1.03))

    class Recording(SearchLoop):
        def run_one(self, trial, role, params, timeout, own_s=None):
            limits[params["compile_mode"]] = timeout
            result = TrialResult("ok", objective=1.2, speedup_low=1.1, speedup_high=1.3, loss=1.0)
            self.record(trial, role, params, result)
            return result

    options = SearchOptions(budget_s=10_000, confirm_top=2)
    loop = Recording(study, "tiny", facts, CTX, {}, options, budget=Budget.start(10_000), notify=lambda *a: None,
                     measurer=Calibrating())
    confirmation = confirm(loop)
    # a round's estimate: the trial's time outside windows and its 6 pairs of 0.5 s windows (10% over)
    assert limits == {"none": 60.0, "default": pytest.approx(3 * (50.0 + 2 * 6 * 0.5 * 1.1))}
    assert confirmation is not None and [c.first for c in confirmation.candidates] == [1.5, 1.1]


def test_a_short_budget_keeps_the_later_rounds_of_the_candidates_ranked_above(facts, monkeypatch) -> None:
    """Three candidates, a round of each taking its trial's time (10 s, 30 s, 10 s, ranked in that order), 75 s
    left of a budget that kept time for three rounds: the first is confirmed in all three rounds, the second in the
    one round that leaves the first its others, the third in the one round that fits beside those (the second's
    later rounds, which cannot fit, keep no time from it: ``Rounds.fitting``). Before, the first candidate that did
    not fit ended the confirmation: the 2-minute demo's two fastest candidates got one round of three."""
    from autotune.measure import Noise
    from autotune.study.confirm import confirm
    from autotune.study.loop import SearchLoop
    from autotune.trial import TrialResult

    class Clock:  # the confirmation's time: advanced by what each round takes
        now = 0.0

        def monotonic(self) -> float:
            return self.now

    clock = Clock()
    study = optuna.create_study(direction="maximize")
    for role, wall, batch, speed in [("baseline", 9.0, 32, 1.0), ("search", 10.0, 64, 1.5), ("search", 30.0, 128, 1.4),
                                     ("search", 10.0, 16, 1.3)]:
        study.add_trial(optuna.trial.create_trial(value=speed, user_attrs={
            "wall_s": wall, "status": "ok", "objective": speed, "role": role, "params": {"batch_size": batch}}))
    walls = {64: 10.0, 128: 30.0, 16: 10.0}
    measured: list[int] = []

    class Calibrating(StubMeasurer):
        def calibrate(self, timeout_s: float) -> Noise:  # windows of 1 ms: a round takes its trial's time
            return Noise(window_s=0.001, pairs=6, half_width=0.05, margin=0.03, spread=0.1, aa=(1.0, 0.97, 1.03))

    class Timed(SearchLoop):
        def run_one(self, trial, role, params, timeout, own_s=None):
            clock.now += walls[params["batch_size"]]
            measured.append(params["batch_size"])
            result = TrialResult("ok", objective=1.4, speedup_low=1.3, speedup_high=1.5, loss=1.0, wall_s=10.0)
            self.record(trial, role, params, result)
            return result

    # a budget whose 60% holds the three rounds of all three (165 s): the search kept time for them all; 75 s are left
    options = SearchOptions(budget_s=400, confirm_top=3)
    loop = Timed(study, "tiny", facts, CTX, {}, options, budget=Budget(75.5, clock.monotonic), notify=lambda *a: None,
                 measurer=Calibrating())
    confirmation = confirm(loop)
    assert measured == [64, 16, 128, 64, 64], measured
    assert confirmation is not None
    assert {c.params["batch_size"]: c.rounds for c in confirmation.candidates} == {64: 3, 128: 1, 16: 1}
    assert confirmation.note is not None and "trial 3 from round 2 of 3" in confirmation.note, confirmation.note
    assert "trial 2 from round 2 of 3" in confirmation.note
    # A budget of 75 s kept one round each (all three rounds, 165 s, are more than 60% of it): the first keeps no
    # later round past that, every candidate gets its first, and the time left goes to later rounds (in a round,
    # those ranked above still keep theirs: the drawn order decides whether 16 or 64 takes the last 25 s).
    study = optuna.create_study(direction="maximize")
    for trial in loop.study.get_trials():
        if trial.user_attrs.get("role") != "confirm":
            study.add_trial(trial)
    clock.now, measured[:] = 0.0, []
    options = SearchOptions(budget_s=75, confirm_top=3)
    loop = Timed(study, "tiny", facts, CTX, {}, options, budget=Budget(75.5, clock.monotonic), notify=lambda *a: None,
                 measurer=Calibrating())
    confirmation = confirm(loop)
    assert confirmation is not None
    rounds = {c.params["batch_size"]: c.rounds for c in confirmation.candidates}
    assert rounds[64] >= 2 and rounds[128] == 1 and rounds[16] >= 1, (rounds, measured)


# Precision seeds from measured kernels (``probes.measured``) ------------------------------------------------------

def _with_isa(facts, *flags: str):
    """The facts of a CPU that reports ``flags`` besides its own: the space offers what they name."""
    return replace(facts, cpu=replace(facts.cpu, isa=tuple(sorted({*facts.cpu.isa, *flags}))))


def _measured(facts, **speeds: tuple[float, float]):
    from autotune.probes import KernelSpeed, Measured

    precision = tuple(KernelSpeed(dtype, (conv * matmul) ** 0.5, False, (("conv", conv), ("matmul", matmul)))
                      for dtype, (conv, matmul) in speeds.items())
    return Measured(facts.fingerprint, "cpu", "2.13.0", precision)


def test_a_precision_measured_hopeless_here_is_not_seeded_and_one_measured_fast_goes_first(facts, tmp_path) -> None:
    """A CPU that reports AVX512-FP16 and AVX512-BF16 offers both. fp16 measured 40x (conv) and 14x (matmul)
    slower than float32, as fp16 autocast ran on the Intel VM: not seeded, with its reason; measured fast (as on
    a GPU with tensor cores), it is seeded before bf16. No flag decides either."""
    from autotune.study.seeds import not_seeded

    both = _with_isa(facts, "avx512_fp16", "avx512_bf16")
    ctx = SpaceContext(default_batch_size=32, conv=True)
    options = SearchOptions(storage=f"sqlite:///{tmp_path}/s.db")
    slow = _measured(facts, bfloat16=(1.4, 2.0), float16=(1 / 40, 1 / 14))
    seeded = search_seeds(both, ctx, options, "cnn", slow)
    assert not [p for _, p in seeded if p["amp_dtype"] == "float16"], seeded
    assert [p["amp_dtype"] for _, p in seeded[1:3]] == ["bfloat16", "bfloat16"]  # alone and with channels_last
    assert not_seeded(both, ctx, slow) == {
        "float16": "float16: 24x slower than float32 in this machine's kernels (conv 40x slower, matmul 14x slower)"}

    fast = _measured(facts, bfloat16=(1.3, 1.3), float16=(1.7, 1.7))
    seeded = search_seeds(both, ctx, options, "cnn", fast)
    assert [p["amp_dtype"] for _, p in seeded[1:5]] == ["float16", "float16", "bfloat16", "bfloat16"], seeded
    assert not_seeded(both, ctx, fast) == {}
    # unmeasured: every precision the space offers is seeded, in the families' order
    assert {p["amp_dtype"] for _, p in search_seeds(both, ctx, options, "cnn")} == {"float32", "bfloat16", "float16"}


def test_a_search_without_seeds_seeds_the_baseline_alone(facts, tmp_path) -> None:
    """The benchmark's control (``benchmarks/search_quality.py``: the sampler alone)."""
    options = SearchOptions(storage=f"sqlite:///{tmp_path}/s.db", seeded=False)
    assert search_seeds(facts, SpaceContext(default_batch_size=32, conv=True), options, "cnn") == [
        ("baseline", defaults(facts, SpaceContext(default_batch_size=32, conv=True)))]
