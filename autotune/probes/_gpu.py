"""GPUs through the NVML facade: the devices CUDA can use (``_visible``), their identity, locality, MIG devices
and the link matrix of ``nvidia-smi topo -m`` between them."""
from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypeVar

from ..errors import ProbeError, seconds_variable
from . import _nvml
from ._cpulist import format_cpulist
from ._facts import CudaView, Gpu, MigDevice
from ._nvml import Handle, Nvml, NvmlError
from ._visible import ORDER, VISIBLE, Physical, Visible, visible

log = logging.getLogger(__name__)
T = TypeVar("T")

# NVML's first call starts the driver's state for every GPU (tens of seconds without persistence mode); a hung driver
# never answers, and a probe that waited for it would hang the search, or the user's training under apply(), unsaid.
NVML_S = 120.0
NVML_LIMIT = "AUTOTUNE_NVML_TIMEOUT_S"  # seconds NVML is given, where a driver is known to be slower
_lock = threading.Lock()  # one read of NVML at a time: a second waits for the first's verdict, not beside it
_unanswered: threading.Thread | None = None  # a read NVML has not answered: a later probe would wait on the same driver
_Answer: TypeAlias = tuple[tuple[Gpu, ...], CudaView] | BaseException  # what a read of NVML gave

# nvmlDeviceGetTopologyCommonAncestor levels -> nvidia-smi topo labels
PCIE_LABELS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


@dataclass
class _NvLinks:
    """Active NVLinks of one GPU: counted per peer GPU, and those that end on an NVSwitch."""

    to_gpu: Counter[str] = field(default_factory=Counter)  # peer bus id -> links
    to_switch: int = 0


def probe_gpus(environ: Mapping[str, str] | None = None) -> tuple[Gpu, ...]:
    """The devices CUDA can use in a process started with ``environ`` (default ``os.environ``), in CUDA's
    order; ``()`` without a driver, library or GPU (logged at debug level, no traceback)."""
    return probe_devices(environ)[0]


def probe_devices(environ: Mapping[str, str] | None = None) -> tuple[tuple[Gpu, ...], CudaView | None]:
    """``probe_gpus`` and what chose them out of NVML's GPUs (``_visible``); ``((), None)`` without NVML. Raises
    ``ProbeError`` where NVML did not answer within ``nvml_limit_s()`` (at once while that read still waits): no
    GPUs read is not no GPUs, and a search or a recipe check taking it for that would go wrong."""
    global _unanswered
    environ = os.environ if environ is None else environ
    limit_s = nvml_limit_s()
    with _lock:
        if _unanswered is not None and _unanswered.is_alive():
            raise ProbeError(_unanswered_text(limit_s, earlier=True))
        answer: list[_Answer] = []
        # A thread, not a child process: the tests' fake NVML lives in this process. A call that never returns is
        # left in its daemon thread.
        reader = threading.Thread(target=_read, args=(environ, answer), name="autotune-nvml", daemon=True)
        try:
            reader.start()
        except RuntimeError:  # no thread to be had (a process limit): read here, without a limit, as before
            _read(environ, answer)
        else:
            reader.join(limit_s)
        if not answer:
            _unanswered = reader
            raise ProbeError(_unanswered_text(limit_s, earlier=False))
    if isinstance(answer[0], NvmlError):
        log.debug("no GPUs probed: %s", answer[0])
        return (), None
    if isinstance(answer[0], BaseException):
        raise answer[0]
    return answer[0]


def nvml_limit_s() -> float:
    """The seconds NVML is given to answer: ``AUTOTUNE_NVML_TIMEOUT_S`` where set and not empty, else ``NVML_S``."""
    return seconds_variable(NVML_LIMIT, NVML_S, "NVML may take to answer", ProbeError)


def _unanswered_text(limit_s: float, earlier: bool) -> str:
    said = "has not answered an earlier probe of this process" if earlier else f"did not answer within {limit_s:g} s"
    return (f"NVML {said}: is the GPU driver hung (nvidia-smi would say)? A driver without persistence mode can take "
            f"tens of seconds to start ('nvidia-smi -pm 1' keeps it started); {NVML_LIMIT}=SECONDS gives it longer")


def _read(environ: Mapping[str, str], answer: list[_Answer]) -> None:
    """NVML's GPUs, or what the read raised, appended to ``answer``."""
    try:
        with Nvml() as nvml:
            answer.append(_gpus(nvml, environ))
    except BaseException as e:  # noqa: BLE001 - handed to the probing thread, which raises what is not NVML's
        answer.append(e)


def _gpus(nvml: Nvml, environ: Mapping[str, str]) -> tuple[tuple[Gpu, ...], CudaView]:
    count = nvml.device_count()
    handles: dict[int, Handle] = {}
    bus_ids: dict[int, str] = {}
    physical: dict[int, tuple[Physical, tuple[MigDevice, ...]]] = {}
    for i in range(count):
        try:  # one GPU NVML cannot read (hidden by cgroups, lost) is skipped, not every GPU
            handles[i] = nvml.handle(i)
            bus_ids[i] = bus_key(nvml.pci_bus_id(handles[i]))
            physical[i] = _physical(nvml, i, handles[i], bus_ids[i])
        except NvmlError as e:
            handles.pop(i, None), bus_ids.pop(i, None)
            log.warning("GPU %d of %d skipped: NVML cannot read it (%s)", i, count, e)
    devices = visible([p for p, _ in physical.values()], environ)
    nvlinks = {d.gpu.nvml_index: _nvlinks(nvml, handles[d.gpu.nvml_index], list(bus_ids.values()))
               for d in devices}
    gpus = []
    for ordinal, device in enumerate(devices):  # CUDA enumerates a device NVML cannot name: its ordinal stays
        try:
            gpus.append(_gpu(nvml, device, devices, ordinal, handles, bus_ids, physical, nvlinks))
        except NvmlError as e:
            log.warning("GPU %d (%s) skipped: NVML cannot read it (%s)", device.gpu.nvml_index, device.gpu.bus_id, e)
    view = CudaView(visible_devices=environ.get(VISIBLE), device_order=environ.get(ORDER), nvml_gpus=count)
    return tuple(gpus), view


def _gpu(nvml: Nvml, device: Visible, devices: list[Visible], ordinal: int, handles: dict[int, Handle],
         bus_ids: dict[int, str], physical: dict[int, tuple[Physical, tuple[MigDevice, ...]]],
         nvlinks: dict[int, _NvLinks]) -> Gpu:
    """One visible device, CUDA ordinal ``ordinal`` (NvmlError when a value it needs cannot be read)."""
    i = device.gpu.nvml_index
    h, mig_devices = handles[i], physical[i][1]
    major, minor = device.gpu.compute_capability
    numa = _optional(nvml.memory_affinity, h)
    cpus = _optional(nvml.cpu_affinity, h)
    # Peers are the other visible whole GPUs: MIG devices have no peer-to-peer (MIG User Guide)
    peers = [(str(o), p.gpu.nvml_index) for o, p in enumerate(devices)
             if p is not device and device.mig_uuid is None and p.mig_uuid is None]
    return Gpu(
        index=ordinal,
        name=nvml.name(h),
        compute_capability=f"{major}.{minor}",
        memory_bytes=(next(m.memory_bytes for m in mig_devices if m.uuid == device.mig_uuid)
                      if device.mig_uuid else nvml.memory_total(h)),
        pci_bus_id=bus_ids[i],
        numa_node=min(numa) if numa else None,
        cpu_affinity=format_cpulist(cpus) if cpus else None,
        mig=device.gpu.mig if device.gpu.mig else _optional(nvml.mig_enabled, h),
        links={peer: link for peer, j in peers
               if (link := _link(nvml, handles, nvlinks, bus_ids, i, j)) is not None},
        p2p={peer: ok for peer, j in peers if (ok := _optional(nvml.p2p_read_ok, h, handles[j])) is not None},
        uuid=device.mig_uuid or device.gpu.uuid or None,
        nvml_index=i,
        mig_devices=mig_devices,
        compute_mode=_optional(nvml.compute_mode, h),
    )


def _physical(nvml: Nvml, index: int, handle: Handle, bus_id: str) -> tuple[Physical, tuple[MigDevice, ...]]:
    """One GPU as the choice of visible devices needs it, and its MIG devices with their memory."""
    mig = bool(_optional(nvml.mig_enabled, handle))
    migs = tuple(MigDevice(uuid=nvml.uuid(m), memory_bytes=nvml.memory_total(m))
                 for m in (_optional(nvml.mig_devices, handle) or [])) if mig else ()
    return Physical(nvml_index=index, uuid=_optional(nvml.uuid, handle) or "", bus_id=bus_id,
                    compute_capability=nvml.compute_capability(handle), mig_uuids=tuple(m.uuid for m in migs),
                    mig=mig), migs


def bus_key(bus_id: str) -> str:
    """One spelling for a PCI bus id: 8-digit domain, upper case ("0000:18:00.0" -> "00000000:18:00.0")."""
    parts = bus_id.strip().upper().split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    if len(parts) != 3:
        return bus_id.strip().upper()
    return f"{int(parts[0], 16):08X}:{parts[1]}:{parts[2]}"


def _optional(method: Callable[..., T], *args: Any) -> T | None:
    """A value NVML may not support here (MIG on a GeForce, NUMA in a VM): None when unsupported."""
    try:
        return method(*args)
    except NvmlError as e:
        log.debug("%s: %s", method.__name__, e)
        return None


def _nvlinks(nvml: Nvml, handle: Handle, bus_ids: list[str]) -> _NvLinks:
    """Count active links by what is at their far end.

    A link whose far end is not one of our GPUs, or whose far end NVML cannot name, is taken to end
    on an NVSwitch: on NVSwitch systems inside VMs NVML does not see the switches (NCCL makes the same
    assumption, NVIDIA/nccl#1182).
    """
    links = _NvLinks()
    for link in range(_nvml.NVML_NVLINK_MAX_LINKS):
        try:
            if not nvml.nvlink_active(handle, link):
                continue
        except NvmlError:
            continue  # past this GPU's last link, or no NVLink at all
        remote_type = _optional(nvml.nvlink_remote_type, handle, link)
        remote = _optional(nvml.nvlink_remote_bus_id, handle, link)
        peer = bus_key(remote) if remote else None
        if remote_type != _nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH and peer in bus_ids:
            links.to_gpu[peer] += 1
        else:
            links.to_switch += 1
    return links


def _link(nvml: Nvml, handles: dict[int, Handle], nvlinks: dict[int, _NvLinks], bus_ids: dict[int, str], i: int,
          j: int) -> str | None:
    """``NV<n>`` (active NVLinks between the pair) or the PCIe distance, as ``nvidia-smi topo -m`` prints it.

    Through NVSwitches every GPU reaches every other over all of its switch links: nvidia-smi prints
    NV18 for each pair of H100 SXM. When the two GPUs have different switch link counts (a link down)
    the smaller bounds the pair. None when NVML cannot tell the PCIe distance either.
    """
    direct = nvlinks[i].to_gpu[bus_ids[j]]
    switched = min(nvlinks[i].to_switch, nvlinks[j].to_switch)
    if direct + switched:
        return f"NV{direct + switched}"
    level = _optional(nvml.common_ancestor, handles[i], handles[j])
    return PCIE_LABELS.get(level) if level is not None else None
