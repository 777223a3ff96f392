"""A fake ``pynvml`` built by parsing real ``nvidia-smi -q`` and CUDA ``deviceQuery`` output.

From the dumps (``../shared/topologies/nvidia-smi-query/NAME.*``): GPU order (NVML enumerates by PCI bus
id, as ``nvidia-smi -q`` lists them), names, UUIDs, FB memory, bus ids, MIG mode, compute capability,
CUDA's order (``deviceQuery``) and peer-to-peer access. No dump has MIG devices: a test gives a GPU its
layout with ``with_mig`` (MIG mode on, one ``FakeMig`` per MIG device).

Not in the dumps, so stated here as the fake's model of the machines:

* NVLink. The dumps were taken without ``nvidia-smi nvlink -s``. ``H100SXMx8`` is an HGX H100 board: each
  H100 SXM5 has 18 NVLink4 links, all to the board's NVSwitches (``nvidia-smi topo -m`` prints NV18).
  ``A100SXMx4`` holds modules 3, 5, 6 and 7 of an HGX A100 8-GPU baseboard (board part 692-2G506): each
  A100 SXM4 has 12 NVLink3 links to the six NVSwitches (NV12). RTX 4090 and L4 have no NVLink.
* Host. A two-socket host: a GPU whose bus number is below 0x80 hangs off socket 0 (NUMA node 0, CPUs
  0-31), the others off socket 1 (node 1, CPUs 32-63). Each GPU has its own PCIe root port (the bus
  numbers are 0x20 apart, one per root complex), so two GPUs on one socket meet at the CPU (NODE) and
  GPUs on different sockets across the socket interconnect (SYS). This decides the RTX 4090 matrix.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

MACHINES = ("H100SXMx8", "A100SXMx4", "RTX4090", "L4")
NVLINKS_TO_SWITCH = {"H100SXMx8": 18, "A100SXMx4": 12}
SWITCH_BUS_ID = b"00000000:05:00.0"  # what a switch-side link reports as its far end when NVML cannot type it

# nvml.h codes the fake raises
NOT_SUPPORTED, INVALID_ARGUMENT, NOT_FOUND, DRIVER_NOT_LOADED = 3, 2, 6, 9
MAX_MIG_DEVICES = 7  # an A100/H100 holds at most 7 MIG devices (nvmlDeviceGetMaxMigDeviceCount)
TOPOLOGY_NODE, TOPOLOGY_SYSTEM = 40, 50
P2P_OK, P2P_NOT_SUPPORTED = 0, 5
MAX_LINKS = 18


class NVMLError(Exception):
    """Like ``pynvml.NVMLError``: the NVML return code is ``value``."""

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeMig:
    """One MIG device (GPU instance + compute instance): its UUID and the memory of its slice."""

    uuid: str
    memory_bytes: int


@dataclass(frozen=True)
class MigHandle:
    gpu: int
    slot: int


@dataclass
class FakeGpu:
    bus_id: str
    name: str
    memory_bytes: int
    mig: bool | None
    compute_capability: tuple[int, int] = (0, 0)
    nvlinks: int = 0
    cuda_index: int = -1
    uuid: str = ""
    mig_devices: list[FakeMig | None] = field(default_factory=list)  # by slot; None: an empty slot
    compute_mode: int = 0  # nvmlComputeMode_t

    @property
    def bus(self) -> int:
        return int(self.bus_id.split(":")[1], 16)

    @property
    def socket(self) -> int:
        return 0 if self.bus < 0x80 else 1


@dataclass
class _Struct:
    total: int = 0
    busId: bytes = b""  # noqa: N815 - pynvml's field name


@dataclass
class FakePynvml:
    """The subset of ``pynvml`` the probe's facade calls, answering from one parsed machine."""

    gpus: list[FakeGpu]
    peer_access: dict[tuple[int, int], bool] = field(default_factory=dict)  # NVML indexes -> deviceQuery answer
    driver: str = ""
    init_error: int | None = None
    switch_typed: bool = True  # False: remote device type unsupported (NVSwitch hidden, as in VMs)
    NVMLError = NVMLError

    def _gpu(self, handle: int) -> FakeGpu:
        return self.gpus[handle]

    def with_mig(self, index: int, *slices: tuple[str, int]) -> FakePynvml:
        """GPU ``index`` in MIG mode with these MIG devices (uuid, memory bytes), in slot order."""
        gpu = self.gpus[index]
        gpu.mig = True
        gpu.mig_devices = [FakeMig(uuid, memory) for uuid, memory in slices]
        return self

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:  # noqa: N802
        pass

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return self.driver

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        if not 0 <= index < len(self.gpus):
            raise NVMLError(INVALID_ARGUMENT)
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:  # noqa: N802 - old pynvml returns bytes
        return self._gpu(handle).name.encode()

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:  # noqa: N802
        return self._gpu(handle).compute_capability

    def nvmlDeviceGetMemoryInfo(self, handle: int | MigHandle) -> _Struct:  # noqa: N802
        if isinstance(handle, MigHandle):
            return _Struct(total=self._mig(handle).memory_bytes)
        return _Struct(total=self._gpu(handle).memory_bytes)

    def nvmlDeviceGetUUID(self, handle: int | MigHandle) -> str:  # noqa: N802
        return self._mig(handle).uuid if isinstance(handle, MigHandle) else self._gpu(handle).uuid

    def _mig(self, handle: MigHandle) -> FakeMig:
        mig = self._gpu(handle.gpu).mig_devices[handle.slot]
        if mig is None:
            raise NVMLError(NOT_FOUND)
        return mig

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: int) -> int:  # noqa: N802
        if self._gpu(handle).mig is None:
            raise NVMLError(NOT_SUPPORTED)
        return MAX_MIG_DEVICES

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: int, slot: int) -> MigHandle:  # noqa: N802
        gpu = self._gpu(handle)
        if not gpu.mig:
            raise NVMLError(INVALID_ARGUMENT)
        if slot >= len(gpu.mig_devices) or gpu.mig_devices[slot] is None:
            raise NVMLError(NOT_FOUND)
        return MigHandle(handle, slot)

    def nvmlDeviceGetPciInfo(self, handle: int) -> _Struct:  # noqa: N802
        return _Struct(busId=self._gpu(handle).bus_id.encode())

    def nvmlDeviceGetCpuAffinity(self, handle: int, words: int) -> list[int]:  # noqa: N802
        mask = (2**32 - 1) << (32 * self._gpu(handle).socket)
        return [(mask >> (64 * w)) & (2**64 - 1) for w in range(words)]

    def nvmlDeviceGetMemoryAffinity(self, handle: int, words: int, scope: int) -> list[int]:  # noqa: N802
        return [1 << self._gpu(handle).socket] + [0] * (words - 1)

    def nvmlDeviceGetComputeMode(self, handle: int) -> int:  # noqa: N802
        return self._gpu(handle).compute_mode

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:  # noqa: N802
        mig = self._gpu(handle).mig
        if mig is None:
            raise NVMLError(NOT_SUPPORTED)
        return [int(mig), int(mig)]

    def _link(self, handle: int, link: int) -> FakeGpu:
        gpu = self._gpu(handle)
        if not gpu.nvlinks:
            raise NVMLError(NOT_SUPPORTED)
        if link >= MAX_LINKS:
            raise NVMLError(INVALID_ARGUMENT)
        return gpu

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:  # noqa: N802
        return int(link < self._link(handle, link).nvlinks)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: int, link: int) -> int:  # noqa: N802
        self._link(handle, link)
        if not self.switch_typed:
            raise NVMLError(NOT_SUPPORTED)
        return 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: int, link: int) -> _Struct:  # noqa: N802
        self._link(handle, link)
        return _Struct(busId=SWITCH_BUS_ID)

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:  # noqa: N802
        return TOPOLOGY_NODE if self._gpu(a).socket == self._gpu(b).socket else TOPOLOGY_SYSTEM

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:  # noqa: N802
        return P2P_OK if self.peer_access.get((a, b)) else P2P_NOT_SUPPORTED


def load_machine(directory: Path, name: str) -> FakePynvml:
    """The fake for ``directory/name.nvidia-smi-q.txt`` and ``directory/name.deviceQuery.txt``."""
    smi = (directory / f"{name}.nvidia-smi-q.txt").read_text()
    gpus = [_gpu_from_section(s) for s in re.split(r"^GPU ", smi, flags=re.M)[1:]]
    by_bus = {g.bus: g for g in gpus}
    query = (directory / f"{name}.deviceQuery.txt").read_text()
    for block in re.split(r"^Device (?=\d+: )", query, flags=re.M)[1:]:
        bus = int(re.search(r"Bus ID / location ID:\s+\d+ / (\d+) /", block).group(1))
        major, minor = re.search(r"CUDA Capability Major/Minor version number:\s+(\d+)\.(\d+)", block).groups()
        by_bus[bus].compute_capability = (int(major), int(minor))
        by_bus[bus].cuda_index = int(block.split(":", 1)[0])
    for gpu in gpus:
        gpu.nvlinks = NVLINKS_TO_SWITCH.get(name, 0)
    nvml_index = {g.cuda_index: i for i, g in enumerate(gpus)}
    peers = {
        (nvml_index[int(a)], nvml_index[int(b)]): answer == "Yes"
        for a, b, answer in re.findall(r"\(GPU(\d+)\) -> .*?\(GPU(\d+)\) : (Yes|No)", query)
    }
    return FakePynvml(gpus=gpus, peer_access=peers, driver=_field(smi, "Driver Version"))


def _gpu_from_section(section: str) -> FakeGpu:
    fields = _indented_fields(section)
    mig = fields.get(("MIG Mode", "Current"))
    return FakeGpu(
        bus_id=section.splitlines()[0].strip(),
        name=fields[("Product Name",)],
        memory_bytes=int(fields[("FB Memory Usage", "Total")].split()[0]) * 2**20,
        mig=None if mig in (None, "N/A") else mig == "Enabled",
        uuid=fields[("GPU UUID",)],
        compute_mode={"Default": 0, "Prohibited": 2, "Exclusive_Process": 3}[fields[("Compute Mode",)]],
    )


def _indented_fields(section: str) -> dict[tuple[str, ...], str]:
    """``nvidia-smi -q``'s indented "key : value" lines, keyed by their path of section headers."""
    fields: dict[tuple[str, ...], str] = {}
    stack: list[tuple[int, str]] = []
    for line in section.splitlines()[1:]:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key, sep, value = line.strip().partition(" : ")
        if not sep and ":" not in line:
            stack.append((indent, key.strip()))
            continue
        path = tuple(k for _, k in stack) + (key.strip(),)
        fields.setdefault(path, value.strip())
    return fields


def _field(text: str, key: str) -> str:
    match = re.search(rf"^{re.escape(key)}\s+: (.*)$", text, flags=re.M)
    return match.group(1).strip() if match else ""
