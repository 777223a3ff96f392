"""A search never crashes on its own history or inputs: bad options are refused before anything is
written, a stored recipe outside today's space is skipped, and a knob that did not take is not scored."""
from __future__ import annotations

import logging
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from autotune import search_spaces as spaces
from autotune.errors import UsageError
from autotune.recipe import Recipe
from autotune.search_spaces import SpaceContext, defaults
from autotune.store import RecipeStore
from autotune.study import Budget, SearchOptions, search
from autotune.study.liveness import claim
from autotune.study.loop import SearchLoop
from autotune.study.records import records
from autotune.trial import TrialSettings

from .. import quality_workloads
from ..conftest import missing
from .conftest import QUICK, trials
from .test_race import Scripted

CTX = SpaceContext(default_batch_size=32)
RUN = {"device": "cpu", "reference_batch": 32, "global_batch": None, "lr_scaling": "sqrt"}
# A search that would run if the bad option were accepted: short, so a regression fails fast.
SHORT = (*QUICK, "--trials", "1", "--confirm", "0")
CONV = quality_workloads.spec("conv")  # a tiny CNN


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (("--train-steps", "0"), "--train-steps must be at least 1 (got 0)"),
        (("--max-loss-increase", "-0.1"), "--max-loss-increase must be 0 or more (got -0.1)"),
        (("--max-loss-increase", "nan"), "--max-loss-increase must be 0 or more (got nan)"),
        (("--busy-limit", "1"), "--busy-limit must be more than 1 (got 1.0)"),
        (("--steps", "0"), "--steps must be at least 3, one per timed window (got 0)"),
        (("--warmup-steps", "-1"), "--warmup-steps must be 0 or more (got -1)"),
        (("--global-batch", "0"), "--global-batch must be at least 1 (got 0)"),
        (("--confirm", "-1"), "--confirm must be 0 or more (got -1)"),
        (("--confirm-rounds", "0"), "--confirm-rounds must be at least 1 (got 0)"),
        (("--trials", "0"), "--trials must be at least 1 (got 0)"),
        (("--seed", "-1"), "--seed must be 0 to 4294967295 (got -1)"),
        (("--fix", "bogus=1"), "--fix bogus: no such knob; the knobs are affinity, allocator,"),
        (("--no-compile", "--fix", "compile_mode=default"),
         "--fix compile_mode=default: not possible in this search on this machine; compile_mode may be: none"),
        (("--fix", "batch_per_rank=3"), "--fix batch_per_rank=3: not possible in this search on this machine; "
                                        "batch_per_rank may be: 8, 16, 32, 64, 128"),  # tiny's default is 32
        (("--global-batch", "64", "--fix", "batch_per_rank=128"), "batch_per_rank may be: 8, 16, 32, 64"),
        (("--fix", "pin_memory=true"), "pin_memory may be: false"),  # a CPU search: no pinned host memory
    ],
)
def test_a_bad_option_is_one_line_exit_2_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str],
                                                            caplog: pytest.LogCaptureFixture,
                                                            option: tuple[str, ...], message: str) -> None:
    """The CLI's ``main()`` in this process, as the console script calls it (its exit status and the one line
    in a fresh process: ``test_a_bad_option_refused_by_the_console_script``)."""
    from autotune.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["search", *SHORT, *option]) == 2
    stderr = capsys.readouterr().err
    assert stderr.startswith("autotune search: error: ") and message in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    # what a fresh process's logging would add to stderr: nothing
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert list(tmp_path.iterdir()) == []  # no studies.db


def test_a_bad_option_refused_by_the_console_script(tmp_path: Path) -> None:
    """The one fresh ``autotune search`` (the installed console script) with a bad option: exit 2, one line."""
    script = Path(sys.executable).with_name("autotune")
    if not script.exists():
        pytest.skip(f"no console script {script}: autotune is not installed in this environment (pip install -e .)")
    done = subprocess.run([str(script), "search", *SHORT, "--fix", "batch_per_rank=3"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("autotune search: error: --fix batch_per_rank=3: not possible in this search on "
                                  "this machine; batch_per_rank may be: 8, 16, 32, 64, 128"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert list(tmp_path.iterdir()) == []  # no studies.db


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(settings=TrialSettings(train_steps=0)), "--train-steps must be at least 1"),
        (dict(max_loss_increase=-0.1), "--max-loss-increase must be 0 or more"),
        (dict(settings=TrialSettings(measure_steps=0)), "--steps must be at least 3"),
        (dict(fixed={"compile_mode": "default"}, compile=False), "compile_mode may be: none"),
    ],
)
def test_the_library_entry_checks_the_same_way(tmp_path: Path, options: dict, message: str) -> None:
    storage = f"sqlite:///{tmp_path}/studies.db"
    with pytest.raises(UsageError, match=message):
        search("tiny", options=SearchOptions(storage=storage, trials=1, confirm_top=0, **options))
    assert not (tmp_path / "studies.db").exists()


@pytest.mark.parametrize(
    ("ctx", "changes", "outside"),
    [
        (CTX, {}, []),
        (SpaceContext(default_batch_size=32, allow_compile=False), {"compile_mode": "default"},
         ["compile_mode=default (allowed: none)"]),
        (SpaceContext(default_batch_size=32, max_batch_size=64), {"batch_per_rank": 128},
         ["batch_per_rank=128 (allowed: 8, 16, 32, 64)"]),
        (SpaceContext(default_batch_size=32, global_batch=48), {"batch_per_rank": 32},
         ["batch_per_rank=32 (allowed: 8, 16)"]),
        (CTX, {"pin_memory": True}, ["pin_memory=true (allowed: false)"]),  # never on a CPU
        (CTX, {"kmp_blocktime": 1}, []),  # moot with openmp=gnu, allowed otherwise: not a reason to skip
        (CTX, {"threads": 10_000}, ["threads=10000 (allowed: 1.."]),
    ],
)
def test_outside_names_the_values_todays_space_cannot_take(facts, ctx, changes, outside) -> None:
    got = spaces.outside({**defaults(facts, ctx), **changes}, facts, ctx)
    assert len(got) == len(outside) and all(g.startswith(o) for g, o in zip(got, outside, strict=True)), got


def test_allowed_values_come_from_the_space_itself(facts) -> None:
    allowed = spaces.allowed_values(facts, CTX)
    assert set(allowed) == set(defaults(facts, CTX))  # every knob of a recipe, nothing else
    assert "none" in allowed["compile_mode"] and "default" not in spaces.allowed_values(
        facts, SpaceContext(default_batch_size=32, allow_compile=False))["compile_mode"]
    assert 1 in allowed["threads"] and True not in allowed["threads"] and 1 not in allowed["channels_last"]
    assert None in allowed["prefetch_factor"] and 2 in allowed["prefetch_factor"]  # both branches of num_workers


def test_a_stored_recipe_outside_todays_space_is_skipped_and_the_search_goes_on(
        facts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture, own_temp: Path) -> None:
    """compile_mode=default found by an earlier search, then --no-compile: that recipe is not a seed,
    the default study (searched with compile modes) goes on under a name of its own, and a study named
    with --study that cannot go on with these options is refused without losing anything. Study naming and
    seeding are the search's logic: its trials are measured by the scripted measurer (live: the searches of
    tests/test_end_to_end.py), under a host lock of its own (``own_temp``)."""
    from autotune.cli import main

    storage = f"sqlite:///{tmp_path}/studies.db"
    # as SHORT asks it, on CONV: its channels_last seed comes after the baseline on every CPU
    short = SearchOptions(storage=storage, trials=1, confirm_top=0, fixed={"processes": 1},
                          settings=TrialSettings(warmup_steps=2, measure_steps=6))
    search(CONV, options=short, measurer=Scripted(), facts=facts)
    [old] = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    with RecipeStore.open(storage) as store:  # what a search that chose torch.compile stores
        store.save(Recipe(params={**defaults(facts, CTX), "compile_mode": "default", **RUN}, workload=CONV,
                          fingerprint=facts.fingerprint, study=old))

    caplog.clear()
    search(CONV, options=replace(short, compile=False, trials=2), measurer=Scripted(), facts=facts)
    logged = caplog.text
    assert "warm-start seed skipped, outside this search's space: compile_mode=default (allowed: none)" in logged
    assert f"this search goes on in study '{old}-" in logged
    [new] = [s.study_name for s in optuna.get_all_study_summaries(storage) if s.study_name != old]
    assert [t.user_attrs["role"] for t in trials(storage, new)] == ["baseline", "seed"]  # in-process seeds first
    assert all(t.user_attrs["params"]["compile_mode"] == "none" for t in trials(storage, new))
    assert len(trials(storage, old)) == 1  # the first study is left as it was

    monkeypatch.chdir(tmp_path)  # the CLI's default storage: studies.db here
    assert main(["search", *SHORT, "--workload", CONV, "--no-compile", "--study", old]) == 2
    stderr = capsys.readouterr().err
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert f"study '{old}' searched compile_mode over none, default" in stderr
    assert "start another with --study NAME" in stderr
    assert len(trials(storage, old)) == 1


def _run(facts, tmp_path: Path, candidates: list[dict]) -> list[tuple[optuna.trial.FrozenTrial, object]]:
    """Trials measured and recorded by one search loop, as a search runs them, after its baseline: each trial's
    frozen trial and record, in order."""
    from autotune.measure.live.measurer import LiveMeasurer

    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/studies.db", direction="maximize")
    options = SearchOptions(settings=TrialSettings(warmup_steps=2, measure_steps=6, windows=2, max_extra_windows=0,
                                                   eval_samples=128), confirm_top=0)
    # What is in effect is the subject, not the speed: the fewest pairs (one process pair), still real processes.
    measurer = LiveMeasurer("tiny", {**defaults(facts, CTX), **RUN}, facts, options.settings, calibration_pairs=6,
                            process_pairs=(1, 1), busy=math.inf, profile_s=0.0)
    loop = SearchLoop(study, "tiny", facts, CTX, RUN, options, Budget.start(600), lambda *a: None,
                      measurer=measurer)
    try:
        # The baseline trial first: its loss is the quality guard's reference (without one no candidate passes).
        # It starts the defaults' worker, calibrated as a one-minute budget sizes it: a process pair's windows are
        # 4 pairs however noisy the machine (given 300 s, a busy one asked 20).
        baseline = {**defaults(facts, CTX), **RUN}
        trial = study.ask()
        claim(trial, "baseline", baseline)
        result = loop.run_one(trial, "baseline", baseline, timeout=60)
        assert result.status == "ok", result.error
        for params in candidates:
            trial = study.ask()
            params = {**defaults(facts, CTX), "threads": 1, **params, **RUN}
            claim(trial, "search", params)
            result = loop.run_one(trial, "search", params, timeout=300)
            assert result.status == "ok", (result.error, result.log_tail)
    finally:
        loop.measurer.close()
    return list(zip(study.get_trials(deepcopy=False), records(study), strict=True))[1:]  # the candidates


@pytest.fixture(scope="module")
def inputs_run(facts, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    """One search loop on facts where jemalloc is installed (if it is here), tcmalloc's library is missing and
    numactl refuses --membind (as under Docker's default seccomp profile, without CAP_SYS_NICE): a trial with the
    missing allocator, and one pinned (affinity compact) with jemalloc where it is installed, each its own
    environment (a process pair: two worker starts, the most of this fixture's time; both knobs of the second
    must be in effect for it to be feasible)."""
    tmp_path = tmp_path_factory.mktemp("inputs")
    numactl = tmp_path / "numactl"
    numactl.write_text("#!/bin/sh\necho 'set_mempolicy: Operation not permitted' >&2\nexit 1\n")
    numactl.chmod(0o755)
    runtime = replace(facts.runtime, tcmalloc_path=str(tmp_path / "libtcmalloc.so.4"), numactl_path=str(numactl))
    facts = replace(facts, runtime=runtime)
    assert spaces.memory_nodes({**defaults(facts, CTX), "affinity": "compact"}, facts)  # binding is wanted
    installed = {"allocator": "jemalloc"} if facts.runtime.jemalloc_path else {}
    missing, pinned = _run(facts, tmp_path, [{"allocator": "tcmalloc"}, {"affinity": "compact", **installed}])
    return {"facts": facts, "missing": missing, "pinned": pinned, **({"installed": pinned} if installed else {})}


@pytest.mark.parametrize("library", ["installed", "missing"])
def test_an_allocator_that_does_not_serve_malloc_makes_the_trial_infeasible(inputs_run, library: str) -> None:
    """The dynamic linker ignores a preloaded library it cannot open: the trial measured glibc malloc."""
    if library not in inputs_run:
        missing("jemalloc is not installed here (tests/system-deps.sh installs it)")
    frozen, record = inputs_run[library]
    if library == "installed":
        assert record.feasible and "infeasible" not in frozen.user_attrs and record.rejected_by == ()
        assert frozen.user_attrs["in_effect"]["malloc_library"].startswith("libjemalloc")
    else:
        assert not record.feasible
        assert record.reason == "allocator=tcmalloc is not in effect: libc.so.6 serves malloc"
        assert frozen.user_attrs["race"] == record.reason  # known after its first round: no more pairs
        assert frozen.constraints["applied"] == 1.0
        assert record.rejected_by == ("applied",)  # the report counts it apart from the quality guard


def test_a_refused_membind_is_recorded_off_and_the_pinning_stays_feasible(inputs_run) -> None:
    """numactl --membind refused (containers without CAP_SYS_NICE): the pinned trial is valid, and the
    recipe's params say memory was not bound, so neither the env file nor 'autotune run' binds it."""
    frozen, record = inputs_run["pinned"]
    assert record.feasible and record.reason is None
    assert frozen.user_attrs["in_effect"]["memory_policy"] == "default"
    assert record.params["membind"] is False and record.params["affinity"] == "compact"
    assert spaces.memory_nodes(record.params, inputs_run["facts"]) is None
