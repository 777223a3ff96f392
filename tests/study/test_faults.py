"""A search stopped by Ctrl-C or killed outright, or meeting trials that fail: nothing lost, nothing left
running, and it continues."""
from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import optuna
import psutil
import pytest

from autotune.probes import Facts

from ..conftest import REPO, SLEEPY
from .conftest import BUDGET_S, SEARCH_ALONE, own_host, running_trial, search_here, start_search, trials, wait_for

FAULTY = REPO / "tests" / "faulty_workloads.py"
# SLEEPY's first seed (channels_last, or autocast where bfloat16 measured fast) comes right after the baseline on
# every CPU, slower with confidence (``faulty_workloads.sleepy``), and a busy neighbour hardly stretches its search.
# QUICK's --budget 10m (the Ctrl-C test's 1m after it): a search stops by itself then, so no wait on one is
# longer. Waits are on what a search prints or records; the first is bounded by this, later ones by what the first
# measured (the machine's speed and load).
SEARCH_S = BUDGET_S + 60  # a whole search: its budget, then its report
BASELINE = r"^trial +0 baseline "  # its line when recorded (``finished_line``)


class Watched:
    """A search started in the background whose output is read as it comes (a thread per stream): a test
    waits for a line it prints, and fails at once with its stderr if it ends first. ``stop`` ends it and its
    trial processes whatever happened: a failing test does not leave its search running."""

    def __init__(self, *args: str, cwd: Path, env: dict[str, str] | None = None) -> None:
        self.proc = start_search(*args, cwd=cwd, env=env)
        self.started = time.monotonic()
        self.out: list[str] = []
        self.err: list[str] = []
        self._new = threading.Condition()
        self._readers = [threading.Thread(target=self._read, args=(stream, into), daemon=True)
                         for stream, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: IO[str], into: list[str]) -> None:
        for line in stream:
            with self._new:
                into.append(line)
                self._new.notify_all()
        with self._new:
            self._new.notify_all()

    def wait_line(self, pattern: str, timeout: float, what: str) -> float:
        """Seconds since the start, once a line of stdout matches ``pattern``."""
        regex, seen, deadline = re.compile(pattern), 0, time.monotonic() + timeout
        with self._new:
            while True:
                if any(regex.search(line) for line in self.out[seen:]):
                    return time.monotonic() - self.started
                seen = len(self.out)
                if not self._readers[0].is_alive():  # its stdout closed: it ended
                    raise AssertionError(f"the search ended before {what}:\n{''.join(self.out)}{''.join(self.err)}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}:\n{''.join(self.out)}")
                self._new.wait(min(left, 1.0))

    def communicate(self, timeout: float) -> tuple[str, str]:
        self.proc.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=30)
        return "".join(self.out), "".join(self.err)

    def interrupt(self, timeout: float, sig: int = signal.SIGINT) -> tuple[str, str]:
        self.proc.send_signal(sig)
        return self.communicate(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                tree = psutil.Process(self.proc.pid).children(recursive=True)
            except psutil.Error:
                tree = []
            self.proc.kill()
            for process in tree:
                with contextlib.suppress(psutil.Error):
                    process.kill()
        self.communicate(timeout=60)


@contextlib.contextmanager
def watched(*args: str, cwd: Path, env: dict[str, str] | None = None) -> Iterator[Watched]:
    search = Watched(*args, cwd=cwd, env=env)
    try:
        yield search
    finally:
        search.stop()


def _roles(ts: list, state: str | None = None) -> list[str]:
    return [t.user_attrs.get("role") for t in ts if state is None or t.state.name == state]


def test_ctrl_c_records_the_running_trial_and_the_same_command_continues(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path}/studies.db"
    # A minute, after QUICK's 10 (the last --budget counts): the calibration and the seed's first look sized for it
    # (6 A/A pairs, 4 in the first look, against 16 and up to 32), 15 s less of the suite; the seed still gets its
    # first look, its stall and its SIGTERM come 20-25 s in.
    args = ("--workload", SLEEPY, "--study", "s", "--trials", "2", "--confirm", "1", "--confirm-rounds", "1",
            "--budget", "1m")
    # The seed (trial 1) stalls while the flag file exists (``faulty_workloads.sleepy``): Ctrl-C finds it running.
    stall = tmp_path / "stall"
    stall.touch()
    env = {**own_host(tmp_path), "AUTOTUNE_TEST_STALL": str(stall)}
    with watched(*args, cwd=tmp_path, env=env) as first:
        baseline_s = first.wait_line(BASELINE, BUDGET_S, "the baseline to be recorded")
        # Trial 1 comes right after the baseline: a limit as long as the search took to get there.
        patience = max(30.0, baseline_s)
        first.wait_line(r"\] trial 1 \S+ started", patience, "trial 1 to start")
        wait_for(running_trial(storage, "s", 1), patience, "trial 1 to be measured")
        # SIGTERM (a scheduler's, ``timeout``'s) ends it as Ctrl-C does (script mode's test sends SIGINT); Python's
        # default ended it at once, the trial left running
        out, err = first.interrupt(timeout=patience, sig=signal.SIGTERM)
    assert first.proc.returncode == 143, err  # 128 + SIGTERM, as a shell reports it
    assert "interrupted; everything recorded so far is kept" in err
    before = trials(storage, "s")
    assert [(t.number, t.state.name) for t in before] == [(0, "COMPLETE"), (1, "FAIL")]
    assert before[1].user_attrs["status"] == "interrupted" and before[1].user_attrs["role"] == "seed"
    assert "run_ended" in before[1].user_attrs  # the trial was stopped and recorded, not abandoned

    stall.unlink()
    with watched(*args, cwd=tmp_path, env=env) as second:  # a calibration, a trial, a confirmation if it could win
        out, err = second.communicate(timeout=SEARCH_S)
    assert second.proc.returncode == 0, err
    assert "(continued)" in out
    after = trials(storage, "s")
    assert [t.state.name for t in after[:2]] == ["COMPLETE", "FAIL"]  # the first run's record is kept as it was
    assert _roles(after, "COMPLETE").count("baseline") == 1  # measured once, by the first run
    # The interrupted seed was measured again; --trials 2 counts the study's trials, so nothing more.
    searched = [t for t in after if t.user_attrs.get("role") != "confirm" and t.state.name == "COMPLETE"]
    assert [t.user_attrs["role"] for t in searched] == ["baseline", "seed"]
    assert [t.number for t in searched] == [0, 2]
    assert searched[1].user_attrs["params"] == before[1].user_attrs["params"]
    # Then the confirmation: the candidate measured again with fresh pairs (if the guard let it through).
    # A candidate slower with confidence (bf16 autocast on a tiny MLP read 0.71x; sleepy's seed, always) is not
    # confirmed.
    confirms = [t for t in after if t.user_attrs.get("role") == "confirm"]
    margin = optuna.load_study(study_name="s", storage=storage).user_attrs["noise"]["margin"]
    could_win = "infeasible" not in searched[1].user_attrs and searched[1].user_attrs["speedup_high"] >= 1 + margin
    assert [t.user_attrs["confirms"] for t in confirms] == ([2] if could_win else [])
    assert all(t.user_attrs["params"] == after[t.user_attrs["confirms"]].user_attrs["params"] for t in confirms)
    assert "speedup over PyTorch defaults" in out, out
    assert "noise: identical arms in one process differed by up to" in out, out


def test_kill_9_leaves_no_process_and_the_next_search_fails_the_stale_trial_and_removes_its_directory(
        tmp_path: Path, own_temp: Path, facts: Facts, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both searches run ``search()`` as ``autotune search`` does (``search_here``), the first in a process of its
    own that the test kills: the CLI is not the subject (the Ctrl-C test's searches are the CLI's)."""
    storage = f"sqlite:///{tmp_path}/studies.db"
    # DataLoader workers in every trial but the baseline: grandchildren of the search to be cleaned up. The seed
    # (trial 1) stalls while the flag file exists (``faulty_workloads.sleepy``), so the kill finds the whole tree.
    stall = tmp_path / "stall"
    stall.touch()
    monkeypatch.setenv("AUTOTUNE_TEST_STALL", str(stall))
    workers = {"num_workers": 1, "prefetch_factor": 2, "persistent_workers": True}
    log = tmp_path / "first.log"
    with log.open("w") as out:
        options = {"storage": storage, "study": "k", "trials": 2, "confirm_top": 0, "fixed": workers}
        first = subprocess.Popen([sys.executable, "-c", SEARCH_ALONE, SLEEPY, json.dumps(options)],
                                 cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    try:
        started = time.monotonic()
        # QUICK's budget: the search stops by itself then, so no wait is longer; it fails at once if the search ends.
        wait_for(running_trial(storage, "k", 1), BUDGET_S, "trial 1 to be measured", search=first, log=log)
        search = psutil.Process(first.pid)

        def trial_tree() -> list[psutil.Process]:
            kids = search.children(recursive=True)
            worker = [p for p in kids if "autotune.measure.worker" in " ".join(p.cmdline())]
            return kids if worker and worker[0].children() else []  # the paired worker and its arm's DataLoader worker

        # Its DataLoader worker starts right after: a limit as long as the search took to get here.
        tree = wait_for(trial_tree, max(30.0, time.monotonic() - started),
                        "the trial's DataLoader worker to start", search=first, log=log)
    finally:
        first.kill()
        first.wait(timeout=30)
    gone, alive = psutil.wait_procs(tree, timeout=5)
    assert alive == [], [p.cmdline() for p in alive]
    stale = trials(storage, "k")[1]
    assert stale.state.name == "RUNNING"  # nobody could record it: the next search must
    left = list(own_temp.glob("autotune-trial-*"))
    assert len(left) == 1 and (left[0] / "spec.json").exists()  # nor remove the trial's directory

    stall.unlink()
    outcome = search_here(SLEEPY, facts, **options)
    after = trials(storage, "k")
    assert after[1].state.name == "FAIL" and after[1].user_attrs["status"] == "interrupted"
    assert "died" in after[1].user_attrs["error"]
    assert [(t.user_attrs["role"], t.state.name) for t in after[2:]] == [(after[1].user_attrs["role"], "COMPLETE")]
    assert after[2].user_attrs["params"]["num_workers"] == 1
    assert outcome.stopped == "trials" and outcome.recipe.id == 1  # stored
    assert list(own_temp.glob("autotune-trial-*")) == []  # the dead search's directory and the second's own
    survivors = [p for p in psutil.process_iter(["cmdline"]) if str(own_temp) in " ".join(p.info["cmdline"] or [])]
    assert survivors == []  # no trial process of either search (their command lines name their spec in temp)


def test_each_fault_of_a_trial_is_recorded_with_its_reason_and_the_search_goes_on(
        tmp_path: Path, own_temp: Path, facts: Facts, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each way a candidate's arm fails in the defaults' worker, once: an exception in the user's code and a NaN
    loss (the arm fails, its worker goes on), a worker killed by a signal (a crash named by its signal: SIGSEGV
    takes the same path as SIGABRT here, and a trial process's SIGSEGV is named in
    tests/trial/test_runner.py::test_failures_are_classified) and by SIGKILL (out of memory), after which the
    search starts another worker. The search runs in this process (``search_here``): the CLI is not the subject."""
    storage = f"sqlite:///{tmp_path}/studies.db"
    # One fault per model trained, in order (tests/faulty_workloads.py:scripted): the defaults' arm and its A/A copy
    # (the baseline), then each candidate's arm in the defaults' worker; a worker that died is started again for the
    # next candidate, with a defaults arm of its own ("ok"). The environment is held at the defaults' (fixed).
    script = tmp_path / "faults.json"
    script.write_text(json.dumps(["ok", "ok", "crash", "abort", "ok", "nan", "killed"]))
    monkeypatch.setenv("AUTOTUNE_TEST_FAULTS", str(script))
    # the quality guard's second look (near its limit) trains models of its own, which would meet the script's
    # faults: a limit no candidate's loss comes near keeps it out
    outcome = search_here(f"{FAULTY}:scripted", facts, storage=storage, study="f", trials=5, confirm_top=0,
                          max_loss_increase=100.0)
    assert outcome.stopped == "trials"  # it went on to its last trial
    assert json.loads(script.read_text()) == []  # every fault was met by a trial
    # Optuna's state is the loop's business (nan and oom: infeasible, so the sampler learns); the status and
    # the reason are what the report shows.
    recorded = [(t.user_attrs["status"], t.user_attrs.get("error") or "") for t in trials(storage, "f")]
    expected = [("ok", ""), ("crash", "ValueError: fake: the user's loss has a bug"), ("crash", "killed by SIGABRT"),
                ("nan", "the loss became nan"), ("oom", "killed by SIGKILL")]
    assert [status for status, _ in recorded] == [status for status, _ in expected], recorded
    for (_, error), (_, reason) in zip(recorded, expected, strict=True):
        assert reason in error
