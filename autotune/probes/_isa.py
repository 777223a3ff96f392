"""ISA flags, CPU model, vendor and x86 family/model numbers from ``/proc/cpuinfo`` (live or of a recorded tree)."""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# The flags that decide which kernels torch/oneDNN can use. x86 names as in the kernel's "flags" line
# (arch/x86/include/asm/cpufeatures.h); arm64 names as in its "Features" line (arch/arm64/kernel/cpuinfo.c).
X86_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile")
ARM_FEATURES = ("sve", "sve2", "bf16", "i8mm")

# arm64 cpuinfo names no model, only implementer and part numbers (as lscpu's tables do, abridged).
_ARM_IMPLEMENTERS = {0x41: "ARM", 0x48: "HiSilicon", 0x4E: "NVIDIA", 0x51: "Qualcomm", 0x61: "Apple", 0xC0: "Ampere"}
_ARM_PARTS = {
    (0x41, 0xD0C): "Neoverse-N1", (0x41, 0xD40): "Neoverse-V1", (0x41, 0xD49): "Neoverse-N2",
    (0x41, 0xD4F): "Neoverse-V2", (0x48, 0xD01): "Kunpeng-920", (0xC0, 0xAC3): "Ampere-1",
}


@dataclass(frozen=True)
class CpuInfo:
    isa: tuple[str, ...]
    model: str | None
    vendor: str | None
    arch: str | None
    # x86 CPUID family and model numbers ("family 25 model 17"): a VM may name two generations alike ("AMD EPYC")
    family_model: str | None = None


def normalize_model(name: str | None) -> str | None:
    """Collapse the padding some CPUs put in their brand string ("CPU           E5345  @ 2.33GHz")."""
    name = " ".join((name or "").split())
    return name or None


def family_model(family: object, model: object) -> str | None:
    """``"family F model M"`` from x86 CPUID numbers as cpuinfo or hwloc give them, or None if either is missing.

    The stepping is left out: hosts of one cloud machine type differ in it and train alike.

    >>> family_model("25", "17"), family_model(None, "17"), family_model("6", "")
    ('family 25 model 17', None, None)
    """
    try:
        return f"family {int(str(family))} model {int(str(model))}"
    except ValueError:
        return None


def read_cpuinfo(root: str | None) -> CpuInfo | None:
    """``ROOT/proc/cpuinfo`` parsed, or None when the file is missing or unreadable."""
    path = Path(root or "/") / "proc" / "cpuinfo"
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        log.debug("cannot read %s: %s", path, e)
        return None
    return parse_cpuinfo(text)


def parse_cpuinfo(text: str) -> CpuInfo:
    """ISA flags present on every processor, plus the model, vendor and architecture the text implies."""
    blocks = [_fields(b) for b in re.split(r"\n\s*\n", text.replace("\0", "")) if b.strip()]
    blocks = [b for b in blocks if b]
    if not blocks:
        return CpuInfo(isa=(), model=None, vendor=None, arch=None)
    flags = _common(blocks, "flags") | _common(blocks, "Features")
    isa = tuple(f for f in X86_FLAGS + ARM_FEATURES if f in flags)
    first = blocks[0]
    return CpuInfo(isa=isa, model=_model(first), vendor=_vendor(first), arch=_arch(first),
                   family_model=family_model(first.get("cpu family"), first.get("model")))


def cpuinfo_from_py_cpuinfo() -> CpuInfo | None:
    """py-cpuinfo, for systems without ``/proc/cpuinfo``. Slow: it starts a subprocess."""
    try:
        import cpuinfo  # py-cpuinfo

        data = cpuinfo.get_cpu_info()
    except Exception as e:  # noqa: BLE001 - a third-party probe may fail in any way; the ISA is then unknown
        log.debug("py-cpuinfo failed: %s", e)
        return None
    flags = set(data.get("flags", ()))
    isa = tuple(f for f in X86_FLAGS + ARM_FEATURES if f in flags)
    return CpuInfo(isa=isa, model=normalize_model(data.get("brand_raw")), vendor=data.get("vendor_id_raw") or None,
                   arch=data.get("arch_string_raw") or None,
                   family_model=family_model(data.get("family"), data.get("model")))


def _fields(block: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in block.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def _common(blocks: list[dict[str, str]], key: str) -> set[str]:
    """Flags every processor that lists ``key`` has (a flag missing on one CPU is not usable by all)."""
    sets = [set(b[key].split()) for b in blocks if key in b]
    return set.intersection(*sets) if sets else set()


def _arm_ids(block: dict[str, str]) -> tuple[int, int] | None:
    try:
        return int(block["CPU implementer"], 16), int(block["CPU part"], 16)
    except (KeyError, ValueError):
        return None


def _model(block: dict[str, str]) -> str | None:
    if "model name" in block:
        return normalize_model(block["model name"])
    if "cpu" in block:  # POWER: "POWER9, altivec supported"
        return normalize_model(block["cpu"])
    ids = _arm_ids(block)
    if ids:
        vendor = _ARM_IMPLEMENTERS.get(ids[0], f"implementer 0x{ids[0]:02x}")
        return _ARM_PARTS.get(ids, f"{vendor} part 0x{ids[1]:03x}")
    return None


def _vendor(block: dict[str, str]) -> str | None:
    if "vendor_id" in block:
        return block["vendor_id"] or None
    ids = _arm_ids(block)
    if ids:
        return _ARM_IMPLEMENTERS.get(ids[0], f"0x{ids[0]:02x}")
    return None


def _arch(block: dict[str, str]) -> str | None:
    if "flags" in block:
        return "x86_64" if "lm" in block["flags"].split() else "i686"
    if "CPU implementer" in block:
        return "aarch64" if block.get("CPU architecture", "8").strip() not in ("7", "6") else "armv7l"
    if block.get("cpu", "").startswith("POWER"):
        return "ppc64"
    return None
