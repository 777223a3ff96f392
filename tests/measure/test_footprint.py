"""Two models on one GPU: each arm's own peak memory, and a second arm added only when both fit.

The decision is tested on the CPU with the fake NVML's machines (``tests/fakes/nvml.py``) and with an
in-process ``Bench`` whose device is faked; the ``gpu``-marked tests measure on a real device.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune import probes
from autotune.measure import protocol
from autotune.measure.worker.arms import ArmFailed
from autotune.measure.worker.bench import Bench
from autotune.measure.worker.footprint import GIB, Footprint, device_of, no_room
from autotune.probes import _nvml
from autotune.search_spaces import SpaceContext, defaults
from autotune.trial.spec import TrialSettings
from tests.fakes.nvml import MACHINES, load_machine

NVIDIA_SMI = Path(__file__).resolve().parents[2].parent / "shared" / "topologies" / "nvidia-smi-query"
MIB = 2**20
MIG = "MIG-4a0c6d1e-59c6-5c2f-9e8e-0f6a2b3c4d5e"
SLICE = 40192 * MIB  # a 3g.40gb MIG device of an A100 80GB
SETTINGS = TrialSettings(warmup_steps=2, measure_steps=6, windows=2, max_extra_windows=0, eval_samples=128)


@pytest.fixture
def gpu_machine(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``gpu_machine("H100SXMx8")``: that recorded machine's facts through the fake NVML."""
    if not NVIDIA_SMI.is_dir():
        pytest.skip(f"nvidia-smi dumps not found at {NVIDIA_SMI}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)

    def facts(machine: str, mig: bool = False) -> Any:
        fake = load_machine(NVIDIA_SMI, machine)
        if mig:
            fake.with_mig(0, (MIG, SLICE))
        monkeypatch.setattr(_nvml, "load_library", lambda: fake)
        return probes.probe(runtime=False)

    return facts


@pytest.mark.parametrize("machine", MACHINES)
def test_a_second_model_is_added_only_when_both_peaks_fit_in_90_percent(gpu_machine: Any, machine: str) -> None:
    facts = gpu_machine(machine)
    label, total = device_of(facts, 0)
    gpu = facts.gpus[0]
    assert (label, total) == (f"cuda:0 ({gpu.name})", gpu.memory_bytes)
    assert no_room([int(0.44 * total)], total, label) is None  # 2 x 44% = 88%: both fit
    reason = no_room([int(0.46 * total)], total, label)  # 2 x 46% = 92%
    assert reason is not None and reason.startswith(f"two models do not fit on cuda:0 ({gpu.name}): 2 x ")
    assert reason.endswith(f"peak > 90% of {total / GIB:.1f} GiB: measure by process pairs"), reason
    assert no_room([int(0.31 * total), int(0.31 * total)], total, label) is not None  # a third beside two: 93%


def test_a_mig_device_counts_its_slice_not_its_gpu(gpu_machine: Any) -> None:
    facts = gpu_machine("A100SXMx4", mig=True)
    label, total = device_of(facts, 0)
    assert total == SLICE and label == f"cuda:0 ({facts.gpus[0].name}, MIG {MIG})"
    assert no_room([25 * GIB], total, label) is not None  # 50 GiB fit an A100 80GB, not its 39 GiB slice
    assert no_room([25 * GIB], facts.gpus[1].memory_bytes, "cuda:1") is None


def test_nothing_known_refuses_nothing() -> None:
    assert no_room([], 80 * GIB, "cuda:0") is None and no_room([70 * GIB], None, "cuda:0") is None
    cpu = Footprint(cuda=False)
    cpu.enter(), cpu.leave()
    assert cpu.peak is None  # off CUDA nothing is measured: unknown, not 0


def test_an_arms_peak_and_its_no_room_state_cross_the_protocol() -> None:
    status = protocol.ArmStatus("cand", "no-room", "two models do not fit on cuda:0 (H100): measure by process pairs",
                                peak_memory_bytes=None)
    measured = protocol.ArmStatus("base", "ok", peak_memory_bytes=3 * GIB)
    for message in (protocol.ArmAdded(status), protocol.ArmAdded(measured)):
        assert protocol.decode(protocol.encode(message)) == message


# The wiring in Bench.add, on the CPU: the device and each arm's footprint faked ------------------------------


class _FakeFootprint(Footprint):
    """An arm's footprint on a pretend GPU: its peak is set by the test, nothing is measured."""

    def __init__(self, cuda: bool) -> None:
        super().__init__(cuda=True)
        self.peak = 30 * GIB
        self.others = 5 * GIB

    def enter(self) -> None:
        pass

    def leave(self) -> None:
        pass


def oom_at_96() -> Any:
    from tests.measure.test_arms import faulty

    return faulty()


@pytest.fixture
def bench(facts: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bench]:
    threads = torch.get_num_threads()
    params = {**defaults(facts, SpaceContext(default_batch_size=32)), "device": "cpu", "reference_batch": 32,
              "threads": 1, "interop_threads": 1}
    spec = protocol.WorkerSpec("tests.measure.test_footprint:oom_at_96", params, facts.to_dict(), loss_samples=256,
                               warmup_steps=2, eval_samples=128)
    monkeypatch.setattr("autotune.measure.worker.arms.Footprint", _FakeFootprint)
    b = Bench(spec)
    monkeypatch.setattr(b, "_device", lambda: ("cuda:0 (Fake 80GB)", 80 * GIB, 0))
    try:
        yield b
    finally:
        b.close()
        torch.set_num_threads(threads)  # Bench applied the worker's threads to this process


def test_bench_adds_a_second_arm_only_where_it_fits(bench: Bench) -> None:
    params = bench.spec.params
    assert bench.add("base", params).status().peak_memory_bytes == 30 * GIB  # the first arm: nothing to fit beside
    with pytest.raises(ArmFailed) as refused:
        bench.add("cand", {**params, "batch_size": 16})  # 2 x 30 GiB fit in 72: built
        bench.add("third", {**params, "batch_size": 8})  # 3 x 30 GiB do not: not built
    assert "cand" in bench.arms and bench.get("cand").state == "ok"
    third = bench.get("third").status()
    assert refused.value.state == third.state == "no-room" and bench.get("third").model is None
    assert third.error == ("two models do not fit on cuda:0 (Fake 80GB): 3 x 30.0 GiB peak > 90% of "
                           "80.0 GiB: measure by process pairs")


def test_room_is_what_this_process_can_use_not_the_devices_total(bench: Bench, facts: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A frozen worker or another process holds 30 of the 80 GiB: two 30 GiB arms no longer fit in the 50 this
    process can use (5 of them its own allocator's cache), though 2 x 30 is 75% of the device's total."""
    from autotune.measure.worker import footprint

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index=None: (45 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda index=None: 5 * GIB)
    assert footprint.room(0, 80 * GIB) == (50 * GIB, 30 * GIB)
    assert footprint.room(0, 40 * GIB) == (40 * GIB, 0)  # a MIG slice: at most the probed size
    monkeypatch.setattr(bench, "_device", lambda: ("cuda:0 (Fake 80GB)", *footprint.room(0, 80 * GIB)))
    params = bench.spec.params
    bench.add("base", params)
    with pytest.raises(ArmFailed) as refused:
        bench.add("cand", {**params, "batch_size": 16})
    assert refused.value.state == "no-room"
    assert refused.value.error == ("two models do not fit on cuda:0 (Fake 80GB): 2 x 30.0 GiB peak > 90% of 50.0 GiB "
                                   "(30.0 GiB more held by CUDA contexts and other processes): measure by process "
                                   "pairs")


def test_out_of_memory_beside_another_arm_is_no_room_and_alone_is_oom(bench: Bench) -> None:
    params = bench.spec.params
    with pytest.raises(ArmFailed) as alone:
        bench.add("b96-alone", {**params, "batch_size": 96})  # the faulty workload's fake OOM at batch 96
    assert alone.value.state == "oom"
    bench.drop("b96-alone")
    bench.add("base", params)
    with pytest.raises(ArmFailed) as beside:
        bench.add("b96", {**params, "batch_size": 96})
    assert beside.value.state == "no-room" and bench.get("b96").state == "no-room"
    assert bench.get("b96").error.startswith("two models do not fit on cuda:0 (Fake 80GB): out of memory beside "
                                             "5.0 GiB of the other arms (")
    assert bench.get("b96").error.endswith("): measure by process pairs")


# On a real GPU -----------------------------------------------------------------------------------------------


class _Allocator:
    """CUDA's allocated and peak counters as torch.cuda reports them, driven by the test."""

    def __init__(self) -> None:
        self.allocated = self.peak = 0

    def run(self, keep: int, transient: int) -> None:
        """An arm's activity: ``transient`` more at its largest (activations), ``keep`` left allocated after."""
        self.peak = max(self.peak, self.allocated + transient)
        self.allocated += keep

    def reset(self) -> None:
        self.peak = self.allocated


def test_each_arm_keeps_its_own_peak_less_what_the_others_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two arms alternating on one (faked) device: each one's peak is what it would need alone."""
    cuda = _Allocator()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: cuda.reset())
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: cuda.allocated)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: cuda.peak)
    a, b = Footprint(cuda=True), Footprint(cuda=True)
    a.enter()
    cuda.run(keep=10 * GIB, transient=15 * GIB)  # built and warmed: weights and optimizer state stay
    a.leave()
    b.enter()
    cuda.run(keep=8 * GIB, transient=12 * GIB)  # the second arm, beside the first's 10 GiB
    b.leave()
    a.enter()
    cuda.run(keep=0, transient=5 * GIB)  # a window of the first, beside the second's 8 GiB: 10 + 5 of its own
    a.leave()
    assert (a.peak, a.resident, b.peak, b.resident) == (15 * GIB, 10 * GIB, 12 * GIB, 8 * GIB)
    b.enter()
    cuda.run(keep=0, transient=20 * GIB)  # the second's window reaches higher than before: 8 + 20
    b.leave()
    assert (a.peak, b.peak) == (15 * GIB, 28 * GIB)
    off = Footprint(cuda=False)
    off.enter(), off.leave()
    assert off.peak is None  # off CUDA nothing is read


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_two_models_on_one_gpu_report_their_own_peaks() -> None:
    from autotune.measure.live.paired_worker import PairedWorker

    facts = probes.probe()
    base = {**defaults(facts, SpaceContext(device="cuda", default_batch_size=64, conv=True)), "device": "cuda",
            "reference_batch": 64}
    with PairedWorker("cnn", base, facts, SETTINGS) as worker:
        a = worker.add_arm("a", base)
        b = worker.add_arm("b", base)
        big = worker.add_arm("big", {**base, "batch_size": 256})
        run = worker.run_pairs("a", "b", 4, 0.05)
    assert a.state == b.state == big.state == "ok" and len(run.pairs) == 4
    assert a.peak_memory_bytes and b.peak_memory_bytes and big.peak_memory_bytes
    # an identical arm's peak is its own, not the first's plus the second's
    assert 0.8 < b.peak_memory_bytes / a.peak_memory_bytes < 1.25, (a.peak_memory_bytes, b.peak_memory_bytes)
    assert big.peak_memory_bytes > a.peak_memory_bytes  # four times the activations
    assert run.base.peak_memory_bytes and run.cand.peak_memory_bytes


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_precisions_first_use_on_a_gpu_is_no_hopeless_verdict() -> None:
    """An H200's first bf16 step (its kernels loaded on first use) outlasted a window and 32x a step, and the
    hopeless rule ended the transformer's bf16 and fp16 seeds at "0.00x" from it; bf16 later read 2.88x there."""
    from autotune.measure.hopeless import HOPELESS
    from autotune.measure.live.paired_worker import PairedWorker

    facts = probes.probe()
    base = {**defaults(facts, SpaceContext(device="cuda", default_batch_size=32)), "device": "cuda",
            "reference_batch": 32}
    with PairedWorker("transformer", base, facts, SETTINGS) as worker:
        worker.add_arm("defaults", base)
        worker.run_windows("defaults", 8, 0.05)  # judged against its windows, as a search's calibrated defaults
        arms = [worker.add_arm(dtype, {**base, "amp_dtype": dtype}, give_up=HOPELESS, against="defaults")
                for dtype in ("bfloat16", "float16")]
    assert all(arm.state == "ok" and arm.gave_up is None for arm in arms), arms


def huge() -> Any:
    """A model whose weights, gradients and momentum take about half of the GPU: a second copy does not fit."""
    from autotune.workloads import tiny

    total = torch.cuda.get_device_properties(0).total_memory
    width = int((0.5 * total / 4 / 3) ** 0.5)  # fp32 weights + gradients + SGD momentum: 3 copies of width^2

    base = tiny.workload()
    return type(base)(model=lambda: torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.Linear(width, width),
                                                        torch.nn.Linear(width, 10)),
                      dataset=base.dataset, loss=base.loss,
                      optimizer=lambda p: torch.optim.SGD(p, lr=1e-4, momentum=0.9), batch_size=8, name="huge")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_second_model_that_does_not_fit_is_not_added() -> None:
    from autotune.measure.live.paired_worker import PairedWorker

    facts = probes.probe()
    base = {**defaults(facts, SpaceContext(device="cuda", default_batch_size=8)), "device": "cuda",
            "reference_batch": 8}
    with PairedWorker("tests.measure.test_footprint:huge", base, facts, SETTINGS) as worker:
        first = worker.add_arm("a", base)
        second = worker.add_arm("b", base)
    assert first.state == "ok" and first.peak_memory_bytes
    assert first.peak_memory_bytes > 0.45 * facts.gpus[0].memory_bytes
    assert second.state == "no-room" and second.error.startswith("two models do not fit on cuda:0 (")
    assert second.error.endswith(": measure by process pairs")
