"""The knobs GPU users expect, checked on the CPU: what the space offers on fake GPUs, and what
``apply_process`` sets in this process (torch's flags are plain process state, CUDA or not)."""
from __future__ import annotations

import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

import autotune
from autotune import search_spaces as spaces
from autotune.probes import Gpu
from autotune.search_spaces import SpaceContext, allowed_values
from autotune.study import SearchOptions
from autotune.study.driver import search_context

from ..fakes.machines import two_sockets

CUDA = SpaceContext(device="cuda", conv=True)


def _gpu_machine(facts, cc="8.0"):
    """Two sockets (CPUs 0-3,8-11 and 4-7,12-15) and one GPU local to socket 1."""
    gpu = Gpu(0, "A100", cc, 80 * 2**30, "00000000:81:00.0", numa_node=1, cpu_affinity="4-7,12-15")
    return replace(two_sockets(facts), gpus=(gpu,))


def _allowed(facts, ctx, key):
    return set(allowed_values(facts, ctx)[key].choices)


@pytest.mark.parametrize(("cc", "expected"), [
    ("6.1", ("float32",)),  # Pascal: no fp16 tensor cores, fp16 runs slower than fp32
    ("7.0", ("float32", "float16")),
    ("7.5", ("float32", "float16")),
    ("8.0", ("float32", "bfloat16", "float16")),
])
def test_fp16_needs_compute_capability_7(facts, cc, expected) -> None:
    assert spaces.amp.dtypes(_gpu_machine(facts, cc), CUDA) == expected


@pytest.fixture
def restore_flags():
    """torch's process-wide flags as they were, after the test."""
    flags = spaces.cuda.flags()
    before = {key: flag.get() for key, flag in flags.items()}
    yield flags
    for key, flag in flags.items():
        flag.set(before[key])


def test_the_cuda_baseline_is_pytorchs_defaults(facts, restore_flags) -> None:
    base = spaces.defaults(_gpu_machine(facts), CUDA)
    assert {k: base[k] for k in spaces.cuda.KEYS} == {"tf32_matmul": False, "tf32_cudnn": True,
                                                      "cudnn_benchmark": False, "cuda_alloc": "default"}
    assert spaces.cuda.apply_process({**base, "device": "cuda"}, None) == []
    assert spaces.cuda.tf32_in_effect() == {"matmul": False, "cudnn": True}  # cuDNN TF32 stays on


def test_apply_sets_only_what_the_recipe_changes(facts, restore_flags) -> None:
    base = {**spaces.defaults(_gpu_machine(facts), CUDA), "device": "cuda"}
    assert spaces.cuda.apply_process({**base, "tf32_matmul": True, "cudnn_benchmark": True}, None) == []
    assert spaces.cuda.tf32_in_effect() == {"matmul": True, "cudnn": True}
    assert restore_flags["cudnn_benchmark"].get() is True
    import torch

    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # the newer API reads what allow_tf32 set
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
        assert torch.backends.cudnn.conv.fp32_precision == "tf32"


def _every_tf32_view() -> dict[str, object]:
    """Each way torch lets code read TF32: the legacy getters (inductor's max-autotune and Lightning read
    ``get_float32_matmul_precision``) and, on torch 2.9+, ``fp32_precision``."""
    import torch

    views = {"get_float32_matmul_precision": torch.get_float32_matmul_precision,
             "matmul.allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
             "cudnn.allow_tf32": lambda: torch.backends.cudnn.allow_tf32}
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        views |= {"matmul.fp32_precision": lambda: torch.backends.cuda.matmul.fp32_precision,
                  "cudnn.conv.fp32_precision": lambda: torch.backends.cudnn.conv.fp32_precision}
    return {name: view() for name, view in views.items()}  # a view that raises fails the test


@pytest.mark.filterwarnings("ignore:environment-level knobs not in effect")
@pytest.mark.parametrize("tf32", [True, False])
def test_every_tf32_view_answers_after_apply(facts, restore_flags, monkeypatch, tf32) -> None:
    """Setting ``fp32_precision`` made the legacy getters raise ("mix of the legacy and new APIs"; seen on an
    H100, torch 2.11): a max-autotune trial with TF32 crashed in inductor, and so would a user's code."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the flags only: no GPU is touched here
    base = {**spaces.defaults(_gpu_machine(facts), CUDA), "device": "cuda", "batch_size": 8}
    for params in ({**base, "tf32_matmul": tf32, "tf32_cudnn": tf32}, base):  # then back to the defaults
        autotune.apply(params, facts=facts, check_hardware=False)
        views = _every_tf32_view()
        assert views["matmul.allow_tf32"] is params["tf32_matmul"], views
        assert views["get_float32_matmul_precision"] == ("high" if params["tf32_matmul"] else "highest"), views
        if not params["tf32_cudnn"]:
            assert views["cudnn.allow_tf32"] is False, views
        spaces.cuda.set_flags(base)  # what a paired worker does between arms


def test_tf32_set_through_the_newer_api_is_read_and_warned_about(facts, restore_flags, monkeypatch) -> None:
    """A script that set ``fp32_precision`` itself (torch 2.9+) before ``apply()``: read, not raised."""
    import torch

    if not hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        pytest.skip("torch before 2.9 has no fp32_precision")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    base = {**spaces.defaults(_gpu_machine(facts), CUDA), "device": "cuda"}
    assert spaces.cuda.tf32_in_effect()["matmul"] is True
    (problem,) = spaces.cuda.apply_process(base, None)
    assert problem.startswith("torch.backends.cuda.matmul.allow_tf32 is True in this process")


def test_set_flags_sets_the_defaults_too(restore_flags) -> None:
    """One model of a paired worker after another: ``apply_process`` leaves a default alone (the user's
    own setting is warned about, not overridden), so a defaults arm after a TF32 arm ran with TF32."""
    base = {"device": "cuda", "tf32_matmul": False, "tf32_cudnn": True, "cudnn_benchmark": False}
    spaces.cuda.set_flags({**base, "tf32_matmul": True, "tf32_cudnn": False})
    assert spaces.cuda.tf32_in_effect() == {"matmul": True, "cudnn": False}
    spaces.cuda.set_flags(base)
    assert spaces.cuda.tf32_in_effect() == {"matmul": False, "cudnn": True}
    spaces.cuda.set_flags({**base, "device": "cpu", "tf32_matmul": True})  # a CPU arm reads no CUDA flag
    assert spaces.cuda.tf32_in_effect() == {"matmul": False, "cudnn": True}


def test_a_users_allocator_configuration_is_not_in_effect_for_a_default_recipe(facts, monkeypatch) -> None:
    gpu = _gpu_machine(facts)
    base = {**spaces.defaults(gpu, CUDA), "device": "cuda"}
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:64")  # overrides the CUDA variable on torch 2.9+
    assert spaces.cuda.check_environment(base, gpu) == ["PYTORCH_ALLOC_CONF unset (is 'max_split_size_mb:64')"]
    expandable = {**base, "cuda_alloc": "expandable_segments"}
    assert [p for p in spaces.check_environment(expandable, gpu) if "ALLOC_CONF" in p] == [
        "PYTORCH_ALLOC_CONF=expandable_segments:True (is 'max_split_size_mb:64')",
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (is None)"]
    # and a trial whose process ran without the variable did not measure the recipe
    assert spaces.not_in_effect(expandable, {"env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}) == [
        "cuda_alloc=expandable_segments is not in effect: PYTORCH_ALLOC_CONF was None"]
    assert spaces.not_in_effect(base, {"env": {}, "tf32": {"matmul": True, "cudnn": True}}) == [
        "tf32_matmul=False is not in effect: the process ran with True"]


def test_process_wide_cuda_knobs_are_compared_across_processes() -> None:
    """The allocator's variable is read once per process, and cuDNN's algorithm cache is the process's whatever
    the benchmark flag: an arm beside another in one worker would measure the other's."""
    from autotune.measure.environment import environment_differences, environment_keys

    assert {"cuda_alloc", "cudnn_benchmark"} <= set(environment_keys())
    assert {"tf32_matmul", "tf32_cudnn"}.isdisjoint(environment_keys())
    assert environment_differences({"device": "cuda", "cuda_alloc": "default"},
                                   {"device": "cuda", "cuda_alloc": "expandable_segments"}) == [
        "cuda_alloc='expandable_segments' (worker: 'default')"]


def test_apply_warns_naming_the_flag_the_process_changed(facts, restore_flags, monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the flags only: no GPU is touched here
    restore_flags["tf32_cudnn"].set(False)  # the user's script turned cuDNN TF32 off before apply()
    base = {**spaces.defaults(_gpu_machine(facts), CUDA), "device": "cuda"}
    with pytest.warns(UserWarning) as caught:
        tuned = autotune.apply({**base, "batch_size": 8}, facts=facts, check_hardware=False)
    name = restore_flags["tf32_cudnn"].name
    (problem,) = [w for w in tuned.warnings if name in w]
    assert problem.startswith(f"{name} is ") and "the recipe was measured with" in problem
    assert any(name in str(w.message) for w in caught)
    assert restore_flags["tf32_cudnn"].get() is False  # a default is not forced back: it is warned about


def test_a_recipe_from_before_the_tf32_split_applies_what_it_measured(restore_flags) -> None:
    spaces.cuda.apply_process({"device": "cuda", "tf32": True}, None)
    assert spaces.cuda.tf32_in_effect() == {"matmul": True, "cudnn": True}


def test_cpu_recipes_leave_cuda_flags_alone(restore_flags) -> None:
    restore_flags["tf32_cudnn"].set(False)
    assert spaces.cuda.apply_process({"device": "cpu", "tf32_cudnn": True}, None) == []
    assert restore_flags["tf32_cudnn"].get() is False


def test_cuda_knobs_are_offered_on_cuda_only(facts) -> None:
    gpu = _gpu_machine(facts)
    assert _allowed(gpu, CUDA, "cudnn_benchmark") == {False, True}
    assert _allowed(gpu, replace(CUDA, conv=False), "cudnn_benchmark") == {False}  # no convolutions
    assert _allowed(gpu, replace(CUDA, conv=False, conv_nd=True), "cudnn_benchmark") == {False, True}
    assert _allowed(gpu, CUDA, "tf32_matmul") == {False, True}
    assert _allowed(_gpu_machine(facts, "7.0"), CUDA, "tf32_matmul") == {False}  # Volta has no TF32
    assert _allowed(gpu, CUDA, "cuda_alloc") == {"default", "expandable_segments"}
    for key in spaces.cuda.KEYS:
        assert len(_allowed(gpu, SpaceContext(conv=True), key)) == 1, key
    # torch 2.9+ reads the generic variable before the CUDA one: both are set, and both cleared for the baseline
    assert spaces.environment({"cuda_alloc": "expandable_segments"}, gpu) == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    assert {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"} <= set(spaces.controlled_variables())


def test_the_allocator_setting_reaches_the_trial_process(facts, fast_settings, monkeypatch) -> None:
    """The variable is set before torch starts, in the trial process (here on the CPU, where torch ignores it;
    ``tests/test_gpu.py`` runs it on a GPU); a trial of the default allocator does not inherit the user's."""
    from autotune.trial import run_trial

    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.6")
    base = {**spaces.defaults(facts, SpaceContext(default_batch_size=32)), "device": "cpu", "reference_batch": 32}
    runs = {alloc: run_trial("tiny", {**base, "cuda_alloc": alloc}, facts, fast_settings, timeout_s=120)
            for alloc in ("expandable_segments", "default")}
    assert all(r.status == "ok" for r in runs.values()), {a: r.error for a, r in runs.items()}
    assert runs["expandable_segments"].in_effect["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in runs["default"].in_effect["env"]


def test_on_a_gpu_cpu_only_knobs_shrink(facts) -> None:
    gpu = _gpu_machine(facts)
    base = spaces.defaults(gpu, CUDA)
    assert _allowed(gpu, CUDA, "threads") == {base["threads"], 4}  # PyTorch's default, the GPU's local cores
    assert _allowed(gpu, CUDA, "interop_threads") == {base["interop_threads"]}
    assert _allowed(gpu, CUDA, "affinity") == {"none", "compact"}
    for key in ("openmp", "kmp_blocktime", "allocator"):
        assert _allowed(gpu, CUDA, key) == {base[key]}, key
    heuristic = spaces.heuristic(gpu, CUDA)
    assert spaces.outside({**base, **heuristic}, gpu, CUDA) == []  # the seed is in the space
    assert spaces.cpus_for({**heuristic, "device": "cuda"}, gpu) == [4, 5, 6, 7]  # pinned near the GPU


CONV3D = '''
import torch, autotune

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv3d(1, 4, 3, padding=1)
        self.head = torch.nn.Linear(4 * 4 * 8 * 8, 2)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).flatten(1))

def build():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 1, 4, 8, 8, generator=g)
    y = torch.randint(0, 2, (64,), generator=g)
    return autotune.Workload(model=Net, dataset=lambda: torch.utils.data.TensorDataset(x, y),
                             loss=lambda out, batch: torch.nn.functional.cross_entropy(out, batch[-1]),
                             optimizer=lambda p: torch.optim.SGD(p, lr=0.05), batch_size=8)
'''


# A Conv3d whose output a Conv2d reads: one 3-D convolution is enough to rule channels_last out.
MIXED = CONV3D.replace(
    "self.head = torch.nn.Linear(4 * 4 * 8 * 8, 2)",
    "self.mix = torch.nn.Conv2d(16, 4, 1)\n        self.head = torch.nn.Linear(4 * 8 * 8, 2)",
).replace("torch.relu(self.conv(x)).flatten(1)", "torch.relu(self.mix(self.conv(x).flatten(1, 2))).flatten(1)")


@pytest.mark.parametrize("source", [CONV3D, MIXED], ids=["conv3d", "conv3d+conv2d"])
def test_a_conv3d_model_is_not_offered_channels_last(facts, tmp_path: Path, source: str) -> None:
    """channels_last is a 4-D format: a Conv3d weight cannot take it (model.to raises), so the search,
    which used to offer it for any convolution, crashed such trials; a model that also has 2-D ones too."""
    assert source == CONV3D or "Conv2d" in source
    spec = tmp_path / "video.py"
    spec.write_text(textwrap.dedent(source))
    _, ctx = search_context(f"{spec}:build", facts, SearchOptions())
    assert (ctx.conv, ctx.conv_nd) == (False, True)
    assert _allowed(facts, ctx, "channels_last") == {False}
    assert all(not params.get("channels_last") for _, params in spaces.seeds(facts, ctx))
    with pytest.raises(RuntimeError):  # what a channels_last trial of it did
        autotune.apply({"batch_size": 8, "channels_last": True}, facts=facts,
                       check_hardware=False).prepare_model(autotune.workloads.load_workload(f"{spec}:build").model())
