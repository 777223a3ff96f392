"""The CUDA code paths on a real GPU: live NVML facts, trials on the GPU, a search that picks a GPU recipe.

Marked ``gpu``: they run where torch sees a CUDA device and NVML answers, and skip elsewhere (the
fake-NVML tests in tests/probes cover the GPU facts on machines we lack).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def gpu_facts():
    from autotune import probes

    return probes.probe()


def test_live_nvml_facts_match_torch(gpu_facts):
    assert len(gpu_facts.gpus) == torch.cuda.device_count()
    for gpu in gpu_facts.gpus:
        props = torch.cuda.get_device_properties(gpu.index)
        assert gpu.compute_capability == f"{props.major}.{props.minor}"
        assert props.name in gpu.name or gpu.name in props.name
        # NVML counts all the memory, torch what the context can see: within 2%.
        assert abs(gpu.memory_bytes - props.total_memory) < 0.02 * gpu.memory_bytes
        assert gpu.pci_bus_id
        assert set(gpu.links) == {str(g.index) for g in gpu_facts.gpus if g.index != gpu.index}
    assert gpu_facts.runtime.torch_build == "cuda"
    assert "nccl" in gpu_facts.runtime.distributed_backends


@pytest.mark.parametrize(("amp_dtype", "output"), [("float32", "float32"), ("bfloat16", "bfloat16"),
                                                   ("float16", "float16")])
def test_autocast_on_cuda_is_in_effect(gpu_facts, amp_dtype, output):
    import autotune

    if amp_dtype == "bfloat16" and torch.cuda.get_device_capability(0) < (8, 0):
        pytest.skip("bfloat16 autocast needs compute capability 8.0 (the space does not offer it below)")

    params = {"device": "cuda", "batch_size": 8, "amp_dtype": amp_dtype, "threads": 1}
    tuned = autotune.apply(params, facts=gpu_facts, check_hardware=False)
    model = tuned.prepare_model(torch.nn.Linear(16, 4))
    assert next(model.parameters()).is_cuda
    (x,) = tuned.to_device(torch.randn(8, 16))
    with tuned.autocast():
        y = model(x)
    assert str(y.dtype) == f"torch.{output}"
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert tuned.step(y.float().pow(2).mean(), optimizer) is True
    assert (tuned._scaler is not None) == (amp_dtype == "float16")  # GradScaler only for float16
    assert tuned.in_effect["amp"] == {"autocast": None if amp_dtype == "float32" else output, "output_dtype": output,
                                      "channels_last_parameters": None, "channels_last_inputs": None}


def test_trial_runs_on_the_gpu(gpu_facts, fast_settings):
    from autotune import search_spaces as spaces
    from autotune.trial import run_trial

    ctx = spaces.SpaceContext(device="cuda", default_batch_size=64, conv=True)
    base = {**spaces.defaults(gpu_facts, ctx), "device": "cuda", "reference_batch": 64}
    fp32 = run_trial("cnn", base, gpu_facts, fast_settings, timeout_s=300)
    bf16 = run_trial("cnn", {**base, "amp_dtype": "bfloat16", "channels_last": True, "tf32_matmul": True,
                                      "cudnn_benchmark": True}, gpu_facts,
                     fast_settings, timeout_s=300)
    for result in (fp32, bf16):
        assert result.status == "ok", result.error
        assert result.samples_per_s > 0 and result.loss == result.loss
        # the timed windows' peak, measured on the device (max_memory_allocated after the warm-up)
        assert 0 < result.peak_memory_bytes < result.in_effect["device_memory_bytes"]
    # What the trial process ran with (its first training step, its torch.backends flags), not the params.
    assert fp32.in_effect["amp"] == {"autocast": None, "output_dtype": "float32", "channels_last_parameters": False,
                                     "channels_last_inputs": False}
    assert fp32.in_effect["tf32"] == {"matmul": False, "cudnn": True}  # PyTorch's defaults: the baseline
    assert (fp32.in_effect["cudnn_benchmark"], bf16.in_effect["cudnn_benchmark"]) == (False, True)
    assert bf16.in_effect["amp"] == {"autocast": "bfloat16", "output_dtype": "bfloat16",
                                     "channels_last_parameters": True, "channels_last_inputs": True}
    assert bf16.in_effect["tf32"] == {"matmul": True, "cudnn": True}
    print(json.dumps({"cnn_fp32": fp32.samples_per_s, "cnn_bf16_cl": bf16.samples_per_s}))


def test_cuda_graph_capture_is_compile_time_and_lazy_cuda_init_is_not(gpu_facts):
    """reduce-overhead: steps 2-3 (cudagraph trees' warm-up and capture) are charged with the compile; an
    eager run's first step (CUDA, cuBLAS and cuDNN initialised lazily) is not charged at all."""
    from autotune import search_spaces as spaces
    from autotune.trial import TrialSettings, run_trial

    settings = TrialSettings(warmup_steps=4, measure_steps=12, windows=2, max_extra_windows=0, eval_samples=128)
    ctx = spaces.SpaceContext(device="cuda", default_batch_size=64, conv=True)
    base = {**spaces.defaults(gpu_facts, ctx), "device": "cuda", "reference_batch": 64}
    eager = run_trial("cnn", base, gpu_facts, settings, timeout_s=300)
    graphs = run_trial("cnn", {**base, "compile_mode": "reduce-overhead"}, gpu_facts, settings, timeout_s=600)
    assert eager.status == graphs.status == "ok", (eager.error, graphs.error)
    assert eager.compile_s == 0.0 and eager.in_effect["first_steps_s"][0] > 0
    steps = graphs.in_effect["first_steps_s"]
    steady = 64 / graphs.samples_per_s
    assert len(steps) == 3 and graphs.compile_s == pytest.approx(sum(max(0.0, s - steady) for s in steps))
    assert graphs.compile_s > steps[0] - steady  # steps 2-3 add to it
    print(json.dumps({"eager_first_step_s": eager.in_effect["first_steps_s"][0], "reduce_overhead_steps_s": steps,
                      "reduce_overhead_compile_s": graphs.compile_s, "peak_memory_bytes": graphs.peak_memory_bytes}))


def test_search_on_the_gpu_stores_a_cuda_recipe(tmp_path: Path):
    from .conftest import FAST, run_cli

    out = run_cli("search", "--workload", "cnn", "--budget", "4m", "--trials", "6", "--no-compile", *FAST,
                  cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    best = json.loads(run_cli("best", "--json", cwd=tmp_path).stdout)
    assert best["params"]["device"] == "cuda"
    # Where the speedup comes from: the confirmation runs of the trial the notes name (or of the defaults), and
    # that trial ran on the GPU with the recipe's precision in effect -- each of these can fail.
    named = [n for n in best["notes"] if n.startswith("best (trial ")]
    number = int(named[0].split()[2].rstrip(")")) if named else 0
    assert named or any("keeps the defaults" in n for n in best["notes"]), best["notes"]
    assert best["samples_per_s"] == pytest.approx(best["speedup"] * best["baseline_samples_per_s"])
    import optuna

    trial = optuna.load_study(study_name=best["study"], storage=f"sqlite:///{tmp_path / 'studies.db'}").trials[number]
    assert trial.user_attrs["params"] == best["params"]
    amp = trial.user_attrs["in_effect"]["amp"]
    wanted = best["params"].get("amp_dtype", "float32")
    assert amp["autocast"] == (None if wanted == "float32" else wanted), amp
    assert amp["channels_last_parameters"] == bool(best["params"].get("channels_last")), amp
    print(out.stdout)


def test_a_trial_that_runs_out_of_device_memory_is_oom(gpu_facts, fast_settings):
    """A real CUDA allocation failure (not a faked exception, as the CPU tests raise) is ``oom``."""
    from autotune import search_spaces as spaces
    from autotune.trial import run_trial

    ctx = spaces.SpaceContext(device="cuda", default_batch_size=32)
    base = {**spaces.defaults(gpu_facts, ctx), "device": "cuda", "reference_batch": 32}
    result = run_trial("tests.faulty_workloads:device_oom", base, gpu_facts, fast_settings, timeout_s=300)
    assert result.status == "oom", (result.error, result.log_tail)


def test_expandable_segments_are_in_effect_in_the_trial(gpu_facts, fast_settings):
    from autotune import search_spaces as spaces
    from autotune.trial import run_trial

    ctx = spaces.SpaceContext(device="cuda", default_batch_size=32)
    base = {**spaces.defaults(gpu_facts, ctx), "device": "cuda", "reference_batch": 32}
    result = run_trial("tiny", {**base, "cuda_alloc": "expandable_segments"}, gpu_facts, fast_settings, timeout_s=300)
    assert result.status == "ok", (result.error, result.log_tail)
    assert result.in_effect["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in run_trial("tiny", base, gpu_facts, fast_settings,
                                                      timeout_s=300).in_effect["env"]


def test_the_gpus_matmul_peaks_bound_a_timed_matmul_and_are_measured_in_a_child(gpu_facts, tmp_path: Path):
    """``autotune probe``'s GPU limits: each precision the GPU computes, the fp32 peak at least a 4096x4096 matmul
    timed here (CUDA events), TF32 and the 16-bit ones above fp32's on tensor cores, a bandwidth; a search measures
    them in a child, so its process holds no CUDA context of its own."""
    from autotune import probes
    from autotune.study import machine

    limits = probes.limits(gpu_facts, "cuda", tmp_path, in_child=True)
    print(f"the GPU's limits measured in a child in {limits.seconds:.1f} s")
    assert limits.seconds < machine.CHILD_LEAST_S  # a short search's child gets no more
    peaks = dict(limits.matmul)
    capability = min(float(g.compute_capability) for g in gpu_facts.gpus)
    assert "float32" in peaks and ("bfloat16" in peaks) == (capability >= 8.0), peaks
    a, b = torch.randn(4096, 4096, device="cuda"), torch.randn(4096, 4096, device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.mm(a, b)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        torch.mm(a, b)
    end.record()
    end.synchronize()
    timed = 10 * 2 * 4096 ** 3 / (start.elapsed_time(end) / 1e3) / 1e9
    assert peaks["float32"] >= 0.8 * timed, (peaks, timed)  # a busy GPU may read a little lower once
    if capability >= 8.0:
        assert peaks["tfloat32"] > peaks["float32"] and peaks["bfloat16"] > peaks["float32"], peaks
    assert limits.bandwidth_gbs > 100, limits  # any datacenter GPU's HBM, far above a CPU's DRAM
    assert probes.limits(gpu_facts, "cuda", tmp_path) == limits  # cached


def test_a_tensor_core_gpus_reduced_precisions_are_not_read_as_hopeless(gpu_facts, tmp_path: Path):
    """The kernel speeds that order and drop the precision seeds (``probes.measured``), on the GPU: an H100 read
    bf16 and fp16 over 400x slower than float32 while its first use's costs were counted, and the search seeded
    neither. Neither may be dropped; at these sizes a GPU's step is its launches and autocast's casts, near
    float32's (the conv's float32 runs on TF32), so no gain is asserted (docs/measurement.md)."""
    from autotune import probes

    if min(float(g.compute_capability) for g in gpu_facts.gpus) < 8.0:
        pytest.skip("no bf16 tensor cores")
    found = probes.measured(gpu_facts.fingerprint, "cuda", tmp_path)
    for dtype in ("bfloat16", "float16"):
        speed = found.speed(dtype)
        assert speed is not None and not speed.bound and not speed.hopeless(), found
    print(json.dumps([{"dtype": k.dtype, "speed": k.speed, "kernels": k.kernels} for k in found.precision]))
