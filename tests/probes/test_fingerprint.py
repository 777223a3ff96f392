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
from autotune.probes import Allowed, _cpu, _hwloc
from autotune.probes._fingerprint import fingerprint

from _probe_shared import SYSFS
from fakes.machines import two_sockets

XML_ONLY = "32em64t-2n8c+dax+nvme+mic+dimms"  # a recorded machine given as hwloc XML: 2 NUMA nodes, 16 CPUs


def _print(facts, cpu=None) -> str:
    return fingerprint(cpu or facts.cpu, facts.gpus, facts.runtime)


def test_the_fake_two_socket_machine_narrowed_to_one_core_keeps_its_fingerprint(facts) -> None:
    machine = two_sockets(facts)
    first = machine.cpu.allowed.core_list[0]  # package 0, node 0, CPUs 0 and 8
    pinned = Allowed(cpus="0", packages=1, cores=1, threads=1, numa_nodes=(0,), core_list=(replace(first, cpus=(0,)),))
    assert _print(machine, replace(machine.cpu, allowed=pinned)) == _print(machine)

    # the cgroup cpuset is what the user was given: another one is another machine for the fingerprint
    socket0 = tuple(c for c in machine.cpu.allowed.core_list if c.package == 0)
    cgroup = Allowed(cpus="0-3,8-11", packages=1, cores=4, threads=8, numa_nodes=(0,), core_list=socket0)
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
    assert facts.fingerprint.startswith(f"v{probes.FINGERPRINT_VERSION}-") and probes.FINGERPRINT_VERSION == 2
    assert probes.fingerprint_version(facts.fingerprint) == 2
    assert probes.outdated_fingerprint(facts.fingerprint) is None
    old = probes.outdated_fingerprint(facts.fingerprint.removeprefix("v2-"))  # as autotune wrote it before
    assert old is not None and "fingerprint v1" in old and "cgroup cpuset" in old


def test_facts_carry_the_cgroup_view_and_still_read_schema_1(facts) -> None:
    doc = facts.to_dict()
    assert doc["schema_version"] == probes.SCHEMA_VERSION == 3
    assert doc["cpu"]["cgroup"]["cpus"] and probes.Facts.from_json(facts.to_json()) == facts
    del doc["cpu"]["cgroup"]
    old = probes.Facts.from_dict(json.loads(json.dumps({**doc, "schema_version": 1})))
    assert (old.schema_version, old.cpu.cgroup, old.cpu.allowed) == (1, None, facts.cpu.allowed)
