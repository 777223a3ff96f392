"""The probe on the 12 recorded machines of ``shared/topologies`` against hwloc's expected numbers."""
from __future__ import annotations

import pytest

from autotune import probes
from autotune.errors import ProbeError
from autotune.probes import _cpu, _hwloc, format_cpulist, parse_cpulist

from _probe_shared import MACHINES, SYSFS

CPUSET = "16amd64-8n2c-cpusets"  # the process runs in cpuset /dummy: ground truth is the allowed view
GPU_NUMA = "nvidiagpunumanodes"  # hwloc's default hides the 6 GPU-memory nodes; the probe keeps them
XML_ONLY = "32em64t-2n8c+dax+nvme+mic+dimms"  # expected output is an hwloc XML, not a .console


def _expected(ground_truth: dict, name: str) -> dict:
    return ground_truth[f"hwloc-linux/{name}"]["ground_truth_hwloc_expected"]


@pytest.mark.parametrize("name", MACHINES)
def test_counts_match_ground_truth(name, recorded_facts, ground_truth):
    want = _expected(ground_truth, name)
    cpu = recorded_facts[name].cpu
    view = cpu.allowed if name == CPUSET else cpu
    assert (view.packages, view.cores, view.threads) == (want["packages"], want["cores"], want["pus"])
    assert cpu.dies == want["dies"]
    assert list(cpu.threads_per_core) == want["smt_threads_per_core"]
    assert (cpu.source, cpu.partial) == ("hwloc", False)


@pytest.mark.parametrize("name", MACHINES)
def test_numa_nodes_and_their_cpus_match_ground_truth(name, recorded_facts, ground_truth):
    want = _expected(ground_truth, name)
    cpu = recorded_facts[name].cpu
    if name == CPUSET:
        allowed = parse_cpulist(cpu.allowed.cpus)
        got = {n.id: format_cpulist(parse_cpulist(n.cpus) & allowed)
               for n in cpu.numa_nodes if n.id in cpu.allowed.numa_nodes}
    else:
        got = {n.id: n.cpus for n in cpu.numa_nodes if not (name == GPU_NUMA and n.kind == "GPUMemory")}
    assert got == {int(i): cpus for i, cpus in want["numa_cpus"].items()}
    assert len(got) == want["numa_nodes"]


def test_gpu_memory_numa_nodes_are_reported_cpu_less(recorded_facts):
    nodes = recorded_facts[GPU_NUMA].cpu.numa_nodes
    gpu_nodes = [n for n in nodes if n.kind == "GPUMemory"]
    assert [n.id for n in gpu_nodes] == [250, 251, 252, 253, 254, 255]
    assert {(n.cpus, n.memory_bytes) for n in gpu_nodes} == {("", 16106127360)}
    assert [n.kind for n in nodes if n.id in (0, 8)] == [None, None]


@pytest.mark.parametrize("name", [m for m in MACHINES if m != CPUSET])
def test_allowed_view_is_the_whole_machine_without_cpuset(name, recorded_facts):
    cpu = recorded_facts[name].cpu
    a = cpu.allowed
    online = set().union(*(parse_cpulist(n.cpus) for n in cpu.numa_nodes))
    assert a.cpus == format_cpulist(online)
    assert (a.packages, a.cores, a.threads) == (cpu.packages, cpu.cores, cpu.threads)
    assert a.numa_nodes == tuple(n.id for n in cpu.numa_nodes)


@pytest.mark.parametrize("name", MACHINES)
def test_core_list_partitions_the_allowed_cpus(name, recorded_facts):
    cpu = recorded_facts[name].cpu
    cores = cpu.allowed.core_list
    cpus = [c for core in cores for c in core.cpus]
    assert sorted(cpus) == sorted(parse_cpulist(cpu.allowed.cpus))
    assert len(cpus) == len(set(cpus)) == cpu.allowed.threads
    assert len(cores) == cpu.allowed.cores
    assert {core.package for core in cores} <= set(range(cpu.packages))
    node_cpus = {n.id: parse_cpulist(n.cpus) for n in cpu.numa_nodes}
    for core in cores:
        assert set(core.cpus) <= node_cpus[core.numa_node], core


def test_cpuset_machine_whole_system_and_allowed_views(recorded_facts):
    cpu = recorded_facts[CPUSET].cpu
    # README: raw sysfs shows 8 packages / 8 nodes and CPU 4 offline (15 online)
    assert (cpu.packages, cpu.cores, cpu.threads, len(cpu.numa_nodes)) == (8, 15, 15, 8)
    assert cpu.offline_cpus == "4"
    assert cpu.allowed.cpus == "0-3,5-6,12-15"
    assert cpu.allowed.numa_nodes == (1, 2, 3, 4)
    # CPUs 0-1 may run here although their node 0's memory is not allowed: their locality stays node 0
    assert [(c.package, c.numa_node, c.cpus) for c in cpu.allowed.core_list[:3]] == [(0, 0, (0,)), (0, 0, (1,)),
                                                                                    (1, 1, (2,))]


@pytest.mark.parametrize(("name", "field", "value"), [
    ("256ppc-8n8s4t", "packages", 64),  # physical_package_id is -1: hwloc uses the device tree
    ("48amd64-4pa2n6c-sparse", "cores", 48),  # core ids repeat across dies
    ("16em64t-4s2c2t-offlines", "offline_cpus", "2,5,13-14"),
    ("16em64t-4s2c2t-offlines", "threads_per_core", (1, 2)),  # cores that lost their HT sibling
    # node0 has cpumap only; its memory is node0/meminfo MemTotal
    ("16em64t-4s2c2t", "numa_nodes", (probes.NumaNode(0, "0-15", 16772456 * 1024),)),
    ("20em64t-hybrid-1p6c2t+2ca4co1t", "core_kinds", ("kind0@3900MHz", "kind1@5000MHz")),
    ("128arm-2pa2n8cluster4co", "arch", "aarch64"),
    ("nvidiagpunumanodes", "arch", "ppc64le"),
])
def test_traps(name, field, value, recorded_facts):
    assert getattr(recorded_facts[name].cpu, field) == value


def test_hybrid_cores_have_their_kind(recorded_facts):
    cores = recorded_facts["20em64t-hybrid-1p6c2t+2ca4co1t"].cpu.allowed.core_list
    kinds = [(core.kind, len(core.cpus)) for core in cores]
    assert kinds == [("kind1@5000MHz", 2)] * 6 + [("kind0@3900MHz", 1)] * 8


@pytest.mark.parametrize(("name", "model", "vendor", "isa", "family_model"), [
    ("memorysidecaches", "Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz", "GenuineIntel",
     ("avx2", "avx512f", "avx512_vnni"), "family 6 model 85"),
    ("20em64t-hybrid-1p6c2t+2ca4co1t", "13th Gen Intel(R) Core(TM) i7-1370P", "GenuineIntel", ("avx2",),
     "family 6 model 186"),
    ("8em64t-2s2ca2c", "Intel(R) Xeon(R) CPU E5345 @ 2.33GHz", "GenuineIntel", (), "family 6 model 15"),
    ("16amd64-8n2c", "Dual Core AMD Opteron(tm) Processor 865", "AuthenticAMD", (), "family 15 model 33"),
    ("128arm-2pa2n8cluster4co", "Kunpeng-920", "HiSilicon", (), None),  # its name holds implementer and part
    ("nvidiagpunumanodes", "POWER9, altivec supported", None, (), None),
])
def test_model_vendor_isa_and_family_from_the_recorded_cpuinfo(name, model, vendor, isa, family_model,
                                                               recorded_facts):
    cpu = recorded_facts[name].cpu
    assert (cpu.model, cpu.vendor, cpu.isa, cpu.family_model) == (model, vendor, isa, family_model)


@pytest.mark.parametrize(("name", "total", "available"), [
    ("memorysidecaches", 1558982816 * 1024, 1552836908 * 1024),
    ("8em64t-2s2ca2c", 16468292 * 1024, None),  # kernel older than MemAvailable
    ("16amd64-8n2c", 8587984896 + 7 * 8589934592, None),  # no meminfo: the NUMA nodes' sum
])
def test_memory_from_the_recorded_tree(name, total, available, recorded_facts):
    memory = recorded_facts[name].memory
    assert (memory.total_bytes, memory.available_bytes) == (total, available)


@pytest.mark.parametrize("name", MACHINES)
def test_live_only_facts_are_not_probed(name, recorded_facts, recorded_roots):
    facts = recorded_facts[name]
    assert (facts.runtime, facts.gpus) == (None, ())
    assert facts.root == str(recorded_roots[name].resolve())
    text = probes.summary(facts)
    assert "Runtime      not probed (recorded tree)" in text
    assert "GPUs         not probed (recorded tree)" in text


def test_recorded_machines_have_distinct_fingerprints(recorded_facts):
    prints = [f.fingerprint for f in recorded_facts.values()]
    assert len(set(prints)) == len(prints) == 12
    assert all(p.startswith("v3-") and len(p) == 15 and int(p[3:], 16) >= 0 for p in prints)


def test_xml_only_machine_matches_hwloc_xml(recorded_facts):
    """This machine's expected output is hwloc's XML: parsed by the probe, it must give the tarball's numbers."""
    xml_cpu = _cpu.from_tree(_hwloc.parse_xml((SYSFS / f"{XML_ONLY}.xml").read_text()), None)
    cpu = recorded_facts[XML_ONLY].cpu
    fields = ("packages", "dies", "cores", "threads", "threads_per_core", "numa_nodes", "offline_cpus")
    assert {f: getattr(xml_cpu, f) for f in fields} == {f: getattr(cpu, f) for f in fields}
    assert xml_cpu.allowed == cpu.allowed
    assert cpu.numa_nodes == (probes.NumaNode(0, "0-7", 17149054976), probes.NumaNode(1, "8-15", 17179869184))


@pytest.mark.parametrize(("make", "message"), [
    (lambda tmp: tmp / "missing", "no such directory"),
    (lambda tmp: (tmp / "tree.tar.gz").touch() or tmp / "tree.tar.gz", "is a file: unpack it first"),
    (lambda tmp: tmp, "is not a recorded tree: it has no sys/devices/system/cpu"),
])
def test_bad_root_is_one_probe_error(tmp_path, make, message):
    with pytest.raises(ProbeError, match=message):
        probes.probe(str(make(tmp_path)))


def test_parent_of_a_recorded_tree_gets_a_hint(recorded_roots):
    root = recorded_roots["16amd64-8n2c"]
    with pytest.raises(ProbeError, match=f"did you mean --root {root}"):
        probes.probe(str(root.parent))
