"""NVML behind one small facade: one method per NVML call, NVML's error codes mapped to typed errors.

``pynvml`` (the nvidia-ml-py package) is imported only when a facade is opened, never at import time.
Tests replace the library with a fake by monkeypatching :func:`load_library`; nothing else in the
probe touches NVML.

>>> try:
...     with Nvml() as nvml:
...         count = nvml.device_count()
... except NvmlError as e:
...     count = 0  # no driver / no library: no GPUs
"""
from __future__ import annotations

import contextlib
import os
from types import ModuleType
from typing import Any, TypeAlias

from ._cpulist import words_to_ids

# Codes from nvml.h (stable across NVML versions); used so a fake library needs no constants of its own.
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_DEVICE_MIG_ENABLE = 1
# nvmlComputeMode_t (nvml.h); EXCLUSIVE_THREAD (1) is gone since CUDA 8
COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
NVML_AFFINITY_SCOPE_NODE = 0
NVML_P2P_CAPS_INDEX_READ = 0  # pynvml defines this one as the tuple ``(0,)``: a typo, not used
NVML_P2P_STATUS_OK = 0
NVML_NVLINK_DEVICE_TYPE_GPU = 0
NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
NVML_NVLINK_MAX_LINKS = 36  # NVML 12.x; older drivers answer "invalid argument"/"not supported" past theirs

# A device handle: an opaque ctypes pointer of pynvml (which has no types), only passed back to NVML.
Handle: TypeAlias = Any


class NvmlError(Exception):
    """An NVML call failed; ``code`` is NVML's return code (None when the library is missing)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class NvmlUnavailableError(NvmlError):
    """No usable NVML: library or driver missing, or library and driver versions differ."""


class NvmlNotSupportedError(NvmlError):
    """This GPU or driver does not support the call (e.g. NVLink on a PCIe card)."""


class NvmlNoPermissionError(NvmlError):
    """The call needs more privileges than this process has."""


class NvmlGpuLostError(NvmlError):
    """The GPU fell off the bus or is not found any more; a reboot or reset is needed."""


_ERRORS: dict[int, type[NvmlError]] = {
    NVML_ERROR_UNINITIALIZED: NvmlUnavailableError,
    NVML_ERROR_DRIVER_NOT_LOADED: NvmlUnavailableError,
    NVML_ERROR_LIBRARY_NOT_FOUND: NvmlUnavailableError,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: NvmlUnavailableError,
    NVML_ERROR_NOT_SUPPORTED: NvmlNotSupportedError,
    NVML_ERROR_FUNCTION_NOT_FOUND: NvmlNotSupportedError,
    NVML_ERROR_NO_PERMISSION: NvmlNoPermissionError,
    NVML_ERROR_GPU_IS_LOST: NvmlGpuLostError,
    NVML_ERROR_GPU_NOT_FOUND: NvmlGpuLostError,
}


class NvmlNotFoundError(NvmlError):
    """The object asked for does not exist (an empty MIG device slot)."""


_ERRORS[NVML_ERROR_NOT_FOUND] = NvmlNotFoundError


def load_library() -> ModuleType:
    """The NVML Python binding (``pynvml`` from nvidia-ml-py), imported on first use."""
    try:
        import pynvml
    except ImportError as e:
        raise NvmlUnavailableError("pynvml is not installed: pip install nvidia-ml-py") from e
    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Nvml:
    """An initialised NVML session. Use as a context manager: ``nvmlShutdown`` runs on exit."""

    def __init__(self) -> None:
        self._lib = load_library()

    def __enter__(self) -> Nvml:
        self._call("nvmlInit")
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(NvmlError):  # nothing to release when shutdown itself fails
            self._call("nvmlShutdown")

    def _call(self, name: str, *args: Any) -> Any:
        fn = getattr(self._lib, name, None)
        if fn is None:
            raise NvmlNotSupportedError(f"{name} is not in this NVML binding", NVML_ERROR_FUNCTION_NOT_FOUND)
        try:
            return fn(*args)
        except self._lib.NVMLError as e:
            code = getattr(e, "value", None)
            error = _ERRORS.get(code, NvmlError) if isinstance(code, int) else NvmlError
            raise error(f"{name}: {e}", code) from e

    def driver_version(self) -> str:
        return _text(self._call("nvmlSystemGetDriverVersion"))

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def handle(self, index: int) -> Handle:
        return self._call("nvmlDeviceGetHandleByIndex", index)

    def name(self, handle: Handle) -> str:
        return _text(self._call("nvmlDeviceGetName", handle))

    def compute_capability(self, handle: Handle) -> tuple[int, int]:
        major, minor = self._call("nvmlDeviceGetCudaComputeCapability", handle)
        return int(major), int(minor)

    def memory_total(self, handle: Handle) -> int:
        return int(self._call("nvmlDeviceGetMemoryInfo", handle).total)

    def pci_bus_id(self, handle: Handle) -> str:
        return _text(self._call("nvmlDeviceGetPciInfo", handle).busId)

    def cpu_affinity(self, handle: Handle) -> frozenset[int]:
        """The CPUs close to the GPU (``nvidia-smi topo -m``'s "CPU Affinity")."""
        words = -(-(os.cpu_count() or 64) // 64)
        return words_to_ids(self._call("nvmlDeviceGetCpuAffinity", handle, words))

    def memory_affinity(self, handle: Handle, words: int = 16) -> frozenset[int]:
        """The NUMA nodes close to the GPU (``nvidia-smi topo -m``'s "NUMA Affinity"); 16 words: 1024 nodes."""
        return words_to_ids(self._call("nvmlDeviceGetMemoryAffinity", handle, words, NVML_AFFINITY_SCOPE_NODE))

    def uuid(self, handle: Handle) -> str:
        """``GPU-…`` for a GPU, ``MIG-…`` for a MIG device: the names ``CUDA_VISIBLE_DEVICES`` takes."""
        return _text(self._call("nvmlDeviceGetUUID", handle))

    def compute_mode(self, handle: Handle) -> str:
        """As ``nvidia-smi -q`` prints it: Default, Exclusive_Process or Prohibited (nvmlComputeMode_t)."""
        mode = int(self._call("nvmlDeviceGetComputeMode", handle))
        return COMPUTE_MODES.get(mode, f"mode {mode}")

    def mig_enabled(self, handle: Handle) -> bool:
        current, _pending = self._call("nvmlDeviceGetMigMode", handle)
        return current == NVML_DEVICE_MIG_ENABLE

    def mig_devices(self, handle: Handle) -> list[Handle]:
        """The MIG devices (GPU instance + compute instance) on a MIG-enabled GPU, in NVML's slot order;
        empty slots answer NOT_FOUND and are skipped."""
        found = []
        for slot in range(int(self._call("nvmlDeviceGetMaxMigDeviceCount", handle))):
            try:
                found.append(self._call("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot))
            except NvmlNotFoundError:
                continue
        return found

    def nvlink_active(self, handle: Handle, link: int) -> bool:
        return bool(self._call("nvmlDeviceGetNvLinkState", handle, link))

    def nvlink_remote_type(self, handle: Handle, link: int) -> int:
        return int(self._call("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link))

    def nvlink_remote_bus_id(self, handle: Handle, link: int) -> str:
        return _text(self._call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link).busId)

    def common_ancestor(self, a: Handle, b: Handle) -> int:
        """NVML_TOPOLOGY_* level of the closest PCIe object both GPUs sit under."""
        return int(self._call("nvmlDeviceGetTopologyCommonAncestor", a, b))

    def p2p_read_ok(self, a: Handle, b: Handle) -> bool:
        return self._call("nvmlDeviceGetP2PStatus", a, b, NVML_P2P_CAPS_INDEX_READ) == NVML_P2P_STATUS_OK
