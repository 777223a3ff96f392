"""CPU and node sets: hwloc's bitmap strings in, the kernel's list syntax ("0-3,8") out."""
from __future__ import annotations

from collections.abc import Iterable

# hwloc writes an infinite set (e.g. a machine-level complete_nodeset) with this leading word.
_INFINITE_PREFIX = "0xf...f"


def parse_hwloc_bitmap(text: str | None) -> frozenset[int]:
    """The indexes set in an hwloc bitmap string such as ``"0x000000ff,,0x0000ffff"``.

    hwloc prints 32-bit words, most significant first, separated by commas; an empty word is zero.
    An infinite set starts with ``0xf...f``: only its finite part is kept.

    >>> sorted(parse_hwloc_bitmap("0x00000003,,0x00000001"))
    [0, 64, 65]
    """
    if not text:
        return frozenset()
    words = text.split(",")
    if words[0] == _INFINITE_PREFIX:
        words = words[1:]
    value = 0
    for word in words:
        value = (value << 32) | int(word or "0", 16)
    return frozenset(i for i in range(value.bit_length()) if value >> i & 1)


def format_cpulist(ids: Iterable[int]) -> str:
    """Kernel list syntax, as in ``/sys/devices/system/node/node0/cpulist``.

    >>> format_cpulist([0, 1, 2, 3, 8, 10, 11])
    '0-3,8,10-11'
    """
    ranges: list[list[int]] = []
    for i in sorted(set(ids)):
        if ranges and i == ranges[-1][1] + 1:
            ranges[-1][1] = i
        else:
            ranges.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def parse_cpulist(text: str) -> frozenset[int]:
    """The inverse of :func:`format_cpulist`; ``""`` is the empty set.

    >>> sorted(parse_cpulist("0-2,8"))
    [0, 1, 2, 8]
    """
    ids: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        ids.update(range(int(first), int(last or first) + 1))
    return frozenset(ids)


def words_to_ids(words: Iterable[int], bits: int = 64) -> frozenset[int]:
    """The indexes set in an array of machine words, least significant word first (NVML's affinity masks).

    >>> sorted(words_to_ids([0b101, 1]))
    [0, 2, 64]
    """
    ids: set[int] = set()
    for n, word in enumerate(words):
        ids.update(n * bits + i for i in range(bits) if int(word) >> i & 1)
    return frozenset(ids)
