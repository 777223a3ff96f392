"""The quality guard: a held-out loss, taken after the same samples in every trial, that rejects the knobs
that hurt (with the reason in the report) and passes the ones that do not.

The losses are taken as a search takes them: arms of one paired worker (a trial process for several ranks);
the guard's verdicts in a search, what it prints and the recipe chosen are tested on the study of two real
searches that the user's path shares (``tests/test_end_to_end.py``)."""
from __future__ import annotations

import re

import pytest

from autotune import search_spaces as spaces
from autotune.measure.live.paired_worker import PairedWorker
from autotune.measure.protocol import ArmStatus
from autotune.trial import TrialSettings, loss_samples
from autotune.trial.training import schedule
from autotune.workloads import held_out_sets, held_out_split

from .. import quality_workloads as qw

GUARD_REASON = re.compile(r"loss \d+\.\d+ is \+\d+\.\d% over the baseline's \d+\.\d+ \(limit \+5%\)")


def _loss_samples(facts) -> int:
    """The default-64 workload's loss sample count on this machine: whole steps of every per-rank batch and
    process count offered (1,792 with one process, 2,048 with 2: 256 per rank x 2)."""
    return loss_samples(TrialSettings(max_extra_windows=0), {"reference_batch": 64, "batch_per_rank": 64}, facts)


def _params(facts, workload, **change) -> dict:
    wl = workload()
    ctx = spaces.SpaceContext(default_batch_size=wl.batch_size, prunable=True)
    run = {"device": "cpu", "reference_batch": wl.batch_size, "global_batch": None, "lr_scaling": "linear"}
    return {**spaces.defaults(facts, ctx), **run, **change}


def test_the_held_out_slices_are_fixed_disjoint_from_training_and_at_most_a_quarter() -> None:
    import torch

    data = torch.utils.data.TensorDataset(torch.arange(4096))
    train, held_out = held_out_split(data, 512)
    torch.manual_seed(123)  # the trial's seed does not move it
    again = held_out_split(data, 512)[1]
    assert len(held_out) == 512 and held_out.indices == again.indices
    wide = held_out_sets(data, 512)[2]  # the guard's second look: four times the samples, a quarter at most
    assert len(wide) == 1024 and set(held_out.indices) <= set(wide.indices)
    assert set(train.indices) | set(wide.indices) == set(range(4096))
    assert not set(train.indices) & set(wide.indices)
    assert len(held_out_split(torch.utils.data.TensorDataset(torch.arange(100)), 512)[1]) == 25
    assert len(held_out_sets(torch.utils.data.TensorDataset(torch.arange(4096)), 128)[2]) == 512


# (default batch, batch, processes, --global-batch): the loss comes after whole steps at one sample count
SCHEDULES = [(64, b, 1, None) for b in (16, 32, 64, 128, 256)] + [
    (64, b, p, None) for b in (16, 128) for p in (2, 4, 8)] + [
    (64, b, p, 256) for b in (16, 64, 256) for p in (1, 2)] + [
    (32, b, 1, 96) for b in (8, 16, 32)] + [(48, 12, 8, None), (7, 1, 2, None), (100, 25, 8, None)]


@pytest.mark.parametrize(("default", "batch", "processes", "global_batch"), SCHEDULES)
@pytest.mark.parametrize("settings", [TrialSettings(), TrialSettings(warmup_steps=2, measure_steps=6, windows=2)])
def test_every_offered_step_size_reaches_the_loss_sample_count_exactly(
        live_facts, default: int, batch: int, processes: int, global_batch: int | None, settings) -> None:
    params = {"batch_per_rank": batch, "processes": processes, "reference_batch": default,
              "global_batch": global_batch}
    target = loss_samples(settings, params, live_facts(processes))
    assert target >= default * (settings.warmup_steps + settings.measure_steps)
    step = batch * processes * spaces.batch.accumulation(params)
    assert target % step == 0
    warmup, window_steps, loss_window = schedule(target // step, settings.warmup_steps, settings.windows)
    assert warmup >= 1 and window_steps >= 1 and 0 <= loss_window <= settings.windows
    assert (warmup + loss_window * window_steps) * step == target


@pytest.fixture
def live_facts(facts):
    """The live facts, with enough cores that every process count is offered."""
    import dataclasses

    def with_cores(processes: int):
        allowed = dataclasses.replace(facts.cpu.allowed, cores=max(processes, 8))
        return dataclasses.replace(facts, cpu=dataclasses.replace(facts.cpu, allowed=allowed))

    return with_cores



# Trained losses: arms of one paired worker, the engine a search measures its in-process candidates with (a
# trial process only where the candidate runs several processes: the two-rank case below).

BATCHES = {"16": {"batch_per_rank": 16}, "32": {"batch_per_rank": 32}, "64": {}, "128": {"batch_per_rank": 128},
           "256": {"batch_per_rank": 256}, "16x16": {"batch_per_rank": 16, "global_batch": 256}}
HURTING = {"sparsity": dict(qw.HURTS), "lr-none": {"batch_per_rank": 256, "lr_scaling": "none"}}


def _trained(facts, workload: str, arms: dict[str, dict]) -> tuple[int, dict[str, ArmStatus]]:
    """The study's loss sample count and each arm's status once trained to it (its loss taken), all arms in one
    paired worker of ``workload`` at the defaults (one thread each: the subject is the loss, not the speed)."""
    base = _params(facts, getattr(qw, workload), threads=1, interop_threads=1)
    with PairedWorker(qw.spec(workload), base, facts, TrialSettings(max_extra_windows=0)) as worker:
        added = {name: worker.add_arm(name, {**base, **change}) for name, change in arms.items()}
        return worker.spec.loss_samples, {name: worker.evaluate(name) if status.state == "ok" else status
                                          for name, status in added.items()}


@pytest.fixture(scope="module")
def regression_arms(facts) -> dict[str, ArmStatus]:
    """``regression`` trained at every batch size, with accumulation, and with the knobs that hurt it."""
    _, arms = _trained(facts, "regression", {**BATCHES, **HURTING})
    for status in arms.values():
        assert status.state == "ok", (status.arm, status.error)
    return arms


@pytest.mark.slow
def test_the_loss_is_taken_on_samples_no_trial_trained_on(facts) -> None:
    """``memorize`` learns only the samples it sees: on held-out samples its loss stays the untrained one."""
    count, arms = _trained(facts, "memorize", {str(b): {"batch_per_rank": b} for b in (32, 128)})
    untrained = qw.untrained_loss(held_out_split(qw._memorize_data(), TrialSettings().eval_samples)[1].indices)
    for batch, arm in zip((32, 128), arms.values(), strict=True):
        assert arm.state == "ok" and arm.step_samples == batch and arm.loss_samples == count, arm
        assert arm.loss == pytest.approx(untrained, rel=1e-6), arm


@pytest.mark.slow
@pytest.mark.parametrize("arm", BATCHES)
def test_every_trial_takes_its_loss_after_the_same_samples(facts, regression_arms, arm: str) -> None:
    """The default-64 workload: the same samples (1,792 with one process; whole steps of 256 per rank x 2 ranks,
    2,048, where 2 processes are offered) for every batch size and accumulation."""
    status, change = regression_arms[arm], BATCHES[arm]
    assert status.step_samples == (change.get("global_batch") or change.get("batch_per_rank", 64))  # as asked
    assert status.loss_samples == _loss_samples(facts) >= 64 * (4 + 24)


@pytest.mark.slow
@pytest.mark.parametrize("arm", HURTING)
def test_a_knob_that_hurts_quality_trains_to_a_far_worse_loss(facts, regression_arms, arm: str) -> None:
    """Structured sparsity 0.8, and batch 256 at the default learning rate (7 steps where the defaults take 28),
    miss the defaults' loss by far after the same samples: what the guard must reject
    (``tests/test_end_to_end.py::test_a_knob_that_hurts_quality_is_rejected_with_its_reason``: the verdict in a
    search)."""
    hurt, defaults = regression_arms[arm], regression_arms["64"]
    assert hurt.loss > 1.5 * defaults.loss, (hurt, defaults)
    assert hurt.loss_samples == defaults.loss_samples == _loss_samples(facts)


@pytest.mark.slow
def test_a_larger_batch_with_the_linear_rule_reaches_the_defaults_loss(facts, regression_arms) -> None:
    """Batch 128 with the linear lr rule reaches the defaults' loss after the same samples: a knob the guard
    must pass (``tests/test_end_to_end.py::test_a_knob_that_does_not_hurt_passes_the_guard``: the verdict in a
    search)."""
    larger, defaults = regression_arms["128"], regression_arms["64"]
    assert larger.loss == pytest.approx(defaults.loss, rel=0.03)
    assert larger.loss_samples == defaults.loss_samples == _loss_samples(facts)


@pytest.mark.parametrize(("base", "loss", "passes", "reason"), [
    (2.0, 2.09, True, None),
    (2.0, 2.2, False, GUARD_REASON.pattern),
    (0.0, 0.0, True, None),
    (0.0, 1e-6, False, r"loss 0\.0000 is beyond any bound over the baseline's 0\.0000"),  # not +0%: unbounded
    (None, 0.5, False, r"no finite baseline loss to compare its loss with \(the defaults' was None\)"),
    (float("nan"), 0.5, False, r"no finite baseline loss"),
    (2.0, float("nan"), False, r"loss nan is beyond any bound"),
])
def test_the_guard_passes_nothing_it_cannot_compare(base, loss, passes: bool, reason) -> None:
    """A baseline loss of 0, none or NaN must not pass everything (a relative increase over 0 is no 0%)."""
    import optuna

    from autotune.study import SearchOptions
    from autotune.study.records import StudyAttr
    from autotune.study.verdict import quality

    study = optuna.create_study(direction="maximize")  # the guard reads one attribute: no database needed
    study.set_user_attr(StudyAttr.BASELINE_LOSS, base)
    increase, why = quality(study, SearchOptions(max_loss_increase=0.05), loss)
    assert (why is None) == passes and (increase <= 0.05) == passes, (increase, why)
    if reason is not None:
        assert re.match(reason, why), why


@pytest.mark.parametrize(("base_source", "source", "base", "loss", "reason"), [
    # a script's own metric where higher is better (tuned.evaluate): its fall is bounded, its rise passes
    ("evaluate, higher is better", "evaluate, higher is better", 0.90, 0.95, None),
    ("evaluate, higher is better", "evaluate, higher is better", 0.90, 0.86, None),
    ("evaluate, higher is better", "evaluate, higher is better", 0.90, 0.84,
     r"your evaluate\(\) figure 0\.8400 is 6\.7% below the baseline's 0\.9000 \(limit 5%\)"),
    ("evaluate", "evaluate", 2.0, 2.2, r"your evaluate\(\) figure 2\.2000 is \+10\.0% over"),
    # figures of two kinds are not compared; a script's study from before sources were recorded: a training loss
    ("evaluate", "training loss", 2.0, 2.0, r"its copy told training loss where the defaults' told evaluate"),
    (None, "evaluate", 2.0, 2.0, r"its copy told evaluate where the defaults' told training loss"),
    (None, "training loss", 2.0, 2.05, None),
])
def test_the_guard_compares_a_scripts_own_figure_in_its_direction_and_only_with_its_kind(
        base_source, source, base: float, loss: float, reason) -> None:
    import optuna

    from autotune.study import SearchOptions
    from autotune.study.records import StudyAttr
    from autotune.study.verdict import quality

    study = optuna.create_study(direction="maximize")
    study.set_user_attr(StudyAttr.BASELINE_LOSS, base)
    study.set_user_attr(StudyAttr.LOSS_SOURCE, base_source)
    study.set_user_attr(StudyAttr.WORKLOAD, "script:train.py")
    why = quality(study, SearchOptions(max_loss_increase=0.05), loss, source)[1]
    assert (why is None) == (reason is None), why
    if reason is not None:
        assert re.match(reason, why), why
