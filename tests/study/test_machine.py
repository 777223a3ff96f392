"""What a search measures of the machine before its trials (``autotune.study.machine``): a GPU's kernels and limits
are measured in a child process, which a hung driver never lets return; within a search, its budget bounds it."""
from __future__ import annotations

import logging
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from autotune import probes
from autotune.probes import _child
from autotune.study import Budget, machine


def test_a_probes_child_gets_a_share_of_the_budget_left() -> None:
    clock = [0.0]
    timing = Budget.start(120, clock=lambda: clock[0])
    assert machine.child_s(timing) == pytest.approx(24.0)  # a fifth of 2 minutes
    clock[0] = 100.0
    assert machine.child_s(timing) == machine.CHILD_LEAST_S  # never less than a child's start needs
    assert machine.child_s(Budget.start(None)) == probes.CHILD_S  # without a budget, the probes' own limit
    assert machine.child_s(Budget.start(7200)) == probes.CHILD_S


def test_a_hung_childs_kernel_speeds_end_at_the_searchs_limit(facts: Any, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """A child that never answers (a hung GPU driver's) is killed at ``child_s``: the search goes on without the
    kernels' speeds (every precision seeded), and nothing is cached; the probes' own limit was ten minutes a child."""
    monkeypatch.setattr(_child, "_CHILD", "import time; time.sleep(60)")
    monkeypatch.setattr("autotune.probes._measured.cache_dir", lambda: tmp_path)
    monkeypatch.setattr(machine, "CHILD_LEAST_S", 1.0)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="autotune.study.machine"):
        assert machine.kernel_speeds(facts, "cuda", Budget.start(2.0)) is None
    assert time.monotonic() - started < 10.0
    assert "the kernels' speeds were not measured" in caplog.text and "timed out after 1" in caplog.text
    assert not list(tmp_path.iterdir())
    with pytest.raises(subprocess.TimeoutExpired):  # the limits' child takes the same limit
        probes.limits(facts, "cuda", tmp_path, in_child=True, timeout_s=1.0)
