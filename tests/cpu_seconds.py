"""Each test's CPU seconds, its own and its reaped children's (the trials and workers it started), beside its wall
seconds: ``make test PYTEST_ARGS="-p tests.cpu_seconds"``. On 2 cores the suite is CPU-bound, so a test pays for
itself in CPU seconds, which ``--durations`` (wall) does not show: a test that sleeps costs the others nothing. One
file per pytest process under ``$CPU_SECONDS_DIR`` (default ``/tmp/cpu-seconds``): ``CPU WALL NODEID`` lines."""
from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _file() -> Path:
    folder = Path(os.environ.get("CPU_SECONDS_DIR", "/tmp/cpu-seconds"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.tsv"


def pytest_sessionstart(session: pytest.Session) -> None:
    """A run's own figures: the file this process writes starts empty."""
    _file().write_text("")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    cpu, wall = _cpu_s(), time.monotonic()
    yield
    with open(_file(), "a") as f:
        f.write(f"{_cpu_s() - cpu:.2f}\t{time.monotonic() - wall:.2f}\t{item.nodeid}\n")
