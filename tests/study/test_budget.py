from __future__ import annotations

import pytest

from autotune.errors import UsageError
from autotune.study import parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("1h30m", 5400), ("2h", 7200), ("1h2m3s", 3723), ("45", 45), (" 10M ", 600),
     ("1.5m", 90)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "10x", "m30", "30m30m", "-5m", "0s", "1h 30m", "5 minutes"])
def test_bad_durations_say_how_to_write_one(text: str) -> None:
    with pytest.raises(UsageError, match="duration"):
        parse_duration(text)
