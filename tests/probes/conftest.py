"""Fixtures for the probe tests: the recorded machines of ``../shared/topologies`` and the fake NVML."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune import probes
from autotune.probes import _nvml

from _probe_shared import MACHINES, NVIDIA_SMI, SAFE_EXTRACT, SYSFS, TOPOLOGIES
from fakes.nvml import FakePynvml, load_machine


def unpack(archive: Path, dest: Path) -> None:
    """Unpack with the system's tar (10x faster than tarfile on these trees of small files)."""
    if shutil.which("tar"):
        subprocess.run(["tar", "-xf", str(archive), "-C", str(dest)], check=True)
    else:
        with tarfile.open(archive) as tar:
            tar.extractall(dest, **SAFE_EXTRACT)


def _require_shared() -> None:
    if not SYSFS.is_dir():
        pytest.skip(f"recorded topologies not found at {SYSFS.resolve()} (the shared/ checkout beside the repo)")


@pytest.fixture(scope="session")
def ground_truth() -> dict:
    _require_shared()
    return json.loads((TOPOLOGIES / "ground_truth.json").read_text())


@pytest.fixture(scope="session")
def recorded_roots(tmp_path_factory) -> Iterator[dict[str, Path]]:
    """Every tarball unpacked once; name -> the one directory it unpacks to (which plays ``/``).

    Unpacked in /dev/shm where there is one: the trees are ~40,000 small files, 20x faster on tmpfs.
    """
    _require_shared()
    shm = Path("/dev/shm")
    in_memory = shm.is_dir() and os.access(shm, os.W_OK)
    base = Path(tempfile.mkdtemp(prefix="autotune-probes-", dir=shm)) if in_memory else tmp_path_factory.mktemp("trees")
    roots = {}
    for name in MACHINES:
        dest = base / name
        dest.mkdir()
        unpack(SYSFS / f"{name}.tar.bz2", dest)
        (inner,) = [p for p in dest.iterdir() if p.is_dir()]
        roots[name] = inner
    yield roots
    if in_memory:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def recorded_facts(recorded_roots) -> dict[str, probes.Facts]:
    """Each recorded machine probed once (hwloc runs in a subprocess: ~10-100 ms each)."""
    return {name: probes.probe(str(root)) for name, root in recorded_roots.items()}


@pytest.fixture
def fake_nvml(monkeypatch):
    """Install a fake pynvml for one machine of ``nvidia-smi-query``: ``fake_nvml("H100SXMx8")``; CUDA's
    variables are unset (every GPU visible) unless a test sets them."""
    if not NVIDIA_SMI.is_dir():
        pytest.skip(f"nvidia-smi dumps not found at {NVIDIA_SMI.resolve()}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)

    def install(machine: str | FakePynvml) -> FakePynvml:
        fake = load_machine(NVIDIA_SMI, machine) if isinstance(machine, str) else machine
        monkeypatch.setattr(_nvml, "load_library", lambda: fake)
        return fake

    return install
