"""A test's scripted measurer: ``StubMeasurer`` takes the search's contract (``PairedMeasurer``) with its defaults,
and fails loudly where the search asks what the test did not script."""
from __future__ import annotations

from typing import Any

from autotune.measure import Interval, Noise, PairedMeasurer
from autotune.trial.spec import TrialResult


class StubMeasurer(PairedMeasurer):
    """Only what a test scripts is asked of it: the rest raises (``close`` ends nothing)."""

    def __init__(self, defaults: dict[str, Any] | None = None) -> None:
        super().__init__(dict(defaults or {}))

    def calibrate(self, timeout_s: float) -> Noise:
        raise AssertionError("not scripted: calibrate")

    def begin(self, params: dict[str, Any], timeout_s: float) -> object | TrialResult:
        raise AssertionError("not scripted: begin")

    def more(self, handle: object, n: int, timeout_s: float, confidence: float = 0.95) -> Interval:
        raise AssertionError("not scripted: more")

    def end(self, handle: object) -> TrialResult:
        raise AssertionError("not scripted: end")

    def close(self) -> None:
        pass
