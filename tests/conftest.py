"""Shared fixtures: the live machine's facts, fast trial settings, and the CLI in a subprocess."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def facts():
    from autotune import probes

    return probes.probe()


@pytest.fixture
def fast_settings():
    from autotune.runner import TrialSettings

    return TrialSettings(warmup_steps=2, measure_steps=6, windows=2, max_extra_windows=0, eval_samples=128)


def run_cli(*args: str, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``autotune ARGS`` in a fresh process, as a user would type it."""
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})},
    )


FAST = ("--steps", "6", "--warmup-steps", "2")
