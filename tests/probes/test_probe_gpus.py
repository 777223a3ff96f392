"""GPUs through the NVML facade, with NVML replaced by fakes parsed from real nvidia-smi dumps."""
from __future__ import annotations

import logging
import sys
import threading
import time

import pytest

from autotune import probes
from autotune.errors import ProbeError
from autotune.probes import _gpu, _nvml

from fakes.nvml import DRIVER_NOT_LOADED, FakePynvml, NVMLError

GIB = 2**30
MIB = 2**20


def _pairs(n: int, label) -> dict[int, dict[str, str]]:
    return {i: {str(j): label(i, j) for j in range(n) if j != i} for i in range(n)}


def _socket(bus: int) -> int:
    return 0 if bus < 0x80 else 1


# (machine, name, compute capability, memory MiB, bus numbers, MIG, links of GPU i -> {peer: label}, p2p)
# Expected values are written out from the dumps (and, for NVLink/NUMA/PCIe, from the fake's documented
# host model in tests/fakes/nvml.py), not computed by the code under test.
MACHINES = [
    ("H100SXMx8", "NVIDIA H100 80GB HBM3", "9.0", 81559, [0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB], False,
     _pairs(8, lambda i, j: "NV18"), True),
    ("A100SXMx4", "NVIDIA A100-SXM4-80GB", "8.0", 81920, [0x68, 0x9E, 0xC2, 0xD4], False,
     _pairs(4, lambda i, j: "NV12"), True),
    ("RTX4090", "NVIDIA GeForce RTX 4090", "8.9", 24564, [0x01, 0x25, 0x41, 0x61, 0x81, 0xA1, 0xC1, 0xE1], None,
     _pairs(8, lambda i, j: "NODE" if (i < 4) == (j < 4) else "SYS"), False),
    ("L4", "NVIDIA L4", "8.9", 23034, [0x01], None, {0: {}}, None),
]


@pytest.mark.parametrize(("machine", "name", "cc", "mib", "buses", "mig", "links", "p2p"), MACHINES,
                         ids=[m[0] for m in MACHINES])
def test_gpus_of_recorded_machines(fake_nvml, machine, name, cc, mib, buses, mig, links, p2p):
    fake_nvml(machine)
    gpus = _gpu.probe_gpus()
    assert [g.index for g in gpus] == list(range(len(buses)))
    assert {g.name for g in gpus} == {name}
    assert {g.compute_capability for g in gpus} == {cc}
    assert {g.memory_bytes for g in gpus} == {mib * MIB}
    assert [g.pci_bus_id for g in gpus] == [f"00000000:{b:02X}:00.0" for b in buses]
    assert [g.numa_node for g in gpus] == [_socket(b) for b in buses]
    assert [g.cpu_affinity for g in gpus] == ["0-31" if _socket(b) == 0 else "32-63" for b in buses]
    assert [g.mig for g in gpus] == [mig] * len(buses)
    assert {g.index: g.links for g in gpus} == links
    if p2p is None:
        assert [g.p2p for g in gpus] == [{}]
    else:
        assert {v for g in gpus for v in g.p2p.values()} == {p2p}
        assert sum(len(g.p2p) for g in gpus) == len(buses) * (len(buses) - 1)


def test_hidden_nvswitch_still_counts_all_links(fake_nvml):
    """In VMs NVML cannot type the far end of a switch link: it still counts towards NV18."""
    fake = fake_nvml("H100SXMx8")
    fake.switch_typed = False
    assert {link for g in _gpu.probe_gpus() for link in g.links.values()} == {"NV18"}


def test_direct_nvlinks_between_gpus_are_counted_per_peer(fake_nvml):
    """Two GPUs bridged to each other (no switch): the links whose far end is the peer's bus id."""
    fake = fake_nvml("A100SXMx4")
    fake.gpus = fake.gpus[:2]
    fake.nvmlDeviceGetNvLinkRemoteDeviceType = lambda handle, link: 0  # NVML_NVLINK_DEVICE_TYPE_GPU
    peer_bus = {0: fake.gpus[1].bus_id.encode(), 1: fake.gpus[0].bus_id.encode()}
    fake.nvmlDeviceGetNvLinkRemotePciInfo = lambda handle, link: type("Pci", (), {"busId": peer_bus[handle]})
    fake.nvmlDeviceGetNvLinkState = lambda handle, link: int(link < 4)
    assert [g.links for g in _gpu.probe_gpus()] == [{"1": "NV4"}, {"0": "NV4"}]


def test_probe_reports_the_gpus_and_their_links(fake_nvml):
    fake_nvml("H100SXMx8")
    facts = probes.probe(runtime=False)
    assert len(facts.gpus) == 8 and facts.gpus[3].links["7"] == "NV18"
    text = probes.summary(facts)
    assert "0: NVIDIA H100 80GB HBM3, cc 9.0, 79.6 GiB, 00000000:18:00.0, NUMA 0, cpus 0-31" in text
    assert "   7  NV18  NV18  NV18  NV18  NV18  NV18  NV18     X" in text
    assert probes.Facts.from_json(facts.to_json()) == facts


def test_fingerprint_changes_with_the_gpu_set(fake_nvml):
    fake_nvml("H100SXMx8")
    h100 = probes.probe(runtime=False)
    assert probes.probe(runtime=False).fingerprint == h100.fingerprint
    fake_nvml("A100SXMx4")
    a100 = probes.probe(runtime=False)
    fake = fake_nvml("H100SXMx8")
    fake.gpus = fake.gpus[:4]
    four_h100 = probes.probe(runtime=False)
    no_gpus = probes.probe(runtime=False, gpus=False)
    assert len({h100.fingerprint, a100.fingerprint, four_h100.fingerprint, no_gpus.fingerprint}) == 4


def test_no_nvml_library_means_no_gpus_and_no_traceback(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    with caplog.at_level(logging.DEBUG, logger="autotune.probes"):
        assert _gpu.probe_gpus() == ()
    assert "no GPUs probed: pynvml is not installed" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


def test_real_pynvml_without_driver_means_no_gpus(caplog):
    """On this CPU machine the real binding finds no libnvidia-ml: NVMLError, mapped, no GPUs."""
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVIDIA driver")
    with caplog.at_level(logging.DEBUG, logger="autotune.probes"):
        assert _gpu.probe_gpus() == ()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


def test_a_driver_that_does_not_answer_ends_the_probe_at_its_limit_in_one_line_and_the_next_probe_at_once(
        fake_nvml, monkeypatch):
    """A hung driver: the probe says so in one error (no GPUs read is not no GPUs) and a second probe does not wait
    beside the first's read; once NVML answers, the GPUs are read again."""
    answered = threading.Event()
    fake = fake_nvml("L4")
    monkeypatch.setattr(fake, "nvmlInit", lambda: answered.wait(60))
    monkeypatch.setattr(_gpu, "_unanswered", None)
    monkeypatch.setenv(_gpu.NVML_LIMIT, "0.5")
    readers = lambda: [t for t in threading.enumerate() if t.name == "autotune-nvml"]  # noqa: E731
    try:
        start = time.monotonic()
        with pytest.raises(ProbeError) as first:
            probes.probe(runtime=False)
        waited = time.monotonic() - start
        with pytest.raises(ProbeError) as second:
            _gpu.probe_devices()
        assert len(readers()) == 1  # the second probe started no read of its own
    finally:
        answered.set()
        for reader in readers():
            reader.join(5)
    assert 0.5 <= waited < 5, waited
    assert str(first.value).startswith("NVML did not answer within 0.5 s: is the GPU driver hung")
    assert str(second.value).startswith("NVML has not answered an earlier probe of this process")
    assert "nvidia-smi -pm 1" in str(first.value) and "AUTOTUNE_NVML_TIMEOUT_S=SECONDS" in str(first.value)
    assert not readers()
    assert [g.name for g in _gpu.probe_gpus()] == ["NVIDIA L4"]


@pytest.mark.parametrize("told", ["soon", "0", "-3", "nan", "inf"])
def test_a_limit_for_nvml_that_is_no_positive_number_is_one_line(monkeypatch, told):
    monkeypatch.setenv(_gpu.NVML_LIMIT, told)
    with pytest.raises(ProbeError, match="AUTOTUNE_NVML_TIMEOUT_S=.*a positive number"):
        _gpu.probe_devices()


def test_driver_not_loaded_means_no_gpus(fake_nvml):
    fake_nvml(FakePynvml(gpus=[], init_error=DRIVER_NOT_LOADED))
    assert _gpu.probe_gpus() == ()


@pytest.mark.parametrize(("code", "error"), [
    (3, _nvml.NvmlNotSupportedError), (12, _nvml.NvmlUnavailableError), (9, _nvml.NvmlUnavailableError),
    (4, _nvml.NvmlNoPermissionError), (15, _nvml.NvmlGpuLostError), (999, _nvml.NvmlError),
])
def test_nvml_error_codes_become_typed_errors(fake_nvml, code, error):
    fake = fake_nvml("L4")

    def fail(handle):
        raise NVMLError(code)

    fake.nvmlDeviceGetName = fail
    with _nvml.Nvml() as nvml, pytest.raises(error) as caught:
        nvml.name(nvml.handle(0))
    assert caught.type is error and caught.value.code == code


def test_unsupported_optional_values_are_none(fake_nvml):
    fake = fake_nvml("L4")

    def unsupported(*args):
        raise NVMLError(3)

    fake.nvmlDeviceGetMemoryAffinity = fake.nvmlDeviceGetCpuAffinity = unsupported
    (gpu,) = _gpu.probe_gpus()
    assert (gpu.numa_node, gpu.cpu_affinity, gpu.mig) == (None, None, None)
    assert gpu.memory_bytes == 23034 * MIB and gpu.memory_bytes < 23 * GIB


@pytest.mark.parametrize(("raw", "key"), [
    ("0000:18:00.0", "00000000:18:00.0"), ("00000000:2a:00.0", "00000000:2A:00.0"), ("18:00.0", "00000000:18:00.0"),
])
def test_bus_ids_have_one_spelling(raw, key):
    assert _gpu.bus_key(raw) == key


def test_a_gpu_nvml_cannot_read_is_skipped_alone(fake_nvml, caplog, monkeypatch):
    """One GPU hidden by cgroups (no permission for its handle) and one lost (its name fails): the other six
    are probed, each skip is warned about, and torch seeing more devices than the probe is said."""
    from dataclasses import replace

    import torch

    from autotune.study.driver import unprobed_devices

    fake = fake_nvml("H100SXMx8")
    no_permission, gpu_is_lost = 4, 15
    handle, name = fake.nvmlDeviceGetHandleByIndex, fake.nvmlDeviceGetName

    def hidden(index):
        if index == 3:
            raise NVMLError(no_permission)
        return handle(index)

    def lost(h):
        if h == 5:
            raise NVMLError(gpu_is_lost)
        return name(h)

    fake.nvmlDeviceGetHandleByIndex, fake.nvmlDeviceGetName = hidden, lost
    with caplog.at_level(logging.WARNING):
        gpus = _gpu.probe_gpus()
    assert [g.nvml_index for g in gpus] == [0, 1, 2, 4, 6, 7]
    assert [g.index for g in gpus] == [0, 1, 2, 3, 5, 6]  # CUDA still enumerates the lost one (ordinal 4)
    assert {g.name for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 2 and skipped[0].startswith("GPU 3 of 8 skipped: NVML cannot read it"), skipped
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 7)
    facts = replace(probes.probe(), gpus=gpus)
    assert unprobed_devices(facts) == "torch sees 7 CUDA device(s), the probe read 6 from NVML"
    assert unprobed_devices(replace(facts, gpus=gpus + gpus[:1])) is None


def test_a_gpu_that_takes_one_context_is_probed_and_refused_for_a_search(fake_nvml):
    """EXCLUSIVE_PROCESS takes one CUDA context at a time: a search, which runs a paired worker beside process
    pairs on the GPU, would see every second process refused; it stops before the first with what to do."""
    from autotune.probes._summary import _gpu_row
    from autotune.study.driver import one_context_only

    fake = fake_nvml("A100SXMx4")
    fake.gpus[1].compute_mode = 3  # NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    gpus = _gpu.probe_gpus()
    assert [g.compute_mode for g in gpus] == ["Default", "Exclusive_Process", "Default", "Default"]
    assert _gpu_row(gpus[1]).endswith(", compute mode Exclusive_Process")
    assert not _gpu_row(gpus[0]).endswith("Default")
    facts = probes.probe(runtime=False)
    assert one_context_only(facts) == (
        "GPU 1 (NVIDIA A100-SXM4-80GB) is in compute mode Exclusive_Process: a search runs several processes on it "
        "side by side; set it to Default first (sudo nvidia-smi -i 1 -c DEFAULT), or hide it "
        "(CUDA_VISIBLE_DEVICES=) to search on the CPU")
    fake.gpus[1].compute_mode = 0
    assert one_context_only(probes.probe(runtime=False)) is None
