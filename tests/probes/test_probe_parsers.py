"""The small parsers under the probe: hwloc bitmaps, kernel CPU lists, /proc/cpuinfo, hwloc XML."""
from __future__ import annotations

import pytest

from autotune.probes import _cpulist, _hwloc, _isa


@pytest.mark.parametrize(("text", "ids"), [
    ("0x00000003", {0, 1}),
    ("0x0000ffff,0xffffffff", set(range(48))),
    ("0x000000ff,0xff000000,,0x0000ffff", set(range(16)) | set(range(88, 104))),  # empty word is zero
    ("0xf...f,0x00000005", {0, 2}),  # infinite set: the finite part
    ("0x0", set()),
    ("", set()),
])
def test_hwloc_bitmaps(text, ids):
    assert _cpulist.parse_hwloc_bitmap(text) == ids


@pytest.mark.parametrize(("ids", "text"), [
    ([0, 1, 2, 3, 8], "0-3,8"), ([7], "7"), ([], ""), ([3, 1, 2, 10, 11], "1-3,10-11"),
])
def test_kernel_cpu_lists(ids, text):
    assert _cpulist.format_cpulist(ids) == text
    assert _cpulist.parse_cpulist(text) == set(ids)


def test_nvml_affinity_words():
    assert _cpulist.words_to_ids([2**64 - 1, 1]) == set(range(65))


X86 = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) CPU           E5345  @ 2.33GHz
flags\t\t: fpu lm avx2 avx512f amx_tile amx_bf16

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) CPU           E5345  @ 2.33GHz
flags\t\t: fpu lm avx2 avx512f amx_tile\x00
"""

ARM = """processor\t: 0
BogoMIPS\t: 100.00
Features\t: fp asimd sve sve2 bf16 i8mm
CPU implementer\t: 0x41
CPU architecture: 8
CPU part\t: 0xd4f
"""


def test_x86_cpuinfo_keeps_flags_every_cpu_has():
    info = _isa.parse_cpuinfo(X86)
    assert info.isa == ("avx2", "avx512f", "amx_tile")  # amx_bf16 is missing on processor 1
    assert info.model == "Intel(R) Xeon(R) CPU E5345 @ 2.33GHz"
    assert (info.vendor, info.arch) == ("GenuineIntel", "x86_64")


def test_arm_cpuinfo():
    info = _isa.parse_cpuinfo(ARM)
    assert info == _isa.CpuInfo(isa=("sve", "sve2", "bf16", "i8mm"), model="Neoverse-V2", vendor="ARM", arch="aarch64")


@pytest.mark.parametrize("text", ["", "\x00\x00", "\n\n"])
def test_empty_cpuinfo(text):
    assert _isa.parse_cpuinfo(text) == _isa.CpuInfo(isa=(), model=None, vendor=None, arch=None)


def test_missing_cpuinfo_in_a_root(tmp_path):
    assert _isa.read_cpuinfo(str(tmp_path)) is None


@pytest.mark.parametrize("text", ["not xml", "<topology/>", '<topology><object type="Package"/></topology>'])
def test_bad_hwloc_xml(text):
    with pytest.raises(_hwloc.HwlocError):
        _hwloc.parse_xml(text)
