"""The GPUs CUDA can use: ``CUDA_VISIBLE_DEVICES`` / ``CUDA_DEVICE_ORDER`` over the fake NVML machines, and MIG."""
from __future__ import annotations

import pytest

from autotune import probes
from autotune.probes import _gpu
from autotune.probes._visible import Physical, visible

MIB = 2**20
H100_UUIDS = ["GPU-b42dd28e", "GPU-7c3cadbd", "GPU-2d50cdf6", "GPU-d1838e76",  # from the dump: GPUs 0-3, socket 0
              "GPU-72be6e5d", "GPU-52378fbc", "GPU-83a5aebb", "GPU-33135771"]  # 4-7, socket 1
MIG_A = "MIG-4a0c6d1e-59c6-5c2f-9e8e-0f6a2b3c4d5e"  # two 3g.40gb devices on A100 GPU 0 (a layout the fake is given)
MIG_B = "MIG-8d1f2e3a-0b4c-5d6e-7f80-91a2b3c4d5e6"
SLICE = 40192 * MIB  # a 3g.40gb MIG device of an A100 80GB


# A mixed machine for the order: NVML (bus) order L4 (8.9), V100 (7.0), H100 (9.0)
MIXED = [Physical(0, "GPU-l4", "00000000:01:00.0", (8, 9)), Physical(1, "GPU-v100", "00000000:41:00.0", (7, 0)),
         Physical(2, "GPU-h100", "00000000:81:00.0", (9, 0))]
TWO_MIG = [Physical(0, "GPU-a", "00000000:01:00.0", (8, 0), mig=True, mig_uuids=("MIG-a1", "MIG-a2")),
           Physical(1, "GPU-b", "00000000:41:00.0", (8, 0)),
           Physical(2, "GPU-c", "00000000:81:00.0", (8, 0), mig=True, mig_uuids=("MIG-c1",)),
           Physical(3, "GPU-d", "00000000:C1:00.0", (8, 0), mig=True)]


@pytest.mark.parametrize(("gpus", "env", "expected"), [
    (MIXED, {}, [2, 0, 1]),  # FASTEST_FIRST (the default): highest compute capability first
    (MIXED, {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, [2, 0, 1]),
    (MIXED, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, [0, 1, 2]),
    (MIXED, {"CUDA_VISIBLE_DEVICES": "0"}, [2]),  # an index counts in CUDA's order, not NVML's
    (MIXED, {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, [0]),
    (MIXED, {"CUDA_VISIBLE_DEVICES": "2,0"}, [1, 2]),  # in the order listed
    (MIXED, {"CUDA_VISIBLE_DEVICES": "GPU-v1,GPU-l"}, [1, 0]),  # UUID prefixes
    (MIXED, {"CUDA_VISIBLE_DEVICES": "0,7,1"}, [2]),  # an entry naming no device ends the list
    (MIXED, {"CUDA_VISIBLE_DEVICES": "0,-1,1"}, [2]),
    (MIXED, {"CUDA_VISIBLE_DEVICES": "1,1,2"}, [0]),  # so does a device named twice
    (MIXED, {"CUDA_VISIBLE_DEVICES": "GPU-,0"}, []),  # a prefix naming several GPUs names none
    (MIXED, {"CUDA_VISIBLE_DEVICES": ""}, []),
    (MIXED, {"CUDA_VISIBLE_DEVICES": "nonsense"}, []),
    (TWO_MIG, {}, [(0, "MIG-a1"), 1]),  # one MIG device per process: GPU a's first; c's never; d has none
    (TWO_MIG, {"CUDA_VISIBLE_DEVICES": "MIG-a2"}, [(0, "MIG-a2")]),
    (TWO_MIG, {"CUDA_VISIBLE_DEVICES": "1,MIG-c1,MIG-a1"}, [1, (2, "MIG-c1")]),
    (TWO_MIG, {"CUDA_VISIBLE_DEVICES": "2"}, [(2, "MIG-c1")]),  # a GPU in MIG mode: its first MIG device
    (TWO_MIG, {"CUDA_VISIBLE_DEVICES": "3,1"}, [1]),  # in MIG mode without MIG devices: nothing
])
def test_cuda_chooses_and_orders_the_devices(gpus, env, expected) -> None:
    got = [d.gpu.nvml_index if d.mig_uuid is None else (d.gpu.nvml_index, d.mig_uuid) for d in visible(gpus, env)]
    assert got == expected


def test_a_guessed_order_is_warned_about(caplog) -> None:
    with caplog.at_level("WARNING", logger="autotune.probes"):
        visible(MIXED[:2], {})
        assert "set CUDA_DEVICE_ORDER=PCI_BUS_ID" in caplog.text
        caplog.clear()
        visible(MIXED[:2], {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
        visible([MIXED[0]], {})
    assert caplog.text == ""


def test_visible_gpus_are_numbered_in_cudas_order_with_their_own_cpus_and_links(fake_nvml, monkeypatch) -> None:
    fake_nvml("H100SXMx8")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,GPU-d1838e76")
    facts = probes.probe(runtime=False)
    assert [(g.index, g.nvml_index) for g in facts.gpus] == [(0, 5), (1, 3)]
    assert [g.uuid.split("-")[0] + "-" + g.uuid.split("-")[1] for g in facts.gpus] == [H100_UUIDS[5], H100_UUIDS[3]]
    assert [g.cpu_affinity for g in facts.gpus] == ["32-63", "0-31"]
    assert [g.pci_bus_id for g in facts.gpus] == ["00000000:AB:00.0", "00000000:5D:00.0"]
    assert [g.links for g in facts.gpus] == [{"1": "NV18"}, {"0": "NV18"}]  # peers by CUDA ordinal, visible only
    assert [g.p2p for g in facts.gpus] == [{"1": True}, {"0": True}]
    assert facts.cuda == probes.CudaView(visible_devices="5,GPU-d1838e76", device_order=None, nvml_gpus=8)
    assert probes.Facts.from_json(facts.to_json()) == facts
    text = probes.summary(facts)
    assert "0 [5]: NVIDIA H100 80GB HBM3, cc 9.0, 79.6 GiB, 00000000:AB:00.0, NUMA 1, cpus 32-63" in text
    assert "2 devices of 8 GPUs visible (CUDA_VISIBLE_DEVICES=5,GPU-d1838e76)" in text


def test_the_fingerprint_covers_the_visible_devices(fake_nvml, monkeypatch) -> None:
    fake_nvml("H100SXMx8")
    every = probes.probe(runtime=False).fingerprint
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    assert probes.probe(runtime=False).fingerprint == every  # the same devices: the same machine
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    two = probes.probe(runtime=False).fingerprint
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    assert probes.probe(runtime=False).fingerprint == two  # two H100s on NVSwitch are two H100s on NVSwitch
    assert two != every


def test_mig_devices_with_their_memory(fake_nvml, monkeypatch) -> None:
    fake_nvml("A100SXMx4").with_mig(0, (MIG_A, SLICE), (MIG_B, SLICE))
    facts = probes.probe(runtime=False)
    # one MIG device per process: GPU 0's first, then the three whole GPUs
    assert [(g.index, g.nvml_index, g.uuid == MIG_A, g.memory_bytes) for g in facts.gpus] == [
        (0, 0, True, SLICE), (1, 1, False, 81920 * MIB), (2, 2, False, 81920 * MIB), (3, 3, False, 81920 * MIB)]
    assert facts.gpus[0].mig_devices == (probes.MigDevice(MIG_A, SLICE), probes.MigDevice(MIG_B, SLICE))
    assert facts.gpus[0].links == {} and facts.gpus[1].links == {"2": "NV12", "3": "NV12"}  # no P2P with MIG
    assert probes.Facts.from_json(facts.to_json()) == facts
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", MIG_B)
    (only,) = _gpu.probe_gpus()
    assert (only.uuid, only.memory_bytes, only.is_mig_device, only.mig) == (MIG_B, SLICE, True, True)
    slice_b = probes.probe(runtime=False)
    assert f"0: NVIDIA A100-SXM4-80GB, cc 8.0, 39.2 GiB, 00000000:68:00.0, NUMA 0, cpus 0-31, MIG device {MIG_B} " \
           f"({MIG_A} 39.2 GiB, {MIG_B} 39.2 GiB)" in probes.summary(slice_b)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert probes.probe(runtime=False).fingerprint != slice_b.fingerprint  # a slice is not a whole A100


def test_a_schema_2_document_still_reads(fake_nvml) -> None:
    fake_nvml("L4")
    doc = probes.probe(runtime=False).to_dict()
    doc["schema_version"] = 2
    del doc["cuda"]
    for gpu in doc["gpus"]:
        for key in ("uuid", "nvml_index", "mig_devices"):
            del gpu[key]
    old = probes.Facts.from_dict(doc)
    assert old.cuda is None and old.gpus[0].uuid is None and old.gpus[0].mig_devices == ()
