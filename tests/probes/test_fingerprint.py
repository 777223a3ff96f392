"""The hardware fingerprint describes the machine and its cgroup cpuset, never the process's CPU affinity."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace

import pytest

from autotune import probes
from autotune.probes import AllowedCpus, _cpu, _hwloc, _isa
from autotune.probes._fingerprint import fingerprint

from _probe_shared import SYSFS
from fakes.machines import two_sockets

XML_ONLY = "32em64t-2n8c+dax+nvme+mic+dimms"  # a recorded machine given as hwloc XML: 2 NUMA nodes, 16 CPUs


def _print(facts, cpu=None) -> str:
    return fingerprint(cpu or facts.cpu, facts.gpus, facts.runtime)


def test_the_fake_two_socket_machine_narrowed_to_one_core_keeps_its_fingerprint(facts) -> None:
    machine = two_sockets(facts)
    first = machine.cpu.allowed.core_list[0]  # package 0, node 0, CPUs 0 and 8
    pinned = AllowedCpus(cpus="0", packages=1, cores=1, threads=1, numa_nodes=(0,),
                         core_list=(replace(first, cpus=(0,)),))
    assert _print(machine, replace(machine.cpu, allowed=pinned)) == _print(machine)

    # the cgroup cpuset is what the user was given: another one is another machine for the fingerprint
    socket0 = tuple(c for c in machine.cpu.allowed.core_list if c.package == 0)
    cgroup = AllowedCpus(cpus="0-3,8-11", packages=1, cores=4, threads=8, numa_nodes=(0,), core_list=socket0)
    assert _print(machine, replace(machine.cpu, cgroup=cgroup)) != _print(machine)
    # a cgroup that leaves out the SMT siblings (CPUs 8-15)
    first_threads = tuple(replace(c, cpus=c.cpus[:1]) for c in machine.cpu.allowed.core_list)
    no_smt = replace(machine.cpu.allowed, cpus="0-7", threads=8, core_list=first_threads)
    assert _print(machine, replace(machine.cpu, cgroup=no_smt)) != _print(machine)


def test_affinity_narrows_the_allowed_view_of_a_recorded_tree_but_not_its_fingerprint() -> None:
    path = SYSFS / f"{XML_ONLY}.xml"
    if not path.is_file():
        pytest.skip(f"recorded topology {path} not found")
    tree = _hwloc.parse_xml(path.read_text())
    whole = _cpu.from_tree(tree, None)
    pinned = _cpu.from_tree(tree, None, affinity=frozenset({min(tree.allowed_cpus)}))
    assert (pinned.allowed.threads, whole.allowed.threads) == (1, 16)  # "allowed" stays the process's view
    assert pinned.cgroup == whole.cgroup == whole.allowed  # the cgroup's view ignores the affinity
    assert fingerprint(pinned, (), None) == fingerprint(whole, (), None)


def test_without_cpuinfo_the_family_and_model_come_from_hwloc() -> None:
    path = SYSFS / f"{XML_ONLY}.xml"
    if not path.is_file():
        pytest.skip(f"recorded topology {path} not found")
    text = path.read_text()
    assert _cpu.from_tree(_hwloc.parse_xml(text), None).family_model is None  # this XML names the model only
    model = '<info name="CPUModel" value="Intel(R) Xeon(R) CPU E5-2680 0 @ 2.70GHz"/>'
    numbers = model + '<info name="CPUFamilyNumber" value="6"/><info name="CPUModelNumber" value="45"/>'
    assert text.count(model) == 2  # one per package, as lstopo writes them on x86
    assert _cpu.from_tree(_hwloc.parse_xml(text.replace(model, numbers)), None).family_model == "family 6 model 45"


@pytest.mark.skipif(not shutil.which("taskset") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs taskset and two CPUs to start a process pinned to fewer CPUs")
def test_a_process_pinned_with_taskset_has_its_machines_fingerprint() -> None:
    code = ("from autotune import probes; f = probes.probe(runtime=False, gpus=False); "
            "print(f.fingerprint, f.cpu.allowed.cpus, f.cpu.cgroup.cpus)")
    cpu = str(min(os.sched_getaffinity(0)))
    free, pinned = (subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True,
                                   check=True).stdout.split() for prefix in ((), ("taskset", "-c", cpu)))
    assert pinned[1] == cpu and free[1] != cpu  # the allowed view follows the affinity...
    assert pinned[0] == free[0] and pinned[2] == free[2]  # ...the fingerprint and the cgroup's view do not


def test_the_fingerprint_scheme_is_marked_and_older_ones_are_named(facts) -> None:
    assert facts.fingerprint.startswith(f"v{probes.FINGERPRINT_VERSION}-") and probes.FINGERPRINT_VERSION == 3
    assert probes.fingerprint_version(facts.fingerprint) == 3
    assert probes.outdated_fingerprint(facts.fingerprint) is None
    digits = facts.fingerprint.removeprefix("v3-")
    v2 = probes.outdated_fingerprint(f"v2-{digits}")
    assert v2 is not None and "fingerprint v2" in v2 and "family and model" in v2 and "cgroup" not in v2
    v1 = probes.outdated_fingerprint(digits)  # as autotune wrote it before the prefix: both changes since
    assert v1 is not None and "fingerprint v1" in v1 and "cgroup cpuset" in v1 and "family and model" in v1


# Two 2-vCPU VMs this project ran on, as their /proc/cpuinfo began (one processor of each, flags abridged to
# the probe's): the same name, vendor and ISA flags, a Zen 5 and a Zen 4 whose bf16 matmuls ran 941 and
# 433 GFLOP/s.
_VM_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: {family}
model\t\t: {model}
model name\t: AMD EPYC
stepping\t: {stepping}
flags\t\t: fpu lm avx2 avx512f avx512_bf16 avx512_vnni
"""


def test_cpu_generations_a_vm_names_alike_have_different_fingerprints(facts) -> None:
    zen5, zen4, zen4_other_host = (_isa.parse_cpuinfo(_VM_CPUINFO.format(family=f, model=m, stepping=s))
                                   for f, m, s in (("26", "2", "0"), ("25", "17", "1"), ("25", "17", "2")))
    assert zen5.model == zen4.model == "AMD EPYC" and zen5.isa == zen4.isa
    assert (zen5.family_model, zen4.family_model) == ("family 26 model 2", "family 25 model 17")

    def on(info: _isa.CpuInfo) -> str:
        return _print(facts, replace(facts.cpu, model=info.model, vendor=info.vendor, isa=info.isa,
                                     family_model=info.family_model))
    assert on(zen5) != on(zen4)
    assert on(zen4) == on(zen4_other_host)  # the stepping is not hashed: hosts of one machine type differ in it
    assert on(replace(zen4, family_model=None)) not in (on(zen4), on(zen5))  # unknown is not either of them


def test_facts_carry_the_cgroup_view_and_family_and_still_read_schemas_1_and_3(facts) -> None:
    doc = facts.to_dict()
    assert doc["schema_version"] == probes.SCHEMA_VERSION == 4
    assert doc["cpu"]["cgroup"]["cpus"] and probes.Facts.from_json(facts.to_json()) == facts
    del doc["cpu"]["family_model"]
    assert probes.Facts.from_dict({**doc, "schema_version": 3}).cpu.family_model is None
    del doc["cpu"]["cgroup"]
    old = probes.Facts.from_dict(json.loads(json.dumps({**doc, "schema_version": 1})))
    assert (old.schema_version, old.cpu.cgroup, old.cpu.allowed) == (1, None, facts.cpu.allowed)
