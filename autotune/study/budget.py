"""Durations on the command line: ``90s``, ``30m``, ``1h30m``, ``2h``, or plain seconds (``45``)."""
from __future__ import annotations

import re

from ..errors import UsageError

_PART = re.compile(r"(\d+(?:\.\d+)?)([hms])")
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0}


def parse_duration(text: str) -> float:
    """Seconds in a duration string.

    >>> parse_duration("1h30m")
    5400.0
    """
    cleaned = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", cleaned):
        seconds = float(cleaned)
    else:
        parts = _PART.findall(cleaned)
        if not parts or "".join(n + u for n, u in parts) != cleaned or len({u for _, u in parts}) != len(parts):
            raise UsageError(f"bad duration {text!r}: use e.g. 90s, 30m, 1h30m")
        seconds = sum(float(n) * _UNIT[u] for n, u in parts)
    if seconds <= 0:
        raise UsageError(f"bad duration {text!r}: it must be more than zero")
    return seconds
