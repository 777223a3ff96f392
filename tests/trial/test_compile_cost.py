"""What a trial charges as compile time (``search_spaces.compilation.compile_cost``): the first step's excess,
steps 2-3 too where inductor captures CUDA graphs, nothing for an eager run (its first step's lazy CUDA
initialisation is not compile). Checked here with fake step times and a fake clock; tests/test_gpu.py
measures a real GPU."""
from __future__ import annotations

import pytest

from autotune.search_spaces import compilation
from autotune.trial import child, run_trial

STEPS = [30.0, 2.0, 1.5, 0.1, 0.1]  # seconds: compile, cudagraph warm-up, capture, then steady steps


@pytest.mark.parametrize(
    ("mode", "device", "charged"),
    [
        ("none", "cuda", 0.0),  # eager: lazy CUDA/cuBLAS/cuDNN init in step 1 is not compile
        ("none", "cpu", 0.0),
        ("default", "cuda", 29.9),  # compile in step 1 only
        ("max-autotune-no-cudagraphs", "cuda", 29.9),
        ("reduce-overhead", "cuda", 29.9 + 1.9 + 1.4),  # + CUDA-graph warm-up and capture in steps 2-3
        ("max-autotune", "cuda", 29.9 + 1.9 + 1.4),
        ("reduce-overhead", "cpu", 29.9),  # no CUDA graphs on the CPU
    ],
)
def test_compile_cost_charges_the_steps_that_compile(mode: str, device: str, charged: float) -> None:
    assert compilation.compile_cost(STEPS, 0.1, mode, device) == pytest.approx(charged)


class _FakeRun:
    """A trial's run whose steps advance a fake clock by scripted durations."""

    def __init__(self, clock: list[float], durations: list[float]) -> None:
        self.clock, self.durations, self.synced = clock, list(durations), 0

    def steps(self, count: int) -> float:
        for _ in range(count):
            self.clock[0] += self.durations.pop(0)
        return 0.0

    def sync(self) -> None:
        self.synced += 1


def test_the_first_steps_are_timed_one_by_one_with_the_device_synchronised(monkeypatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(child.time, "perf_counter", lambda: clock[0])
    run = _FakeRun(clock, STEPS)
    charged = compilation.charged_steps("reduce-overhead", "cuda")
    assert child.first_steps_s(run, charged) == pytest.approx([30.0, 2.0, 1.5]) and run.synced == 3
    assert run.durations == [0.1, 0.1]  # the rest is warm-up and windows, timed together


def test_an_eager_trial_charges_no_compile_time(facts, fast_settings) -> None:
    from autotune import search_spaces as spaces

    params = {**spaces.defaults(facts, spaces.SpaceContext()), "device": "cpu", "reference_batch": 32, "threads": 1}
    result = run_trial("tiny", params, facts, fast_settings, timeout_s=120)
    assert result.status == "ok", result.log_tail
    assert result.compile_s == 0.0 and len(result.in_effect["first_steps_s"]) == 1
    assert result.objective == pytest.approx(result.samples_per_s)  # nothing amortised


def test_compiled_arms_of_one_worker_each_pay_their_own_compile_and_stay_compiled(facts, monkeypatch,
                                                                                   tmp_path) -> None:
    """Three compiled arms in one worker (two alike, one of another batch size): each pays its own compile,
    as in a fresh process, and no window recompiles. Before, the second reused the first's compiled code
    (its compile read about 0 s). Dynamo with the ``aot_eager`` backend: inductor's C++ compile would take
    minutes here, and what is checked is the compiler's state, not its speed."""
    import torch
    import torch._dynamo

    from autotune import search_spaces as spaces
    from autotune.measure import protocol
    from autotune.measure.worker.bench import Bench

    original = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, mode=None: original(model, backend="aot_eager"))
    monkeypatch.setattr(torch._dynamo.config, "automatic_dynamic_shapes", True)  # restored after the test
    for variable in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):  # each compiled arm sets its own
        monkeypatch.setenv(variable, str(tmp_path / variable))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    threads = torch.get_num_threads()
    params = {**spaces.defaults(facts, spaces.SpaceContext(default_batch_size=32)), "device": "cpu",
              "reference_batch": 32, "threads": 1, "interop_threads": 1, "compile_mode": "default"}
    spec = protocol.WorkerSpec("tiny", params, facts.to_dict(), loss_samples=10_000, warmup_steps=3,
                               eval_samples=128)
    bench = Bench(spec)
    try:
        arms = [bench.add("a", params), bench.add("b", params), bench.add("c", {**params, "batch_size": 16})]
        compiles = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        for arm in arms:
            arm.window(0.05)
        steady = {arm.name: arm.step_s for arm in arms}
        paid = {arm.name: arm.compile_s for arm in arms}
        assert all(paid[name] > 5 * steady[name] for name in paid), (paid, steady)
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == compiles  # nothing compiled in a window
        assert torch._dynamo.config.automatic_dynamic_shapes is False  # batch 16 compiled static, as alone
        bench.drop("c")
        assert arms[0].state == arms[1].state == "ok"
    finally:
        bench.close()
        torch._dynamo.reset()
        torch.set_num_threads(threads)
