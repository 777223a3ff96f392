"""Where an arm's step goes (``autotune.measure.worker.phases``): a workload whose every part sleeps a known time,
measured in a real worker; the defaults' top operators from torch's profiler; an optimizer that runs no step hooks."""
from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from autotune.measure.live.paired_worker import PairedWorker
from autotune.measure.worker.phases import MERGED, Phases
from autotune.search_spaces import SpaceContext, defaults
from autotune.trial.spec import TrialSettings

SETTINGS = TrialSettings(warmup_steps=2, measure_steps=6, windows=2, max_extra_windows=0, eval_samples=16)
SLEEP_MS = {"data": 2.0, "forward": 3.0, "backward": 6.0, "optimizer": 1.5}  # a step of one sample: 12.5 ms


def phased() -> Any:
    """A one-sample step whose every part sleeps ``SLEEP_MS``: reading its sample, the forward pass, the backward
    pass (an autograd function's), the optimizer's step."""
    import torch

    from autotune import Workload

    class Load(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 256

        def __getitem__(self, index: int) -> Any:
            time.sleep(SLEEP_MS["data"] / 1e3)
            return torch.full((8,), float(index % 7)), torch.ones(2)

    class SlowBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x.clone()

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            time.sleep(SLEEP_MS["backward"] / 1e3)
            return grad

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 2)

        def forward(self, x: Any) -> Any:
            if self.training:
                time.sleep(SLEEP_MS["forward"] / 1e3)
            return SlowBackward.apply(self.linear(x))

    class SlowSGD(torch.optim.SGD):
        def step(self, closure: Any = None) -> Any:
            time.sleep(SLEEP_MS["optimizer"] / 1e3)
            return super().step(closure)

    return Workload(model=Model, dataset=Load, loss=lambda out, batch: torch.nn.functional.mse_loss(out, batch[1]),
                    optimizer=lambda params: SlowSGD(params, lr=0.01), batch_size=1, name="phased")


def test_an_arms_step_is_split_into_its_parts_as_they_took_and_little_is_left_unexplained(facts: Any) -> None:
    params = {**defaults(facts, SpaceContext(default_batch_size=1)), "device": "cpu", "reference_batch": 1,
              "threads": 1, "interop_threads": 1}
    with PairedWorker("tests.measure.test_phases:phased", params, facts, SETTINGS) as worker:
        worker.add_arm("defaults", params)
        windows = worker.run_windows("defaults", 3, 0.3)
        profile = worker.profile("defaults", 0.3)
    shares = dict(windows.status.phases or ())
    assert list(shares) == ["data", "forward", "backward", "optimizer", "other"], shares
    total = sum(SLEEP_MS.values())
    # a sleep wakes late on a busy machine, each part alike: every part near its share of the sleeps, within 0.08
    for part, ms in SLEEP_MS.items():
        assert shares[part] == pytest.approx(ms / total, abs=0.08), shares
    assert shares["other"] <= 0.05 and sum(shares.values()) == pytest.approx(1.0, abs=1e-3), shares
    # the profile's top operators: shares of all operators' own time, largest first, the Linear's among them
    names, values = [name for name, _ in profile.operators], [share for _, share in profile.operators]
    assert 0 < len(names) <= 8 and values == sorted(values, reverse=True) and 0 < sum(values) <= 1.0, profile
    assert any(name in ("aten::addmm", "aten::mm", "aten::linear") for name in names), names
    assert profile.status.state == "ok"  # trained on after it, untimed


def test_an_optimizer_that_runs_no_step_hooks_is_not_told_apart_from_the_backward() -> None:
    phases = Phases(object(), enabled=True)  # no register_step_pre_hook: its step cannot be stamped
    phases.start()
    phases.add(0.0, 0.1, 0.3, 1.0, stepped=True)
    assert phases.shares(1.0) == (("data", 0.1), ("forward", 0.2), ("backward", 0.0), ("optimizer", 0.0),
                                  (MERGED, 0.7), ("other", 0.0))
    assert Phases(object(), enabled=False).shares(1.0) is None  # a GPU's: not measured


def test_a_profile_of_many_operators_a_step_keeps_to_its_time() -> None:
    """A GRU's step runs 6,000 operators: its 2-s profile (50 steps) took 20 s to sum, twice a 2-minute search (the
    defaults and the fastest candidate). The summing is priced per step from the first: a step of 1,000 operators
    summed 50 times took 15 s; priced from one step and then profiled together, 1.5-1.8 s of the 1 s asked, 3.05 s
    under the suite's load (the summing grows faster than the steps); a profile a step, about the time asked."""
    import torch

    from autotune.measure.worker.phases import profiled

    a = torch.ones(4)

    def step() -> None:
        for _ in range(1000):
            a.add(1.0)

    started = time.perf_counter()
    operators = profiled(step, seconds=1.0)
    took = time.perf_counter() - started
    # (a scalar's add runs its wrapping too: under load its copy_ may top the list)
    assert took < 3.0 and "aten::add" in dict(operators), (took, operators)


def test_a_profile_stops_at_its_step_cap_and_one_that_fails_costs_the_search_nothing(facts: Any) -> None:
    """Profiling 2 s of a tiny MLP's 1-ms steps left a trace whose sum took minutes (the worker was stopped at its
    limit): a profile runs at most ``PROFILE_STEPS`` steps. A profile that fails anyway is the report's loss only:
    the defaults' worker is started again with its arm, and the search goes on."""
    import torch

    from autotune.measure import LiveMeasurer
    from autotune.measure.live.paired_worker import WorkerError
    from autotune.measure.worker.phases import PROFILE_STEPS, profiled

    steps = []
    a = torch.ones(8, 8)
    operators = profiled(lambda: steps.append(torch.mm(a, a)), seconds=60.0)
    assert len(steps) == PROFILE_STEPS and operators and operators[0][0] == "aten::mm"

    class Worker:
        def __init__(self, stuck: bool = False) -> None:
            self.stuck, self.asked = stuck, []

        def profile(self, arm: str, seconds: float, step_s: float) -> Any:
            if self.stuck:
                raise WorkerError("the paired worker did not answer Profile within 68 s; stopped")
            self.asked.append((arm, seconds))
            return SimpleNamespace(operators=(("aten::mm", 0.5),))

    measurer = LiveMeasurer("tiny", {"device": "cpu"}, facts, SETTINGS)
    assert measurer._profile(Worker(stuck=True), "defaults", 2.0, 0.01, "defaults") is None  # a warning, no error
    # a search's candidate is profiled (half the defaults' time) when it is the fastest yet, and only then
    worker, trial = Worker(), SimpleNamespace(name="c1", deadline=time.monotonic() + 60)
    found = [measurer._profile_fastest(trial, worker, "c1", median)  # type: ignore[arg-type]
             for median in (1.3, 1.2, 1.5, 0.9)]
    assert found == [{"aten::mm": 0.5}, None, {"aten::mm": 0.5}, None] and worker.asked == [("c1", 1.0)] * 2
    measurer.environments.confirming = True  # a confirmation round measures again what the search profiled
    assert measurer._profile_fastest(trial, worker, "c1", 2.0) is None  # type: ignore[arg-type]
