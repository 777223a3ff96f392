"""Sparsity removes compute: pruned layers are smaller, the FLOPs fewer, in apply() and in a real trial."""
from __future__ import annotations

from dataclasses import replace

import optuna
import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import autotune
from autotune import search_spaces as spaces
from autotune.probes import Gpu
from autotune.search_spaces.transforms import prune as _prune
from autotune.search_spaces.transforms import semisparse as _semisparse
from autotune.trial import run_trial
from autotune.workloads import cnn, tiny, transformer


class Residual(nn.Module):
    """a -> relu -> b is safe; b feeds a residual add, c a reshape, d is the output."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = nn.Linear(8, 16), nn.Linear(16, 8), nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        y = self.b(torch.relu(self.a(x))) + x
        return self.d(torch.relu(self.c(y)).reshape(y.shape[0], -1))


class Shared(nn.Module):
    """The same layer called twice, and a weight tied to another layer: neither may be sliced."""

    def __init__(self) -> None:
        super().__init__()
        self.twice, self.tied, self.head = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.other = nn.Linear(8, 8)
        self.other.weight = self.tied.weight

    def forward(self, x):
        return self.head(torch.relu(self.tied(self.twice(torch.relu(self.twice(x)))))) + self.other(x)


class ConvFlatten(nn.Module):
    """Conv -> flatten of a 4x4 map -> Linear: channel c is not feature c, so no pair."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8 * 4 * 4, 2)

    def forward(self, x):
        return self.fc(torch.flatten(torch.relu(self.conv(x)), 1))


class Untraceable(nn.Module):
    """Data-dependent control flow defeats fx; the child it calls is still searched."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Dropout(0.1), nn.Linear(32, 8))

    def forward(self, x):
        return self.body(x) if x.sum() > 0 else x


@pytest.mark.parametrize(
    ("build", "pairs"),
    [
        (tiny._model, [("0", "2", ())]),
        (cnn._model, [("0", "3", ("1",)), ("3", "6", ("4",)), ("6", "11", ("7",))]),  # 6 -> pool(1) -> flatten -> 11
        (transformer._model, [(f"encoder.layers.{i}.linear1", f"encoder.layers.{i}.linear2", ()) for i in (0, 1)]),
        (Residual, [("a", "b", ())]),
        (Shared, []),
        (ConvFlatten, []),
        (Untraceable, [("body.0", "body.3", ())]),
    ],
)
def test_only_safe_pairs_are_found(build, pairs) -> None:
    assert [(p.producer, p.consumer, p.norms) for p in _prune.find_pairs(build())] == pairs


def _silence_half(model: nn.Module, pair: _prune.Pair) -> None:
    """Make the producer's odd units contribute nothing (zero weights, bias, BatchNorm shift and mean)."""
    producer = model.get_submodule(pair.producer)
    with torch.no_grad():
        producer.weight[1::2] = 0
        producer.bias[1::2] = 0
        producer.weight[0::2] += torch.sign(producer.weight[0::2]) * 1e-3  # the even units stay larger in L1
        for name in pair.norms:
            norm = model.get_submodule(name)
            for tensor in (norm.weight, norm.bias, norm.running_mean):  # per-unit values a misaligned slice shows
                tensor.copy_(torch.randn_like(tensor))
            norm.running_var.uniform_(0.5, 2.0)
            norm.bias[1::2] = 0
            norm.running_mean[1::2] = 0


@pytest.mark.parametrize("build", [tiny._model, cnn._model, transformer._model, Untraceable])
def test_pruning_units_that_contribute_nothing_keeps_the_function(build) -> None:
    """Slicing the producer's rows, the BatchNorm and the consumer's columns must stay aligned."""
    torch.manual_seed(0)
    model = build().eval()
    for pair in _prune.find_pairs(model):
        _silence_half(model, pair)
    x = {tiny._model: torch.randn(4, 64), cnn._model: torch.randn(4, 3, 32, 32),
         transformer._model: torch.randint(0, 256, (4, 64)), Untraceable: torch.rand(4, 8)}[build]
    before = model(x)
    report = _prune.prune(model, 0.5)
    assert report.layers > 0 and report.channels_removed * 2 == report.channels_total
    torch.testing.assert_close(model(x), before, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("build", "x", "units", "max_flops"),
    [(tiny._model, torch.randn(8, 64), 64, 0.55), (cnn._model, torch.randn(8, 3, 32, 32), 16, 0.35),
     (transformer._model, torch.randint(0, 256, (8, 64)), 256, 0.8)],
)
def test_pruning_shrinks_layers_and_flops(build, x, units, max_flops) -> None:
    def flops(model):
        with FlopCounterMode(display=False) as counter:
            model(x).float().sum().backward()  # forward and backward: what a training step computes
        return counter.get_total_flops()

    model = build()
    dense = flops(model)
    first = _prune.find_pairs(model)[0]
    report = _prune.prune(model, 0.5)
    assert model.get_submodule(first.producer).weight.shape[0] == units
    assert model.get_submodule(first.consumer).weight.shape[1] == units
    assert flops(model) < max_flops * dense
    assert report.params_after < report.params_before


def test_apply_prunes_before_the_optimizer(facts) -> None:
    tuned = autotune.apply({"batch_size": 8, "sparsity_pattern": "structured", "sparsity": 0.5},
                           facts=facts, check_hardware=False)
    model = tuned.prepare_model(tiny._model())
    assert (model[0].weight.shape, model[2].weight.shape) == ((64, 64), (10, 64))
    assert model(torch.randn(2, 64)).shape == (2, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert sum(p.numel() for g in optimizer.param_groups for p in g["params"]) == 64 * 64 + 64 + 10 * 64 + 10
    done = tuned.in_effect["sparsity"]
    assert done["removed_channel_fraction"] == 0.5 and done["params_after"] == 4810 and done["params_before"] == 9610


def test_unprunable_model_gets_a_warning_and_stays_whole(facts) -> None:
    tuned = autotune.apply({"batch_size": 8, "sparsity_pattern": "structured", "sparsity": 0.5},
                           facts=facts, check_hardware=False)
    with pytest.warns(UserWarning, match="no layer of this model can lose units"):
        model = tuned.prepare_model(nn.Linear(4, 2))
    assert model.weight.shape == (2, 4) and "sparsity" not in tuned.in_effect


def test_two_to_four_needs_cuda(facts) -> None:
    tuned = autotune.apply({"batch_size": 8, "sparsity_pattern": "2:4", "sparsity": 0.5}, facts=facts,
                           check_hardware=False)
    with pytest.warns(UserWarning, match="2:4 not applied"):
        model = tuned.prepare_model(nn.Linear(64, 64))
    assert type(model) is nn.Linear


@pytest.mark.slow
def test_trial_subprocess_trains_the_pruned_model(facts, fast_settings) -> None:
    params = {**spaces.defaults(facts, spaces.SpaceContext()), "device": "cpu", "reference_batch": 32,
              "threads": 1, "sparsity_pattern": "structured", "sparsity": 0.5}
    result = run_trial("tiny", params, facts, fast_settings, timeout_s=120)
    assert result.status == "ok", result.log_tail
    done = result.in_effect["sparsity"]
    assert done["removed_channel_fraction"] == 0.5 and done["layers"] == 1
    assert done["params_after"] == 4810 and result.loss > 0


def _gpu(facts, capability):
    return replace(facts, gpus=(Gpu(0, "x", capability, 1 << 30, "0000:00:00.0"),))


@pytest.mark.parametrize(
    ("device", "capability", "prunable", "semi", "expected"),
    [("cpu", None, False, False, ("none",)), ("cpu", None, True, True, ("none", "structured")),
     ("cuda", "7.5", True, True, ("none", "structured")), ("cuda", "8.0", True, True, ("none", "structured", "2:4")),
     ("cuda", "8.6", False, True, ("none", "2:4")), ("cuda", "8.6", False, False, ("none",)),
     ("cuda", "9.0", True, True, ("none", "structured"))],  # 2:4 measured slower than dense on an H100
)
def test_patterns_follow_facts_and_model(facts, device, capability, prunable, semi, expected) -> None:
    fake = _gpu(facts, capability) if capability else facts
    ctx = spaces.SpaceContext(device=device, prunable=prunable, semi_structured=semi)
    assert spaces.sparsity.patterns(fake, ctx) == expected


def test_sampled_ratios_stay_in_range(facts) -> None:
    ctx = spaces.SpaceContext(prunable=True)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(40):
        trial = study.ask()
        params = spaces.suggest(trial, facts, ctx)
        seen.add((params["sparsity_pattern"], params["sparsity"]))
        study.tell(trial, 0.0)
    ratios = {r for p, r in seen if p == "structured"}
    assert ("none", 0.0) in seen and ratios and all(0.1 <= r <= 0.8 for r in ratios)
    assert spaces.sparsity.defaults(facts, ctx) == {"sparsity_pattern": "none", "sparsity": 0.0}


def single_linear():
    base = tiny.workload()
    return replace(base, model=lambda: nn.Sequential(nn.Linear(64, 10)))


@pytest.mark.parametrize(
    ("workload", "prunable", "semi"), [("tiny", True, True), (f"{__name__}:single_linear", False, False)]
)
def test_study_context_decides_on_the_workloads_model(facts, workload, prunable, semi) -> None:
    from autotune.study import SearchOptions, search_context

    _, ctx = search_context(workload, facts, SearchOptions())
    assert (ctx.prunable, ctx.semi_structured) == (prunable, semi)  # Linear(64, 128): both dims % 64


def test_two_to_four_mask_keeps_the_larger_half_of_every_four() -> None:
    weight = torch.randn(64, 128)
    mask = _semisparse.mask_2to4(weight)
    assert (mask.reshape(64, 32, 4).sum(-1) == 2).all()
    kept = weight.abs()[mask].reshape(64, 32, 2).min(-1).values
    dropped = weight.abs()[~mask].reshape(64, 32, 2).max(-1).values
    assert (kept >= dropped).all()
    layer = _semisparse.SemiSparseLinear.from_linear(nn.Linear(128, 64))
    assert ((layer.weight == 0) == ~layer.mask).all() and "mask" not in layer.state_dict()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_two_to_four_trains_on_sparse_kernels(facts, dtype) -> None:
    tuned = autotune.apply({"batch_size": 8, "device": "cuda", "sparsity_pattern": "2:4", "sparsity": 0.5,
                            "amp_dtype": str(dtype).removeprefix("torch.")}, facts=facts, check_hardware=False)
    model = tuned.prepare_model(nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 64)))
    assert all(isinstance(m, _semisparse.SemiSparseLinear) for m in (model[0], model[2]))
    assert tuned.in_effect["sparsity"]["layers"] == 2
    x = torch.randn(64, 128, device="cuda", requires_grad=True)
    with tuned.autocast():
        out = model(x)
    reference = nn.functional.linear(nn.functional.relu(nn.functional.linear(x.to(dtype), model[0].weight.to(dtype),
                                     model[0].bias.to(dtype))), model[2].weight.to(dtype), model[2].bias.to(dtype))
    torch.testing.assert_close(out, reference, rtol=2e-2, atol=2e-2)
    out.float().sum().backward()
    assert (model[0].weight.grad[~model[0].mask] == 0).all() and x.grad is not None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.step()
    assert (model[0].weight[~model[0].mask] == 0).all()  # the pruned weights stay pruned
