"""The space is conditional on the probed facts, and FixedTrial replays a recipe through it."""
from __future__ import annotations

from dataclasses import replace

import optuna
import pytest

from autotune import search_spaces as spaces
from autotune.probes import Gpu

from ..fakes.machines import two_sockets


def _with_isa(facts, *isa):
    return replace(facts, cpu=replace(facts.cpu, isa=tuple(isa)))


def _choices(facts, ctx, key):
    study = optuna.create_study()
    values = set()
    for _ in range(40):
        trial = study.ask()
        values.add(spaces.suggest(trial, facts, ctx)[key])
        study.tell(trial, 0.0)
    return values


@pytest.mark.parametrize(
    ("isa", "expected"),
    [((), {"float32"}), (("avx2",), {"float32"}), (("avx512_bf16",), {"float32", "bfloat16"}),
     (("amx_bf16", "avx512_fp16"), {"float32", "bfloat16", "float16"})],
)
def test_cpu_amp_dtypes_follow_the_isa(facts, isa, expected) -> None:
    assert set(spaces.amp.dtypes(_with_isa(facts, *isa), spaces.SpaceContext())) == expected


def test_gpu_dtypes_follow_compute_capability(facts) -> None:
    def gpu(cc):
        return replace(facts, gpus=(Gpu(0, "x", cc, 1 << 30, "0000:00:00.0"),))

    cuda = spaces.SpaceContext(device="cuda")
    assert spaces.amp.dtypes(gpu("7.0"), cuda) == ("float32", "float16")
    assert spaces.amp.dtypes(gpu("9.0"), cuda) == ("float32", "bfloat16", "float16")


def test_no_compile_without_a_compiler(facts) -> None:
    runtime = replace(facts.runtime, compile_cpu_ok=False)
    assert spaces.compilation.modes(replace(facts, runtime=runtime), spaces.SpaceContext()) == ("none",)
    assert "max-autotune" in spaces.compilation.modes(facts, spaces.SpaceContext(device="cuda"))


def test_channels_last_only_for_conv_models(facts) -> None:
    assert _choices(facts, spaces.SpaceContext(conv=False), "channels_last") == {False}
    assert _choices(facts, spaces.SpaceContext(conv=True), "channels_last") == {False, True}


def test_fixed_trial_replays_a_recipe(facts) -> None:
    ctx = spaces.SpaceContext(default_batch_size=32)
    study = optuna.create_study()
    trial = study.ask()
    sampled = spaces.suggest(trial, facts, ctx)
    assert spaces.suggest(optuna.trial.FixedTrial(trial.params), facts, ctx) == sampled


def test_batch_sizes_respect_global_batch_and_memory() -> None:
    assert spaces.batch.sizes(spaces.SpaceContext(default_batch_size=32)) == (8, 16, 32, 64, 128)
    assert spaces.batch.sizes(spaces.SpaceContext(default_batch_size=32, global_batch=48)) == (8, 16)
    assert spaces.batch.sizes(spaces.SpaceContext(default_batch_size=32, max_batch_size=40)) == (8, 16, 32)
    # on a GPU with a global batch: doubled on up to it (and to what memory holds); without one, as on the CPU
    gpu = spaces.SpaceContext(device="cuda", default_batch_size=32, global_batch=1024)
    assert spaces.batch.sizes(gpu) == (8, 16, 32, 64, 128, 256, 512, 1024)
    assert spaces.batch.sizes(replace(gpu, max_batch_size=300)) == (8, 16, 32, 64, 128, 256)
    assert spaces.batch.sizes(replace(gpu, global_batch=None)) == (8, 16, 32, 64, 128)
    assert spaces.batch.sizes(replace(gpu, device="cpu")) == (8, 16, 32, 64, 128)


def test_the_largest_batch_follows_memory_weights_and_activations() -> None:
    import torch

    net = torch.nn.Sequential(torch.nn.Linear(1000, 1000), torch.nn.ReLU())
    x = torch.zeros(2, 1000)
    small, large = (spaces.batch.max_batch_size(m * 2**20, net, (x,), 2) for m in (64, 128))
    assert large > 2 * small  # the weights' share is fixed: twice the memory, more than twice the samples
    assert spaces.batch.max_batch_size(16 * 2**20, net, (x,), 2) == 1  # not even the weights fit: the smallest
    assert spaces.batch.max_batch_size(None, net, (x,), 2) is None  # memory unknown: no cap
    assert spaces.batch.max_batch_size(2**30, net, (torch.zeros(2, 7),), 2) is None  # fails to run: no cap


def test_a_search_context_caps_batch_sizes_by_probed_memory(facts) -> None:
    from dataclasses import replace

    from autotune.study import SearchOptions, search_context

    _, roomy = search_context("cnn", facts, SearchOptions())
    assert roomy.max_batch_size is not None and spaces.batch.sizes(roomy) == (16, 32, 64, 128, 256)
    tight = replace(facts, memory=replace(facts.memory, available_bytes=2**28))  # 256 MiB available
    _, ctx = search_context("cnn", tight, SearchOptions())
    assert 64 <= ctx.max_batch_size < 256 and max(spaces.batch.sizes(ctx)) <= ctx.max_batch_size


@pytest.mark.parametrize(
    ("affinity", "threads", "cpus"),
    [
        ("none", 4, None),
        ("compact", 4, [0, 1, 2, 3]),  # one thread per core, first socket first
        ("compact", 6, [0, 1, 2, 3, 4, 5]),
        ("spread", 4, [0, 1, 4, 5]),  # alternating NUMA nodes
        ("compact", 10, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]),  # more threads than cores: SMT siblings after
    ],
)
def test_affinity_cpu_sets(facts, affinity, threads, cpus) -> None:
    assert spaces.cpus_for({"affinity": affinity, "threads": threads}, two_sockets(facts)) == cpus


def test_spread_is_offered_only_with_several_nodes(facts) -> None:
    ctx = spaces.SpaceContext()
    assert "spread" in _choices(two_sockets(facts), ctx, "affinity")
    if len({c.numa_node for c in facts.cpu.allowed.core_list}) == 1 and facts.cpu.allowed.packages == 1:
        assert "spread" not in _choices(facts, ctx, "affinity")


def test_seeds_start_with_the_baseline(facts) -> None:
    ctx = spaces.SpaceContext(conv=True)
    seeds = spaces.seeds(_with_isa(facts, "avx512_bf16"), ctx)
    assert seeds[0] == ("baseline", spaces.defaults(facts, ctx)) and seeds[1][0] == "heuristic"
    assert ("seed", {**spaces.defaults(facts, ctx), "amp_dtype": "bfloat16"}) in seeds

