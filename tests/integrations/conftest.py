"""What the integrations' tests share."""
from __future__ import annotations

import pytest

from autotune.integrations import _common


@pytest.fixture(autouse=True)
def _nothing_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a fresh process does: no recipe applied yet, no batch recorded, none in the environment."""
    monkeypatch.setattr(_common, "_applied", {})
    monkeypatch.setattr(_common, "_own", {})
    for name in ("AUTOTUNE_RECIPE", "AUTOTUNE_TRIAL", "AUTOTUNE_STEPS"):
        monkeypatch.delenv(name, raising=False)
