"""The environment-level knobs (OpenMP runtime, block time, allocator, pinning and memory binding):
planned as data for other machines, then really in effect in a trial, under ``autotune run``, and
after loading the exported env file, with ``autotune.apply()`` warning when they are not."""
from __future__ import annotations

import ctypes.util
import json
import os
import platform
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from autotune import search_spaces as spaces
from autotune.probes import Runtime, format_cpulist
from autotune.recipe_file import load_recipe_file, to_env
from autotune.trial import launch, run_trial

from .. import conftest
from ..fakes.machines import two_sockets

IOMP5, JEMALLOC = "/opt/lib/libiomp5.so", "/usr/lib/libjemalloc.so.2"
TCMALLOC, NUMACTL = "/usr/lib/libtcmalloc.so.4", "/usr/bin/numactl"


def _runtime(**changes) -> Runtime:
    found = Runtime(python="3.11", torch_version="2.13.0", torch_build="cpu", cuda_version=None, openmp="gnu",
                    iomp5_path=IOMP5, jemalloc_path=JEMALLOC, tcmalloc_path=TCMALLOC, numactl_path=NUMACTL,
                    taskset_path="/usr/bin/taskset", onednn=None)
    return replace(found, **changes)


def _two_sockets(facts, mems=(0, 1), **runtime):
    """The fake two-socket machine with every library found (``runtime``: what differs)."""
    return replace(two_sockets(facts, mems), runtime=_runtime(**runtime))


def _params(facts, **changes):
    params = {**spaces.defaults(facts, spaces.SpaceContext(default_batch_size=32)), "device": "cpu",
              "reference_batch": 32}
    return {**params, **changes}


def _permitted(numactl, nodes):
    return None


def _refused(numactl, nodes):
    return "set_mempolicy: Operation not permitted"


INTEL = {"openmp": "intel", "kmp_blocktime": 1}
PINNED = {"affinity": "compact", "threads": 4}


@pytest.mark.parametrize(
    ("changes", "membind", "prefix", "env", "cpus"),
    [
        ({}, _permitted, [], {}, None),  # PyTorch's defaults: nothing set, nothing wrapped
        (INTEL, _permitted, [], {"LD_PRELOAD": IOMP5, "KMP_BLOCKTIME": "1"}, None),  # no pinning: no KMP_AFFINITY
        ({**INTEL, **PINNED, "allocator": "tcmalloc"}, _permitted, [NUMACTL, "--membind=0", "--"],
         {"LD_PRELOAD": f"{IOMP5}:{TCMALLOC}", "KMP_BLOCKTIME": "1", "KMP_AFFINITY": "granularity=fine,compact,1,0"},
         [0, 1, 2, 3]),
        ({**INTEL, "affinity": "spread", "threads": 4, "kmp_blocktime": 0}, _permitted,
         [NUMACTL, "--membind=0,1", "--"],
         {"LD_PRELOAD": IOMP5, "KMP_BLOCKTIME": "0", "KMP_AFFINITY": "granularity=fine,compact,1,0"}, [0, 1, 4, 5]),
        ({**PINNED, "allocator": "jemalloc"}, _permitted, [NUMACTL, "--membind=0", "--"],
         {"LD_PRELOAD": JEMALLOC, "MALLOC_CONF": spaces.preload.JEMALLOC_CONF}, [0, 1, 2, 3]),  # GNU: no KMP_*
        ({**INTEL, **PINNED}, _refused, [],  # refused: started unbound, with a warning
         {"LD_PRELOAD": IOMP5, "KMP_BLOCKTIME": "1", "KMP_AFFINITY": "granularity=fine,compact,1,0"}, [0, 1, 2, 3]),
    ],
)
def test_plan_on_a_two_socket_machine(facts, changes, membind, prefix, env, cpus) -> None:
    params = _params(facts, **changes)
    planned = launch.plan(["python", "train.py"], params, _two_sockets(facts), {"PATH": "/bin"}, keep_user_env=False,
                          membind_refused=membind)
    assert planned.cmd == [*prefix, "python", "train.py"]
    assert planned.env == {"PATH": "/bin", **spaces.threads.environment(params, facts), **env}
    assert planned.cpus == cpus
    refused = membind is _refused
    bound_warnings = [("not permitted" in w and "memory is not bound" in w) for w in planned.warnings]
    assert bound_warnings == ([True] if refused else [])


def test_memory_is_bound_only_to_nodes_the_cpuset_allows(facts) -> None:
    params = _params(facts, affinity="spread", threads=4)
    planned = launch.plan(["x"], params, _two_sockets(facts, mems=(0,)), {}, keep_user_env=False,
                          membind_refused=_permitted)
    assert planned.cmd == [NUMACTL, "--membind=0", "--", "x"] and planned.cpus == [0, 1, 4, 5]


def test_no_numactl_means_no_binding_and_a_warning_on_several_nodes(facts) -> None:
    params = _params(facts, **PINNED)
    planned = launch.plan(["x"], params, _two_sockets(facts, numactl_path=None), {}, keep_user_env=False,
                          membind_refused=_permitted)
    assert planned.cmd == ["x"] and any("numactl not found" in w for w in planned.warnings)


def test_a_pinning_is_asked_unbound_where_its_memory_cannot_be_bound(facts, monkeypatch) -> None:
    """``spaces.as_run``: what the launcher will do (``membind`` False where numactl is missing or refused), so a
    search keys the trial's worker as its record will read; unchanged where the binding happens or none is implied."""
    pinned, plain = _params(facts, **PINNED), _params(facts)
    assert spaces.as_run(pinned, _two_sockets(facts, numactl_path=None)) == {**pinned, "membind": False}
    assert spaces.as_run(plain, _two_sockets(facts, numactl_path=None)) == plain
    monkeypatch.setattr(spaces.threads, "membind_refused", _refused)
    assert spaces.as_run(pinned, _two_sockets(facts)) == {**pinned, "membind": False}
    monkeypatch.setattr(spaces.threads, "membind_refused", _permitted)
    assert spaces.as_run(pinned, _two_sockets(facts)) == pinned
    for machine, refused in ((_two_sockets(facts, numactl_path=None), _permitted), (_two_sockets(facts), _refused),
                             (_two_sockets(facts), _permitted)):  # what the launcher does with the params as asked
        monkeypatch.setattr(spaces.threads, "membind_refused", refused)
        bound = launch.plan(["x"], pinned, machine, {}, keep_user_env=False, membind_refused=refused).membind
        assert (spaces.as_run(pinned, machine).get("membind") is False) == (not bound)
    # and where a trial ran unbound anyway, its record still says so (``verdict.record``)
    assert spaces.membind_off((0,), {"memory_policy": "default"}) and not spaces.membind_off((0,), {
        "memory_policy": "bind:0"}) and not spaces.membind_off(None, {"memory_policy": "default"})


def test_a_trial_starts_clean_but_autotune_run_merges_ld_preload(facts) -> None:
    machine = _two_sockets(facts)
    params = _params(facts, **INTEL, allocator="tcmalloc")
    user = {"LD_PRELOAD": "/home/me/libtrace.so /opt/jemalloc/libjemalloc.so", "KMP_BLOCKTIME": "200",
            "MALLOC_CONF": "x", "MALLOC_TOP_PAD_": "1", "GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1:glibc.cpu.x=1"}
    trial = launch.plan(["x"], params, machine, user, keep_user_env=False)
    assert trial.env == {"LD_PRELOAD": f"{IOMP5}:{TCMALLOC}", "KMP_BLOCKTIME": "1", "GLIBC_TUNABLES": "glibc.cpu.x=1",
                         **spaces.threads.environment(params, facts)}  # MALLOC_CONF is autotune's: removed; and
    # glibc's heap tuning: a trial's defaults run glibc as it comes
    run = launch.plan(["x"], params, machine, user, keep_user_env=True)
    assert run.env["LD_PRELOAD"] == f"{IOMP5}:{TCMALLOC}:/home/me/libtrace.so:/opt/jemalloc/libjemalloc.so"
    assert run.env["KMP_BLOCKTIME"] == "200" and run.env["MALLOC_CONF"] == "x" and run.env["MALLOC_TOP_PAD_"] == "1"
    kept, clash = sorted(run.warnings)
    assert kept == "KMP_BLOCKTIME is set to '200' in your environment, kept (the recipe says '1')"
    assert clash.startswith(
        f"LD_PRELOAD: your allocator /opt/jemalloc/libjemalloc.so is kept after the recipe's {TCMALLOC}"
    )
    again = launch.plan(["x"], params, machine, {"LD_PRELOAD": IOMP5}, keep_user_env=True)
    assert again.env["LD_PRELOAD"] == f"{IOMP5}:{TCMALLOC}" and again.warnings == ()


def _choices(facts, key):
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    values = set()
    for _ in range(60):
        trial = study.ask()
        values.add(spaces.suggest(trial, facts, spaces.SpaceContext())[key])
        study.tell(trial, 0.0)
    return values


def test_libraries_are_offered_only_where_found(facts) -> None:
    full = _two_sockets(facts)
    assert _choices(full, "openmp") == {"gnu", "intel"} and _choices(full, "kmp_blocktime") == {None, 0, 1, 200}
    assert _choices(full, "allocator") == {"default", "jemalloc", "tcmalloc"}  # facts from before the C library's
    assert _choices(_two_sockets(facts, glibc=True), "allocator") == {"default", "glibc-kept", "jemalloc", "tcmalloc"}
    bare = _two_sockets(facts, iomp5_path=None, tcmalloc_path=None)
    assert _choices(bare, "openmp") == {"gnu"} and _choices(bare, "allocator") == {"default", "jemalloc"}
    no_openmp = _two_sockets(facts, openmp=None)  # torch's parallel backend is not OpenMP: libiomp5 serves nothing
    assert _choices(no_openmp, "openmp") == {"gnu"}
    recorded = replace(full, runtime=None)
    study = optuna.create_study()
    trial = study.ask()
    assert spaces.preload.space(trial, recorded, spaces.SpaceContext()) == spaces.preload.defaults(recorded, None)
    assert trial.params == {}  # nothing to choose: nothing in the study's space


@pytest.mark.parametrize(
    ("runtime", "expected"),
    [
        ({}, {"openmp": "intel", "kmp_blocktime": 1, "allocator": "tcmalloc"}),  # run_cpu: TCMalloc first
        ({"tcmalloc_path": None}, {"openmp": "intel", "kmp_blocktime": 1, "allocator": "jemalloc"}),
        ({"iomp5_path": None, "tcmalloc_path": None, "jemalloc_path": None},
         {"openmp": "gnu", "kmp_blocktime": None, "allocator": "default"}),
    ],
)
def test_heuristic_is_run_cpus_choice(facts, runtime, expected) -> None:
    machine = _two_sockets(facts, **runtime)
    assert spaces.preload.heuristic(machine, spaces.SpaceContext()) == expected
    assert spaces.preload.defaults(machine, spaces.SpaceContext()) == {"openmp": "gnu", "kmp_blocktime": None,
                                                                      "allocator": "default"}
    assert {"LD_PRELOAD", "KMP_BLOCKTIME", "KMP_AFFINITY", "MALLOC_CONF"} <= set(spaces.controlled_variables())


# ---- Real processes on this machine -------------------------------------------------------------------

def _need(facts, *paths: str) -> None:
    absent = [p for p in paths if not getattr(facts.runtime, p)]
    if absent:
        conftest.missing(f"not installed here: {', '.join(absent)} (tests/system-deps.sh, pip install intel-openmp)")


def test_trial_runs_on_libiomp5_and_tcmalloc_pinned_and_bound(facts, fast_settings, monkeypatch) -> None:
    _need(facts, "iomp5_path", "tcmalloc_path", "numactl_path")
    monkeypatch.setenv("LD_PRELOAD", facts.runtime.jemalloc_path or "")  # the search's own env must not leak in
    cpus = sorted(c.cpus[0] for c in facts.cpu.allowed.core_list)
    params = _params(facts, openmp="intel", kmp_blocktime=0, allocator="tcmalloc", affinity="compact",
                     threads=len(cpus))
    result = run_trial("tiny", params, facts, fast_settings, timeout_s=120)
    assert result.status == "ok", result.log_tail
    seen = result.in_effect
    assert seen["openmp_library"] == "libiomp5.so" and seen["malloc_library"].startswith("libtcmalloc")
    assert seen["kmp_blocktime"] == 0  # the value libiomp5 itself parsed
    assert seen["jemalloc"] is False and seen["cpus"] == cpus
    assert seen["pinned_threads"] >= len(cpus)  # KMP_AFFINITY bound each OpenMP thread to one CPU
    if spaces.threads.membind_refused(facts.runtime.numactl_path, spaces.memory_nodes(params, facts)) is None:
        nodes = spaces.memory_nodes(params, facts)
        assert seen["memory_policy"] == f"bind:{format_cpulist(nodes)}" and result.warnings == []
    else:
        assert seen["memory_policy"] == "default" and "not permitted" in result.warnings[0]


def test_trial_falls_back_unbound_when_numactl_is_refused(facts, fast_settings, tmp_path) -> None:
    _need(facts, "jemalloc_path")
    refusing = tmp_path / "numactl"  # what numactl does in a container without CAP_SYS_NICE
    refusing.write_text("#!/bin/sh\necho 'set_mempolicy: Operation not permitted' >&2\nexit 1\n")
    refusing.chmod(0o755)
    machine = replace(facts, runtime=replace(facts.runtime, numactl_path=str(refusing)))
    params = _params(facts, allocator="jemalloc", affinity="compact", threads=1)
    result = run_trial("tiny", params, machine, fast_settings, timeout_s=120)
    assert result.status == "ok", result.log_tail
    assert result.in_effect["memory_policy"] == "default"
    assert len(result.warnings) == 1 and "Operation not permitted" in result.warnings[0]
    assert result.in_effect["malloc_library"] == "libjemalloc.so.2"
    assert result.in_effect["openmp_library"] == "libgomp.so.1"
    assert result.in_effect["env"]["MALLOC_CONF"] == spaces.preload.JEMALLOC_CONF
    assert "KMP_AFFINITY" not in result.in_effect["env"] and result.in_effect["kmp_blocktime"] is None


FACTS_SCRIPT = """
import json, os, warnings, torch, autotune
from autotune.probes import memory_policy, process_cpus
from autotune.search_spaces import preload
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for key, value in json.loads({overrides!r}).items():  # set after Python started: too late to count
        os.environ[key] = value
    autotune.apply({source})
torch.ones(256, 256) @ torch.ones(256, 256)
maps = open("/proc/self/maps").read()
print(json.dumps({{**preload.in_effect(), "cpus": process_cpus(), "policy": memory_policy(),
                  "libz": "libz.so" in maps, "preload": os.environ.get("LD_PRELOAD"),
                  "warnings": [str(w.message) for w in caught]}}))
"""


def _child(cwd: Path, prefix: list[str], source: str = "", overrides: dict | None = None,
           env: dict | None = None) -> dict:
    import os

    code = FACTS_SCRIPT.format(source=source, overrides=json.dumps(overrides or {}))
    out = subprocess.run([*prefix, sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120,
                         env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _recipe_file(tmp_path: Path, **params) -> Path:
    path = tmp_path / "r.json"
    from autotune import probes

    path.write_text(json.dumps({"params": {"threads": 2, "interop_threads": 1, "batch_size": 8, **params},
                                "workload": "tiny", "fingerprint": probes.probe().fingerprint}))
    return path


def test_autotune_run_puts_every_knob_in_effect(facts, tmp_path) -> None:
    _need(facts, "iomp5_path", "jemalloc_path")
    libz = ctypes.util.find_library("z")
    recipe = _recipe_file(tmp_path, **INTEL, allocator="jemalloc", affinity="compact")
    run = [sys.executable, "-m", "autotune", "run", "--recipe", str(recipe), "--"]
    seen = _child(tmp_path, run, env={"LD_PRELOAD": libz or ""})  # the user's own preload is kept
    params = json.loads(recipe.read_text())["params"]
    assert seen["openmp_library"] == "libiomp5.so" and seen["malloc_library"] == "libjemalloc.so.2"
    assert seen["kmp_blocktime"] == 1 and seen["cpus"] == spaces.cpus_for(params, facts)
    assert seen["preload"].split(":")[:2] == [facts.runtime.iomp5_path, facts.runtime.jemalloc_path]
    assert seen["libz"] is bool(libz)
    nodes = spaces.memory_nodes(params, facts)
    if facts.runtime.numactl_path and nodes:
        bound = spaces.threads.membind_refused(facts.runtime.numactl_path, nodes) is None
        assert (seen["policy"] == f"bind:{format_cpulist(nodes)}") is bound
    assert seen["warnings"] == []


def test_exported_env_file_then_apply_in_a_fresh_process(facts, tmp_path) -> None:
    _need(facts, "iomp5_path", "tcmalloc_path")
    recipe = _recipe_file(tmp_path, openmp="intel", kmp_blocktime=200, allocator="tcmalloc", affinity="none")
    params = json.loads(recipe.read_text())["params"]  # what `autotune export --format env` writes on this machine:
    text = to_env(load_recipe_file(recipe), spaces.environment(params, facts), spaces.cpus_for(params, facts),
                  spaces.memory_nodes(params, facts))
    (tmp_path / "best.env").write_text(text)
    libz = ctypes.util.find_library("z") or ""
    bash = ["bash", "-c", 'set -a; . ./best.env; set +a; exec "$@"', "bash"]
    seen = _child(tmp_path, bash, source="'best.env'", env={"LD_PRELOAD": libz})
    assert seen["openmp_library"] == "libiomp5.so" and seen["malloc_library"].startswith("libtcmalloc")
    assert seen["kmp_blocktime"] == 200 and seen["libz"] is bool(libz)
    assert seen["warnings"] == []


def test_jemallocs_conf_of_an_env_file_exported_before_is_told_to_be_exported_again(facts, monkeypatch) -> None:
    _need(facts, "jemalloc_path")
    params = _params(facts, allocator="jemalloc", threads=2)
    monkeypatch.setenv("MALLOC_CONF", "oversize_threshold:1,background_thread:true,metadata_thp:auto")  # before
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # the user's own
    told = spaces.check_environment(params, facts)
    assert f"MALLOC_CONF={spaces.preload.JEMALLOC_CONF} (is 'oversize_threshold:1,background_thread:true," \
           "metadata_thp:auto')" in told
    assert [p for p in told if "export the env file again" in p] == [
        "MALLOC_CONF is what an earlier autotune exported (jemalloc's purging on): export the env file again "
        "(autotune export --format env)"]
    monkeypatch.setenv("MALLOC_CONF", "narenas:1")  # the user's own: not autotune's, no such advice
    assert not [p for p in spaces.check_environment(params, facts) if "export the env file again" in p]
    monkeypatch.setenv("MALLOC_CONF", spaces.preload.JEMALLOC_CONF)
    assert not [p for p in spaces.check_environment(params, facts) if p.startswith("MALLOC_CONF")]


def test_glibc_kept_is_glibcs_malloc_with_the_workers_thresholds(facts) -> None:
    """What ``allocator=glibc-kept`` sets and accepts from a file, and that glibc's malloc is what serves it."""
    params = _params(facts, allocator="glibc-kept")
    env = spaces.environment(params, facts)
    assert {k: env[k] for k in spaces.preload.HEAP_THRESHOLDS} == {"MALLOC_MMAP_THRESHOLD_": "33554432",
                                                                   "MALLOC_TRIM_THRESHOLD_": "268435456"}
    assert "LD_PRELOAD" not in env and "MALLOC_CONF" not in env
    forms = spaces.env_forms(params)
    assert forms["MALLOC_TRIM_THRESHOLD_"].fullmatch("268435456")
    assert not forms["MALLOC_TRIM_THRESHOLD_"].fullmatch("0") and "MALLOC_TRIM_THRESHOLD_" not in spaces.env_forms(
        _params(facts, allocator="default"))
    assert spaces.not_in_effect(params, {"malloc_library": "libc.so.6"}) == []
    assert spaces.not_in_effect(params, {"malloc_library": "libtcmalloc.so.4"}) == [
        "allocator=glibc-kept is not in effect: libtcmalloc.so.4 serves malloc"]


# Whether a 16 MiB malloc is mmapped (glibc's chunk flag IS_MMAPPED, bit 2 of the size word before the pointer):
# glibc as it comes maps it and unmaps it on free; with the thresholds of glibc-kept it comes from the heap.
HEAP_SCRIPT = """
import ctypes, json, os, sys, warnings, torch, autotune
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    if sys.argv[1:] or os.environ.get("AUTOTUNE_RECIPE"):
        autotune.apply(sys.argv[1] if sys.argv[1:] else None)
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
block = libc.malloc(16 << 20)
print(json.dumps({"mmapped": bool(ctypes.c_size_t.from_address(block - 8).value & 2),
                  "env": os.environ.get("MALLOC_TRIM_THRESHOLD_"), "warnings": [str(w.message) for w in caught]}))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_glibc_kept_keeps_the_heap_under_autotune_run_and_by_apply_alone(facts, tmp_path) -> None:
    """Under ``autotune run`` the variables fix the thresholds from the process's start; ``apply()`` in a plain run
    fixes them by ``mallopt`` and says the variables are missing; a plain process without a recipe maps the block."""
    recipe = _recipe_file(tmp_path, allocator="glibc-kept", affinity="none")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "AUTOTUNE_RECIPE"}

    def child(*cmd: str) -> dict:
        out = subprocess.run([*cmd], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=clean)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    under_run = child(sys.executable, "-m", "autotune", "run", "--recipe", str(recipe), "--", sys.executable, "-c",
                      HEAP_SCRIPT)
    assert under_run == {"mmapped": False, "env": "268435456", "warnings": []}
    by_apply = child(sys.executable, "-c", HEAP_SCRIPT, str(recipe))
    assert not by_apply["mmapped"] and by_apply["env"] is None
    assert any("MALLOC_TRIM_THRESHOLD_=268435456 (is None)" in w for w in by_apply["warnings"])
    assert child(sys.executable, "-c", HEAP_SCRIPT)["mmapped"] is True  # the same process without the recipe
    clean["MALLOC_MMAP_THRESHOLD_"] = str(1 << 20)  # the user's own, kept by autotune run: apply() leaves it
    assert child(sys.executable, "-m", "autotune", "run", "--recipe", str(recipe), "--", sys.executable, "-c",
                 HEAP_SCRIPT)["mmapped"] is True


def test_apply_warns_when_libraries_are_not_mapped_even_if_the_variables_say_so(facts, tmp_path) -> None:
    _need(facts, "iomp5_path", "jemalloc_path")
    recipe = _recipe_file(tmp_path, **INTEL, allocator="jemalloc", affinity="none")
    env = {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "LD_PRELOAD": "",
           "MALLOC_CONF": spaces.preload.JEMALLOC_CONF}
    late = {"LD_PRELOAD": f"{facts.runtime.iomp5_path}:{facts.runtime.jemalloc_path}", "KMP_BLOCKTIME": "0"}
    seen = _child(tmp_path, [], source=f"{str(recipe)!r}", overrides=late, env=env)
    assert seen["openmp_library"] == "libgomp.so.1" and seen["malloc_library"] == "libc.so.6"
    (warning,) = seen["warnings"]
    assert "openmp=intel, but libgomp.so.1 serves GOMP_parallel" in warning
    assert f"LD_PRELOAD={facts.runtime.iomp5_path}" in warning
    assert f"LD_PRELOAD={facts.runtime.jemalloc_path}" in warning
    assert "KMP_BLOCKTIME=1 (is '0')" in warning and "autotune run --recipe" in warning
    assert "OMP_NUM_THREADS" not in warning and "MALLOC_CONF" not in warning  # those are right
