"""The devices CUDA can use, in CUDA's order: ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` over NVML's GPUs.

NVML lists every GPU of the machine by PCI bus id; a CUDA process sees the devices these two variables
select, numbered from 0 in its own order. The rules, from the CUDA C++ Programming Guide ("CUDA
Environment Variables") and the MIG User Guide ("CUDA Device Enumeration", "CUDA Visible Devices"):

| variable | value | what CUDA does |
| --- | --- | --- |
| ``CUDA_DEVICE_ORDER`` | ``FASTEST_FIRST`` (default) | its guess of the fastest device first (below) |
| | ``PCI_BUS_ID`` | orders the devices by PCI bus id (NVML's order) |
| ``CUDA_VISIBLE_DEVICES`` | unset | every device |
| | ``0,2`` | the devices of those indices (into the order above), in the order listed |
| | ``GPU-8932f937,1`` | a GPU by UUID; a prefix that names one GPU is enough |
| | ``MIG-…`` | one MIG device by UUID |
| | an entry naming no device (``0,2,-1,1``) | that entry and every entry after it are ignored (devices 0 and 2) |
| | ``""`` | no device |

MIG: "regardless of how many MIG devices are created (or made available to a container), a single CUDA
process can only enumerate a single MIG device" (MIG User Guide, CUDA 11/R450 and 12/R525). A GPU in MIG
mode named by index or GPU UUID stands for its first MIG device; after the first MIG device, further ones
are not enumerated. A GPU in MIG mode without MIG devices offers none.

``FASTEST_FIRST`` makes CUDA "guess which device is fastest using a simple heuristic, and make that device
0, leaving the order of the rest of the devices unspecified". The heuristic is not documented: it is
modelled as the highest compute capability first, equal ones in PCI bus id order (what ``deviceQuery``
shows on the machines of ``../shared/topologies/nvidia-smi-query``). Where the GPUs differ the model may
not be CUDA's choice, and ``visible()`` logs a warning naming ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, with
which both agree.

>>> gpus = [Physical(0, "GPU-aa", "0000:18:00.0", (8, 0)), Physical(1, "GPU-bb", "0000:2A:00.0", (8, 0))]
>>> [(d.gpu.nvml_index, d.mig_uuid) for d in visible(gpus, {"CUDA_VISIBLE_DEVICES": "GPU-b,0"})]
[(1, None), (0, None)]
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

VISIBLE = "CUDA_VISIBLE_DEVICES"
ORDER = "CUDA_DEVICE_ORDER"
ORDERS = ("FASTEST_FIRST", "PCI_BUS_ID")


@dataclass(frozen=True)
class Physical:
    """What the choice needs to know of one GPU NVML sees."""

    nvml_index: int
    uuid: str
    bus_id: str  # one spelling (``_gpu.bus_key``), so ordering strings orders bus ids
    compute_capability: tuple[int, int]
    mig_uuids: tuple[str, ...] = ()  # its MIG devices, in NVML's slot order
    mig: bool = False  # MIG mode on


@dataclass(frozen=True)
class Visible:
    """One device CUDA enumerates: a GPU, or a MIG device on it."""

    gpu: Physical
    mig_uuid: str | None = None


def visible(gpus: list[Physical], environ: Mapping[str, str]) -> list[Visible]:
    """The devices a CUDA process started with ``environ`` uses, in its ordinal order."""
    ordered = _ordered(gpus, environ.get(ORDER))
    wanted = environ.get(VISIBLE)
    entries = [_device(g, None) for g in ordered] if wanted is None else _listed(ordered, wanted)
    out: list[Visible] = []
    for device in entries:
        if device is None:
            continue
        if device.mig_uuid is not None and any(d.mig_uuid is not None for d in out):
            continue  # one MIG device per process (MIG User Guide)
        out.append(device)
    return out


def _ordered(gpus: list[Physical], order: str | None) -> list[Physical]:
    by_bus = sorted(gpus, key=lambda g: g.bus_id)
    if order == "PCI_BUS_ID":
        return by_bus
    if order not in (None, "", "FASTEST_FIRST"):
        log.warning("%s=%s is not one of %s: CUDA takes FASTEST_FIRST", ORDER, order, ", ".join(ORDERS))
    if len({g.compute_capability for g in gpus}) > 1:
        log.warning("the GPUs differ and %s is not PCI_BUS_ID: CUDA's device order is a guess of which is fastest; "
                    "set %s=PCI_BUS_ID so that CUDA and autotune number the GPUs alike", ORDER, ORDER)
    return sorted(by_bus, key=lambda g: (-g.compute_capability[0], -g.compute_capability[1]))  # stable: bus order


def _device(gpu: Physical, mig_uuid: str | None) -> Visible | None:
    """A GPU as CUDA enumerates it: itself, or in MIG mode its first MIG device (None without any)."""
    if mig_uuid is not None:
        return Visible(gpu, mig_uuid)
    if gpu.mig:
        return Visible(gpu, gpu.mig_uuids[0]) if gpu.mig_uuids else None
    return Visible(gpu)


def _listed(ordered: list[Physical], wanted: str) -> list[Visible | None]:
    """The entries of ``CUDA_VISIBLE_DEVICES`` up to the first that names no device or one named before."""
    out: list[Visible | None] = []
    seen: set[tuple[int, str | None]] = set()
    for entry in (e.strip() for e in wanted.split(",")) if wanted.strip() else ():
        found = _lookup(ordered, entry)
        if found is None or (found[0].nvml_index, found[1]) in seen:
            log.warning("%s=%s: entry %r names no device (or one named before): CUDA ignores it and every entry "
                        "after it", VISIBLE, wanted, entry)
            break
        seen.add((found[0].nvml_index, found[1]))
        out.append(_device(*found))
    return out


def _lookup(ordered: list[Physical], entry: str) -> tuple[Physical, str | None] | None:
    """The GPU (and MIG device) one entry names: an index, a ``GPU-`` UUID prefix or a ``MIG-`` UUID."""
    if entry.lstrip("+").isdigit():
        index = int(entry)
        return (ordered[index], None) if index < len(ordered) else None
    if entry.startswith("MIG-"):
        matches = [(g, m) for g in ordered for m in g.mig_uuids if m.startswith(entry)]
        return (matches[0][0], matches[0][1]) if len(matches) == 1 else None
    if entry.startswith("GPU-"):
        gpus = [g for g in ordered if g.uuid.startswith(entry)]
        return (gpus[0], None) if len(gpus) == 1 else None
    return None
