"""Several searches: one study shared through PostgreSQL, other hardware refused, one trial at a time per host."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from itertools import combinations
from pathlib import Path

import pytest

from autotune.store import RecipeStore
from autotune.study.records import MEASURED

from .. import quality_workloads
from ..conftest import REPO
from .conftest import BUDGET_S, SEARCH_ALONE, own_host, running_trial, start_search, trials, wait_for

SLOW = quality_workloads.spec("slow")  # sleep-bound: batch 16 runs a quarter of its default's speed, however busy


def _start(storage: str, study: str, trials: int, env: dict[str, str]) -> subprocess.Popen[str]:
    """A worker: a search of ``SLOW`` in a process of its own (``SEARCH_ALONE``: ``search()`` as ``autotune
    search`` runs it, without the CLI's start and report; the CLI's searches: tests/test_end_to_end.py, its
    one-line refusal: the third worker below), whose every candidate is batch 16 in the defaults' environment: a
    quarter of the defaults' speed, stopped after its first round (4 pairs; ``QuickMeasurer``: given the whole
    budget a busy machine asked 23 a round, and the test took 286 s)."""
    fixed = {"batch_per_rank": 16, "sparsity_pattern": "none"}  # a narrower model sleeps less: pruned, it keeps up
    options = dict(storage=storage, study=study, trials=trials, confirm_top=0, fixed=fixed)
    return subprocess.Popen([sys.executable, "-c", SEARCH_ALONE, SLOW, json.dumps(options)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env})


def _finish(search: subprocess.Popen[str], *others: subprocess.Popen[str]) -> tuple[str, str]:
    """Its output once it ends, within its budget and a minute; if it does not, it and ``others`` are killed,
    so a failing test leaves no search running."""
    try:
        return search.communicate(timeout=BUDGET_S + 60)
    except BaseException:
        _kill(search, *others)
        raise


def _kill(*searches: subprocess.Popen[str]) -> None:
    for proc in searches:
        proc.kill()
        proc.communicate()


def _intervals(ts: list) -> list[tuple[float, float, int]]:
    return [(t.user_attrs["run_started"], t.user_attrs["run_ended"], t.user_attrs["pid"]) for t in ts
            if "run_started" in t.user_attrs]


def _assert_never_concurrent(intervals: list[tuple[float, float, int]]) -> None:
    for (s1, e1, _), (s2, e2, _) in combinations(sorted(intervals), 2):
        assert e1 <= s2 or e2 <= s1, f"trials ran at the same time: {s1:.2f}-{e1:.2f} and {s2:.2f}-{e2:.2f}"


@pytest.mark.postgres
def test_two_workers_share_a_study_and_other_hardware_is_refused(postgres: str, tmp_path: Path) -> None:
    """Beside the two workers, a search of another study in another storage (SQLite) on the same host: the host
    lock is the host's, not a study's, so its trial runs between theirs, never beside one. A third worker of the
    study, started once the study is recorded, is refused: its CPU set differs."""
    host = own_host(tmp_path)
    workers = [_start(postgres, "shared", 3, host) for _ in range(2)]
    other_storage = f"sqlite:///{tmp_path}/other.db"
    other = _start(other_storage, "other", 1, host)
    searches = [*workers, other]

    # A worker with another CPU set (taskset) is the same machine for the fingerprint, but the study refuses it:
    # its trials would be measured on other CPUs. ``autotune search`` itself: its one line and exit status 2.
    third = None
    if len(os.sched_getaffinity(0)) > 1:
        try:
            wait_for(running_trial(postgres, "shared", 0), BUDGET_S, "the shared study's baseline", search=workers[0])
        except BaseException:
            _kill(*searches)
            raise
        cpu = str(min(os.sched_getaffinity(0)))
        third = start_search("--storage", postgres, "--study", "shared", "--workload", SLOW, "--trials", "3",
                             "--confirm", "0", cwd=tmp_path, prefix=("taskset", "-c", cpu), environment=True,
                             env=host)  # one thread
        searches.append(third)
    outputs = [_finish(s, *searches) for s in searches]
    for s, (_out, err) in zip([*workers, other], outputs[:3], strict=True):
        assert s.returncode == 0, err
    ts = trials(postgres, "shared")
    # Measured trials as --trials counts them (a candidate the race stopped early is one); not a sampled repeat
    # of a measured recipe, recorded as a duplicate.
    done = [t for t in ts if t.user_attrs.get("status") in MEASURED]
    assert len(done) == 3, [
        (t.number, t.state.name, t.user_attrs.get("role"), t.user_attrs.get("status"), t.user_attrs.get("error"))
        for t in ts
    ]
    assert [t.user_attrs["role"] for t in done].count("baseline") == 1
    assert {t.user_attrs["pid"] for t in done} == {w.pid for w in workers}  # both contributed
    others = _intervals(trials(other_storage, "other"))
    assert [pid for _, _, pid in others] == [other.pid]  # its baseline
    _assert_never_concurrent(_intervals(ts) + others)  # one host: the host lock serialises them, whatever their study
    with RecipeStore.open(postgres) as store:
        assert store.latest(study="shared") is not None

    if third is None:
        pytest.skip("one CPU: no smaller CPU set to start a worker with other hardware")
    assert third.returncode == 2
    lines = outputs[3][1].strip().splitlines()
    assert len(lines) == 1 and "was measured on hardware" in lines[0] and "use another --study" in lines[0], lines
    assert third.pid not in {t.user_attrs.get("pid") for t in ts}  # it ran nothing


@pytest.mark.postgres
def test_workers_starting_together_on_an_empty_database_all_open_it(postgres: str) -> None:
    """The first start creates Optuna's tables and the recipes table; workers racing to do it must not fail
    (duplicate type or table)."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(postgres, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(sqlalchemy.text("CREATE DATABASE race"))
    engine.dispose()
    url = postgres.rsplit("/", 1)[0] + "/race"
    code = ("import sys; from autotune.study.driver import rdb_storage; from autotune.store import RecipeStore; "
            "RecipeStore.open(sys.argv[1]).__exit__(); rdb_storage(sys.argv[1])")
    starts = [subprocess.Popen([sys.executable, "-c", code, url], stderr=subprocess.PIPE, text=True) for _ in range(6)]
    for start in starts:
        _, err = start.communicate(timeout=120)
        assert start.returncode == 0, err
