"""What a search measures of the machine before its trials (``autotune.study.machine``): a GPU's kernels and limits
are measured in a child process, which a hung driver never lets return; within a search, its budget bounds it."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from autotune import probes
from autotune.probes import _child
from autotune.study import Budget, machine

from ..conftest import alive


def test_a_probes_child_gets_a_share_of_the_budget_left() -> None:
    clock = [0.0]
    timing = Budget.start(120, clock=lambda: clock[0])
    assert machine.child_s(timing) == machine.CHILD_LEAST_S  # never less than a child's start needs
    timing = Budget.start(600, clock=lambda: clock[0])
    assert machine.child_s(timing) == pytest.approx(120.0)  # a fifth of 10 minutes
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
    assert "the kernels' speeds were not measured (measuring the kernels' speeds took over 1 s: stopped)" \
        in caplog.text, caplog.text
    assert not list(tmp_path.iterdir())
    with pytest.raises(RuntimeError, match="measuring the GPU's limits took over 1 s"):  # the same limit
        probes.limits(facts, "cuda", tmp_path, in_child=True, timeout_s=1.0)


def test_a_child_is_killed_with_its_process_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A child's own children (a driver's helpers) go with it: killed as a group, none outlives the limit."""
    pid_file = tmp_path / "grandchild"
    monkeypatch.setattr(_child, "_CHILD", "import subprocess, sys, time; "
                        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    with pytest.raises(RuntimeError, match="took over 1 s"):
        _child.call_in_child("x:y", what="a test", timeout_s=1.0)
    grandchild = int(pid_file.read_text())
    for _ in range(50):
        if not alive(grandchild):
            break
        time.sleep(0.1)
    assert not alive(grandchild)
