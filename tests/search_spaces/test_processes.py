"""``processes``: DDP ranks on disjoint cores, really launched (gloo on this machine) and planned as data.

The 2-process tests start real ``torch.distributed.run`` jobs on the tiny workload; they are few on
purpose (each takes ~10 s on 2 shared cores). The rest checks the plan -- command, environment, CPU
slices, NCCL variables -- on fake machines: two sockets of 32 cores with the GPUs of
``tests/fakes/nvml.py`` (8x H100 behind NVSwitch, RTX 4090 on PCIe).
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import autotune
from autotune import search_spaces as spaces
from autotune.errors import UsageError
from autotune.probes import AllowedCpus, Core, Runtime
from autotune.search_spaces import SpaceContext
from autotune.trial import launch, loss_samples, run_trial

from ..conftest import REPO, SHARED
from .test_ddp import UNUSED  # ``tiny`` with a layer the forward pass never uses

NVIDIA_SMI = SHARED / "topologies" / "nvidia-smi-query"
TRIAL = [sys.executable, "-m", "autotune.trial.child", "spec.json"]


def _runtime(facts, *backends):
    """This machine's runtime with ``backends``, and no numactl: memory binding is tested in test_env_knobs."""
    base = facts.runtime or Runtime("3.11", "2.13.0", "cuda", "12.8", "gnu", *([None] * 6))
    return replace(base, distributed_backends=tuple(backends), numactl_path=None)


def _machine(facts, *, cores=64, sockets=2, smt=1, gpus=(), backends=("gloo",)):
    """A fake host: ``sockets`` packages (one NUMA node each) of ``cores // sockets`` cores, and ``gpus``."""
    per = cores // sockets
    core_list = tuple(Core(package=c // per, numa_node=c // per, cpus=tuple(c + k * cores for k in range(smt)))
                      for c in range(cores))
    allowed = AllowedCpus(cpus=f"0-{cores * smt - 1}", packages=sockets, cores=cores, threads=cores * smt,
                          numa_nodes=tuple(range(sockets)), core_list=core_list)
    return replace(facts, cpu=replace(facts.cpu, allowed=allowed), gpus=tuple(gpus),
                   runtime=_runtime(facts, *backends))


def _gpus(name, count, monkeypatch, visible=None):
    """The GPUs the probe reads from the fake NVML of a recorded machine (first ``count``), those
    ``CUDA_VISIBLE_DEVICES=visible`` selects (every one when None)."""
    if not NVIDIA_SMI.is_dir():
        pytest.skip(f"nvidia-smi dumps not found at {NVIDIA_SMI}")
    from autotune.probes import _gpu, _nvml
    from tests.fakes.nvml import load_machine

    fake = load_machine(NVIDIA_SMI, name)
    fake.gpus = fake.gpus[:count]
    monkeypatch.setattr(_nvml, "load_library", lambda: fake)
    return _gpu.probe_gpus({} if visible is None else {"CUDA_VISIBLE_DEVICES": visible})


# --- where the knob is offered -------------------------------------------------------------------------


def test_offered_on_cpu_with_two_cores_and_gloo(facts) -> None:
    cpu = SpaceContext()
    assert spaces.processes.choices(_machine(facts, cores=2, sockets=1), cpu) == (1, 2)
    assert spaces.processes.choices(_machine(facts, cores=64), cpu) == (1, 2, 4, 8)
    assert spaces.processes.choices(_machine(facts, cores=1, sockets=1), cpu) == (1,)
    assert spaces.processes.choices(_machine(facts, cores=2, sockets=1, backends=()), cpu) == (1,)
    assert spaces.defaults(facts, cpu)["processes"] == 1


def test_offered_on_gpus_with_two_gpus_and_nccl(facts, monkeypatch) -> None:
    cuda = SpaceContext(device="cuda")
    h100 = _gpus("H100SXMx8", 8, monkeypatch)
    assert spaces.processes.choices(_machine(facts, gpus=h100, backends=("gloo", "nccl")), cuda) == (1, 8)
    assert spaces.processes.choices(_machine(facts, gpus=h100, backends=("gloo",)), cuda) == (1,)
    assert spaces.processes.choices(_machine(facts, gpus=h100[:1], backends=("nccl",)), cuda) == (1,)
    assert spaces.processes.promising(_machine(facts, gpus=h100, backends=("nccl",)), cuda) == [{"processes": 8}]


def test_offered_up_to_the_visible_gpus_only(facts, monkeypatch) -> None:
    """CUDA_VISIBLE_DEVICES=0,1 on 8 GPUs: 8 ranks would ask for CUDA devices 2-7 ("invalid device ordinal")."""
    two = _gpus("H100SXMx8", 8, monkeypatch, visible="0,1")
    machine = _machine(facts, gpus=two, backends=("gloo", "nccl"))
    assert spaces.processes.choices(machine, SpaceContext(device="cuda")) == (1, 2)
    assert spaces.processes.promising(machine, SpaceContext(device="cuda")) == [{"processes": 2}]
    one = _machine(facts, gpus=_gpus("H100SXMx8", 8, monkeypatch, visible="3"), backends=("nccl",))
    assert spaces.processes.choices(one, SpaceContext(device="cuda")) == (1,)


def test_ranks_get_the_cpus_of_their_own_visible_gpu(facts, monkeypatch) -> None:
    """Local rank r trains on CUDA device r: with CUDA_VISIBLE_DEVICES=4,0 that is NVML GPU 4 (socket 1),
    then GPU 0 (socket 0), not NVML's GPUs 0 and 1."""
    machine = _machine(facts, gpus=_gpus("H100SXMx8", 8, monkeypatch, visible="4,0"), backends=("nccl",))
    params = {"processes": 2, "threads": 8, "affinity": "compact", "device": "cuda"}
    assert spaces.processes.rank_cpus(params, machine) == [list(range(32, 36)), list(range(0, 4))]
    env = spaces.environment(params, machine)
    assert env["AUTOTUNE_RANK_CPUS"] == "32-35;0-3" and env["NCCL_P2P_LEVEL"] == "NVL"


# --- the plan: command, environment, CPU slices --------------------------------------------------------


@pytest.mark.parametrize(
    ("threads", "affinity", "processes", "smt", "rank_cpus"),
    [
        (4, "none", 2, 1, "0-1;2-3"),  # every hardware thread of the rank's half
        (4, "none", 2, 2, "0-1,4-5;2-3,6-7"),  # with SMT siblings
        (2, "compact", 2, 2, "0;2"),  # share 1: first PU of the slice's first core
        (8, "compact", 2, 2, "0-1,4-5;2-3,6-7"),  # share 4: cores first, then siblings
        (4, "none", 4, 1, "0;1;2;3"),
        (3, "none", 2, 1, "0-1;2-3"),  # odd threads: share 1, but affinity none keeps the slice
    ],
)
def test_ranks_get_disjoint_cpu_slices_and_their_share_of_threads(facts, threads, affinity, processes, smt,
                                                                  rank_cpus) -> None:
    machine = _machine(facts, cores=4, sockets=2, smt=smt)
    params = {"threads": threads, "affinity": affinity, "processes": processes, "device": "cpu"}
    env = spaces.environment(params, machine)
    assert env["AUTOTUNE_RANK_CPUS"] == rank_cpus
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == str(max(1, threads // processes))
    slices = spaces.processes.rank_cpus(params, machine)
    assert sum(map(len, slices)) == len({c for s in slices for c in s})  # disjoint
    assert spaces.cpus_for(params, machine) == sorted(c for s in slices for c in s)  # the launcher's: the union


def test_plan_runs_python_under_torch_distributed_run(facts) -> None:
    machine = _machine(facts, cores=4, sockets=1)
    params = {"threads": 4, "processes": 2, "batch_size": 32, "device": "cpu"}
    planned = launch.plan(["python3", "train.py", "--epochs", "3"], params, machine, {"OMP_NUM_THREADS": "7"},
                          keep_user_env=False)
    assert planned.cmd == ["python3", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "train.py", "--epochs", "3"]
    assert (planned.env["OMP_NUM_THREADS"], planned.env["AUTOTUNE_RANK_CPUS"]) == ("2", "0-1;2-3")
    assert "NCCL_P2P_LEVEL" not in planned.env
    module = launch.plan(TRIAL, params, machine, {}, keep_user_env=False).cmd
    assert module[1:7] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m"]
    assert module[7:] == ["autotune.trial.child", "spec.json"]
    single = launch.plan(TRIAL, {**params, "processes": 1}, machine, {}, keep_user_env=False)
    assert single.cmd == TRIAL and "AUTOTUNE_RANK_CPUS" not in single.env and single.env["OMP_NUM_THREADS"] == "4"


def test_a_command_that_is_not_python_is_refused_with_the_way_to_run_it(facts) -> None:
    params = {"processes": 2, "threads": 2}
    for cmd in (["./train.sh"], ["python", "-u", "train.py"], ["python"]):
        with pytest.raises(UsageError, match="torchrun --standalone --nproc-per-node 2 SCRIPT ARGS"):
            launch.plan(cmd, params, _machine(facts, cores=2, sockets=1), {}, keep_user_env=True)
    own = ["torchrun", "--nproc-per-node", "2", "train.py"]
    kept = launch.plan(own, params, _machine(facts, cores=2, sockets=1), {}, keep_user_env=True)
    assert kept.cmd == own and any("torch.distributed.run itself" in w for w in kept.warnings)


@pytest.mark.parametrize(
    ("machine", "count", "nccl", "rank0", "rank7"),
    [
        ("H100SXMx8", 8, {"NCCL_P2P_LEVEL": "NVL"}, "0-7", "56-63"),  # NV18 between every pair: NVLink P2P
        ("RTX4090", 2, {}, "0-15", None),  # PCIe, no P2P: NCCL's own choice, nothing set
        ("RTX4090", 8, {}, "0-7", "56-63"),
    ],
)
def test_gpu_ranks_nccl_variables_and_gpu_local_cores(facts, monkeypatch, machine, count, nccl, rank0, rank7) -> None:
    host = _machine(facts, gpus=_gpus(machine, count, monkeypatch), backends=("gloo", "nccl"))
    params = {"processes": count, "threads": 64, "device": "cuda"}
    env = spaces.environment(params, host)
    assert {k: v for k, v in env.items() if k.startswith("NCCL_")} == nccl
    slices = env["AUTOTUNE_RANK_CPUS"].split(";")
    assert len(slices) == count and slices[0] == rank0 and (rank7 is None or slices[7] == rank7)
    # every rank's cores are local to its GPU (the fake host: bus < 0x80 on socket 0, CPUs 0-31)
    for gpu, cpus in zip(host.gpus, spaces.processes.rank_cpus(params, host), strict=True):
        local = range(0, 32) if gpu.cpu_affinity == "0-31" else range(32, 64)
        assert cpus and set(cpus) <= set(local)


def test_the_batch_is_per_rank_on_eight_gpus(facts, monkeypatch) -> None:
    """8 H100s: each rank loads the default batch (not 64 / 8), the memory cap is one GPU's (not one GPU's
    for the batch of all eight), and a step over the ranks is ``batch_per_rank x 8`` samples."""
    import torch

    from autotune.study.driver import _max_batch
    from autotune.trial import TrialSettings, loss_samples
    from autotune.workloads import cnn

    host = _machine(facts, gpus=_gpus("H100SXMx8", 8, monkeypatch), backends=("gloo", "nccl"))
    workload = cnn.workload()
    cap = _max_batch(workload, workload.model(), host, "cuda")
    one_gpu = spaces.batch.max_batch_size(host.gpus[0].memory_bytes, workload.model(),
                                          (torch.zeros(2, 3, 32, 32),), 2)
    assert cap == one_gpu and cap > 4 * 64  # an H100 holds 4x the default per rank: all sizes offered
    ctx = SpaceContext(device="cuda", default_batch_size=64, conv=True, max_batch_size=cap)
    assert spaces.batch.sizes(ctx) == (16, 32, 64, 128, 256)
    base = spaces.defaults(host, ctx)
    assert base["batch_per_rank"] == 64 and "batch_size" not in base
    eight = {**base, "processes": 8, "device": "cuda", "reference_batch": 64}
    assert (spaces.batch.per_rank(eight), spaces.batch.global_size(eight)) == (64, 512)
    assert spaces.batch.lr_scale({**eight, "lr_scaling": "linear"}, 64) == 8.0  # the global batch's rule
    assert spaces.batch.per_rank({"batch_size": 64, "processes": 8}) == 8  # format 1: the batch of all eight
    assert loss_samples(TrialSettings(), eight, host) % (256 * 8) == 0  # whole steps of the largest, 8 ranks


def test_apply_outside_torchrun_warns_and_trains_alone(facts, monkeypatch) -> None:
    import torch

    for var in ("LOCAL_RANK", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(var, raising=False)
    before = torch.get_num_threads()
    try:
        with pytest.warns(UserWarning, match="not started by torch.distributed.run"):
            tuned = autotune.apply({"batch_size": 8, "processes": 2, "threads": 1}, facts=facts, check_hardware=False)
    finally:
        torch.set_num_threads(before)
    assert (tuned.world_size, tuned.batch_size, tuned.sampler(list(range(8)))) == (1, 8, None)


# --- real ranks ----------------------------------------------------------------------------------------


def crash_on_rank_1():
    """The tiny workload whose loss fails on rank 1 only (rank 0 would go on, waiting on it)."""
    import os

    from autotune.workloads import tiny
    from tests.faulty_workloads import _with_loss

    def loss(output, batch):
        if os.environ.get("RANK") == "1":
            raise ValueError("fake: rank 1 has a bug")
        return tiny._loss(output, batch)

    return _with_loss(loss)


def _two(facts, **changes):
    params = {**spaces.defaults(facts, SpaceContext(default_batch_size=32)), "device": "cpu", "reference_batch": 32,
              "threads": 2, "interop_threads": 1, "processes": 2}
    return {**params, **changes}


@pytest.fixture(scope="module")
def two_cores(facts):
    if "gloo" not in spaces.processes._backends(facts) or (facts.cpu.allowed.cores or 0) < 2:
        pytest.skip("needs 2 allowed cores and gloo")
    return facts


@pytest.fixture(scope="module")
def two_ranks(two_cores, fast_settings) -> tuple[dict[str, Any], Any, list[int]]:
    """One 2-process trial as the search runs it, shared by the tests of what such a trial reports (each starts
    torchrun and two ranks: ~10 s here): of a model with an unused parameter, whose ``find_unused_parameters``
    the search detects and sets. Its params, its result and the windows it told."""
    from autotune.study import SearchOptions, search_context

    _, ctx = search_context(UNUSED, two_cores, SearchOptions())
    params = {**spaces.defaults(two_cores, ctx), "device": "cpu", "reference_batch": 32, "threads": 2,
              "interop_threads": 1, "processes": 2}
    windows: list[int] = []
    result = run_trial(UNUSED, params, two_cores, fast_settings, timeout_s=120,
                       on_window=lambda i, s: windows.append(i) or False)
    assert result.status == "ok", (result.error, result.log_tail)
    return params, result, windows


def test_two_process_trial_reports_global_throughput_and_disjoint_ranks(two_ranks) -> None:
    _, result, windows = two_ranks
    effect = result.in_effect
    assert effect["world_size"] == 2 and len(effect["ranks"]) == 2
    assert [r["threads"] for r in effect["ranks"]] == [1, 1]
    first, second = (set(r["cpus"]) for r in effect["ranks"])
    assert first and second and not first & second
    assert effect["env"]["OMP_NUM_THREADS"] == "1"
    assert windows == [0, 1] and result.samples_per_s > 0 and 0 < result.loss < 10
    assert result.warnings == []


def test_a_model_with_an_unused_parameter_trains_in_two_ranks(two_ranks) -> None:
    """The detected ``find_unused_parameters`` in the trial's params, and the ranks train past the second step
    (without it DDP fails there: "Expected to have finished reduction"; the setting itself: test_ddp.py)."""
    params, result, _ = two_ranks
    assert params["find_unused_parameters"] is True and result.in_effect["ddp"]["find_unused_parameters"] is True


def test_two_ranks_take_their_loss_after_the_samples_of_one_process(two_ranks, two_cores, fast_settings) -> None:
    """Several ranks train in a trial of their own (torchrun; a paired worker is one process): the loss is taken
    after the samples one process trains, summed over the ranks, so the guard compares like with like
    (one process's arms: tests/study/test_quality.py)."""
    params, result, _ = two_ranks
    assert result.loss_samples == loss_samples(fast_settings, {**params, "processes": 1}, two_cores) > 0


def test_a_crash_in_any_rank_is_a_failed_trial_and_no_rank_is_left(two_cores, fast_settings) -> None:
    import psutil

    before = {p.pid for p in psutil.process_iter()}
    result = run_trial(f"{__name__}:crash_on_rank_1", _two(two_cores), two_cores, fast_settings, timeout_s=120)
    assert result.status == "crash" and "fake: rank 1 has a bug" in result.error
    # torchrun and its ranks carry the trial's spec path, removed when run_trial returned (other trials
    # running on this machine meanwhile keep theirs)
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if p.pid not in before
                 and "autotune.trial.child" in (p.info["cmdline"] or []) and not Path(p.info["cmdline"][-1]).exists()]
    assert leftovers == []


SCRIPT = """
import json, os, warnings, torch, autotune
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    tuned = autotune.apply()
model = tuned.prepare_model(torch.nn.Linear(4, 2))
# one file per rank: ranks share stdout, and under PYTHONUNBUFFERED their lines can interleave
with open(f"rank{tuned.rank}.json", "w") as f:
    json.dump({"rank": tuned.rank, "world": tuned.world_size, "cpus": sorted(os.sched_getaffinity(0)),
               "threads": torch.get_num_threads(), "model": type(model).__name__, "batch": tuned.batch_size,
               "warnings": [str(w.message) for w in caught]}, f)
"""


@pytest.mark.parametrize("recipe_format", [2, 1])
def test_autotune_run_starts_the_ranks_of_a_two_process_recipe(two_cores, tmp_path: Path, recipe_format) -> None:
    """Each rank loads ``batch_per_rank`` (format 2); a format-1 recipe's ``batch_size`` 16 is shared: 8 each,
    with the one line that says so."""
    params = _two(two_cores, batch_per_rank=8)
    if recipe_format == 1:
        params = {**{k: v for k, v in params.items() if k != "batch_per_rank"}, "batch_size": 16}
    recipe = {"params": params, "workload": "tiny", "fingerprint": two_cores.fingerprint,
              **({"format": 2} if recipe_format == 2 else {})}
    (tmp_path / "r.json").write_text(json.dumps(recipe))
    (tmp_path / "show.py").write_text(textwrap.dedent(SCRIPT))
    out = subprocess.run([sys.executable, "-m", "autotune", "run", "--recipe", "r.json", "--", sys.executable,
                          "show.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    ranks = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert [(r["rank"], r["world"], r["threads"], r["batch"]) for r in ranks] == [(0, 2, 1, 8), (1, 2, 1, 8)]
    assert {r["model"] for r in ranks} == {"DistributedDataParallel"}
    assert ranks[0]["cpus"] and ranks[1]["cpus"] and not set(ranks[0]["cpus"]) & set(ranks[1]["cpus"])
    old = [] if recipe_format == 2 else ["recipe from r.json is format 1: its batch_size 16 is the batch of all 2 "
                                         "processes together (8 per process); recipes searched now hold batch_per_rank"]
    assert [r["warnings"] for r in ranks] == [old, old]
