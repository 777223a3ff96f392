"""``autotune export --format env`` and ``autotune run`` resolve a recipe on the machine the same way (one
probe, one plan: ``autotune.trial.launch.for_recipe``), here on the fake HGX H100 host of ``tests/fakes/nvml.py``:
two sockets of 32 cores, 8 GPUs behind NVSwitch (GPUs 0-3 local to CPUs 0-31, 4-7 to CPUs 32-63)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from autotune import cli, probes
from autotune import search_spaces as spaces
from autotune.probes import AllowedCpus, Core, _nvml, _probe
from autotune.recipe_file import load_recipe_file, parse_env
from autotune.trial import launch

from .conftest import SHARED

NVIDIA_SMI = SHARED / "topologies" / "nvidia-smi-query"
PARAMS = {"processes": 8, "threads": 32, "affinity": "compact", "device": "cuda", "batch_size": 64}


@pytest.fixture
def hgx_host(facts, monkeypatch):
    """probe() on this machine reads the fake NVML of 8 H100s and the fake 64-core host's CPU topology."""
    if not NVIDIA_SMI.is_dir():
        pytest.skip(f"nvidia-smi dumps not found at {NVIDIA_SMI}")
    from tests.fakes.nvml import load_machine

    fake = load_machine(NVIDIA_SMI, "H100SXMx8")
    monkeypatch.setattr(_nvml, "load_library", lambda: fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # every GPU, unless a test says otherwise
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    cores = tuple(Core(package=c // 32, numa_node=c // 32, cpus=(c,)) for c in range(64))
    allowed = AllowedCpus(cpus="0-63", packages=2, cores=64, threads=64, numa_nodes=(0, 1), core_list=cores)
    cpu = replace(facts.cpu, allowed=allowed, cgroup=allowed)
    monkeypatch.setattr(_probe, "cpu_topology", lambda root: cpu)


class _Done:
    def wait(self) -> int:
        return 0


def test_the_env_file_and_the_run_plan_carry_the_same_variables_and_cpus(hgx_host, monkeypatch,
                                                                         tmp_path: Path) -> None:
    recipe = tmp_path / "r.json"
    recipe.write_text(json.dumps({"params": PARAMS, "workload": "tiny", "fingerprint": probes.probe().fingerprint}))
    assert cli.main(["export", "--format", "env", "--recipe", str(recipe), "-o", str(tmp_path / "best.env")]) == 0
    started: list[launch.LaunchPlan] = []
    monkeypatch.setattr(launch, "start", lambda plan: started.append(plan) or _Done())  # plan it, start nothing
    assert cli.main(["run", "--recipe", str(recipe), "--", "python", "train.py"]) == 0

    (plan,) = started
    exported = {k: v for k, (_, v) in parse_env((tmp_path / "best.env").read_text()).items()}
    assert exported["NCCL_P2P_LEVEL"] == plan.env["NCCL_P2P_LEVEL"] == "NVL"  # NV18 between every pair
    slices = exported["AUTOTUNE_RANK_CPUS"].split(";")
    assert exported["AUTOTUNE_RANK_CPUS"] == plan.env["AUTOTUNE_RANK_CPUS"] and len(slices) == 8
    # rank i: the first threads // 8 = 4 cores of its 8, on the socket of its GPU
    assert slices == [f"{8 * i}-{8 * i + 3}" for i in range(8)]
    pinned = [c for i in range(8) for c in range(8 * i, 8 * i + 4)]
    assert exported.pop("AUTOTUNE_CPUS") == ",".join(map(str, plan.cpus)) == ",".join(map(str, pinned))
    membind = exported.pop("AUTOTUNE_MEMBIND", "")
    assert membind == ",".join(map(str, plan.membind))
    assert (f"--membind={membind}" in plan.cmd) is bool(membind)
    assert exported == {k: v for k, v in plan.env.items() if k in exported}  # every variable, the same value
    assert {k for k, v in plan.env.items() if os.environ.get(k) != v} == set(exported)  # and no other


def test_a_single_process_gpu_recipe_pins_cpus_local_to_its_gpu(hgx_host, monkeypatch, tmp_path: Path) -> None:
    """CUDA device 0 is NVML's GPU 5 (socket 1): its process is pinned to cores of socket 1, as a rank would be."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    recipe = tmp_path / "r.json"
    recipe.write_text(json.dumps({"params": {"threads": 4, "affinity": "compact", "device": "cuda",
                                             "batch_size": 64}, "workload": "tiny",
                                  "fingerprint": probes.probe().fingerprint}))
    assert cli.main(["export", "--format", "env", "--recipe", str(recipe), "-o", str(tmp_path / "best.env")]) == 0
    exported = {k: v for k, (_, v) in parse_env((tmp_path / "best.env").read_text()).items()}
    assert exported["AUTOTUNE_CPUS"] == "32,33,34,35"
    assert exported.get("AUTOTUNE_MEMBIND", "1") == "1"  # the GPU's NUMA node, where numactl is found


def test_the_memory_cap_is_the_visible_mig_slice(hgx_host, monkeypatch) -> None:
    """The study's batch-size cap reads the memory of the device the trials train on: a 10 GiB MIG slice caps
    far below a whole 80 GiB H100."""
    from autotune.study import driver
    from autotune.workloads.cnn import workload

    fake = _nvml.load_library()
    fake.with_mig(0, ("MIG-11111111-2222-3333-4444-555555555555", 9984 * 2**20))
    wl = workload()
    model = wl.model()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    whole = driver._max_batch(wl, model, _probe.probe(runtime=False), "cuda")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-11111111")
    sliced = _probe.probe(runtime=False)
    assert sliced.gpus[0].memory_bytes == 9984 * 2**20
    assert driver._max_batch(wl, model, sliced, "cuda") < whole


_RUN_WITHOUT_TORCH = """
import json, sys
from autotune import cli, probes
from autotune import search_spaces as spaces
from autotune.trial import launch

class Done:
    def wait(self):
        return 0

plans = []
launch.start = lambda plan: plans.append(plan) or Done()  # plan it, start nothing
codes = [cli.main(["run", "--recipe", path, "--", "true"]) for path in sys.argv[1:]]
print(json.dumps({"codes": codes, "torch": "torch" in sys.modules, "fingerprint": probes.probe().fingerprint,
                  "plans": [[plan.env, plan.cpus] for plan in plans]}))
"""


def test_autotune_run_plans_without_importing_torch_what_the_imported_runtime_plans(tmp_path: Path) -> None:
    """``autotune run`` starts your command without importing torch first (seconds of its own before your
    training's import): its probe reads torch's version from its files, the fingerprint and the plan are those of
    the probe that imports it (the tree's libraries: Intel's OpenMP, tcmalloc, jemalloc, glibc's kept heap)."""
    facts = probes.probe(gpus=False)  # torch imported: the runtime as the search probes it
    recipes = [{"openmp": "intel", "kmp_blocktime": 1, "allocator": "tcmalloc", "affinity": "compact",
                "threads": 1, "interop_threads": 1},
               {"allocator": "jemalloc", "affinity": "spread"}, {"allocator": "glibc-kept"}]
    paths = []
    for i, params in enumerate(recipes):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps({"params": params, "workload": "tiny", "fingerprint": facts.fingerprint}))
    out = subprocess.run([sys.executable, "-c", _RUN_WITHOUT_TORCH, *map(str, paths)], capture_output=True,
                         text=True, check=True, timeout=60)
    found = json.loads(out.stdout.splitlines()[-1])
    assert (found["codes"], found["torch"], found["fingerprint"]) == ([0, 0, 0], False, facts.fingerprint), \
        out.stderr
    for params, path, (env, cpus) in zip(recipes, paths, found["plans"], strict=True):
        plan = launch.for_recipe(load_recipe_file(path), ["true"], os.environ, facts=facts)
        ours = {*spaces.env_forms(params), "AUTOTUNE_RECIPE"}  # every variable the recipe's families may set
        assert {k: env.get(k) for k in ours} == {k: plan.env.get(k) for k in ours}, params
        assert cpus == (None if plan.cpus is None else list(plan.cpus)), params  # pinned where affinity says
