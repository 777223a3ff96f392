"""``autotune probe``: text, JSON, --root, and --record read back with --root."""
from __future__ import annotations

import argparse
import json
import os
import tarfile

import pytest

from autotune import probes
from autotune.cli import probe as probe_cli
from autotune.errors import ProbeError
from autotune.probes import parse_cpulist

from _probe_shared import SAFE_EXTRACT


def run(capsys, *argv: str) -> str:
    parser = argparse.ArgumentParser(prog="autotune")
    probe_cli.register(parser.add_subparsers(dest="verb"))
    args = parser.parse_args(["probe", *argv])
    assert args.func(args) == 0
    return capsys.readouterr().out


def test_text_summary(capsys):
    out = run(capsys, "--no-runtime", "--no-gpus")
    assert out.startswith("Machine      this machine\n")
    assert "Runtime      not probed (runtime=False)" in out
    assert f"Fingerprint  {probes.probe(runtime=False, gpus=False).fingerprint}" in out


def test_json_document(capsys, recorded_roots):
    doc = json.loads(run(capsys, "--json", "--root", str(recorded_roots["nvidiagpunumanodes"])))
    assert list(doc) == ["schema_version", "cpu", "memory", "runtime", "gpus", "fingerprint", "root", "cuda"]
    assert doc["schema_version"] == probes.SCHEMA_VERSION
    cpu = doc["cpu"]
    assert (cpu["model"], cpu["packages"], cpu["cores"], cpu["threads"]) == ("POWER9, altivec supported", 2, 8, 32)
    assert cpu["numa_nodes"][1] == {"id": 8, "cpus": "88-103", "memory_bytes": 137166848000, "kind": None}
    assert set(cpu["allowed"]) >= {"cpus", "packages", "cores", "threads", "numa_nodes"}
    assert (doc["runtime"], doc["gpus"]) == (None, [])


def test_bad_root_is_one_line(capsys, tmp_path):
    from autotune.cli import main

    assert main(["probe", "--root", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("autotune probe: error: --root ") and "no such directory" in err


def test_record_bad_name():
    with pytest.raises(ProbeError, match="must end with .tar.gz"):
        probes.record("/tmp/host.zip")


def test_recording_reads_back_as_this_machine(capsys, tmp_path):
    archive = tmp_path / "thishost.tar.gz"
    out = run(capsys, "--record", str(archive))
    assert f"recorded this machine in {archive}" in out
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / "tree", **SAFE_EXTRACT)
    expected = {"thishost/proc/cpuinfo", "thishost/proc/self/cgroup", "thishost/sys/devices/system/cpu/online"}
    assert expected <= set(names)

    live = probes.probe(runtime=False, gpus=False)
    recorded = probes.probe(str(tmp_path / "tree" / "thishost"))
    fields = ("model", "vendor", "arch", "packages", "dies", "cores", "threads", "threads_per_core", "numa_nodes",
              "offline_cpus", "isa")
    assert {f: getattr(recorded.cpu, f) for f in fields} == {f: getattr(live.cpu, f) for f in fields}
    assert recorded.memory.total_bytes == live.memory.total_bytes
    online = set().union(*(parse_cpulist(n.cpus) for n in live.cpu.numa_nodes))
    if os.sched_getaffinity(0) == online:  # no taskset narrowing here: the cgroup cpuset is the whole story
        assert recorded.cpu.allowed == live.cpu.allowed
        assert recorded.fingerprint == live.fingerprint
    else:
        assert set(parse_cpulist(recorded.cpu.allowed.cpus)) >= os.sched_getaffinity(0)
