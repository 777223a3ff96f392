"""Real trial subprocesses: what runs in them, and how every kind of failure is recorded."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from autotune.search_spaces import SpaceContext, defaults
from autotune.trial import run_trial

FAULTY = "tests.faulty_workloads"


def _params(facts, **changes):
    params = {**defaults(facts, SpaceContext(default_batch_size=32)), "device": "cpu", "reference_batch": 32}
    return {**params, **changes}


@pytest.fixture(scope="module")
def tiny_twice(facts, fast_settings, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two trials of ``tiny`` with the same params and seed, shared by the tests of what an ok trial reports
    (each trial process pays torch's start: ~3 s of CPU). The first inherits ``OMP_NUM_THREADS=7``; the second
    starts where a dead search, a live one, another host's and one being created left their trial directories
    (``kill -9`` runs no clean-up: the directory stays until the next trial on this host)."""
    import json

    from autotune.trial import lock

    params = _params(facts, threads=1, interop_threads=1, batch_size=16, channels_last=True)
    windows: list[tuple[int, float]] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "7")
        first = run_trial("tiny", params, facts, fast_settings, timeout_s=120,
                          on_window=lambda i, s: windows.append((i, s)) or False)
    folder = tmp_path_factory.mktemp("trial-directories")
    dead = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead_owner = lock.owner(dead.pid)
    dead.kill()
    dead.wait()
    owners = {"dead": dead_owner, "alive": lock.owner(), "other-host": {**dead_owner, "host": "elsewhere/boot"}}
    for name, owner in owners.items():
        (folder / f"autotune-trial-{name}").mkdir()
        (folder / f"autotune-trial-{name}" / "owner.json").write_text(json.dumps(owner))
    (folder / "autotune-trial-no-owner").mkdir()  # being created by another search: not ours to judge
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tempfile, "tempdir", str(folder))  # where run_trial makes its directory
        second = run_trial("tiny", params, facts, fast_settings, timeout_s=120)
    left = sorted(p.name for p in folder.iterdir())
    return {"first": first, "second": second, "windows": windows, "left": left}


def test_ok_trial_reports_throughput_loss_and_settings_in_effect(tiny_twice, fast_settings) -> None:
    result, windows = tiny_twice["first"], tiny_twice["windows"]
    assert result.status == "ok", result.log_tail
    assert result.samples_per_s > 0 and result.objective > 0 and result.loss > 0
    assert len(result.windows) == fast_settings.windows and [i for i, _ in windows] == [0, 1]
    assert result.in_effect["threads"] == 1 and result.startup_s > 0 and result.compile_s >= 0


def test_same_seed_same_loss(tiny_twice) -> None:
    first, second = tiny_twice["first"], tiny_twice["second"]
    assert first.status == second.status == "ok", (first.log_tail, second.log_tail)
    assert first.loss == pytest.approx(second.loss, rel=1e-5)


def test_inherited_thread_variables_do_not_leak_into_the_baseline(tiny_twice) -> None:
    assert tiny_twice["first"].in_effect["env"]["OMP_NUM_THREADS"] == "1"  # inherited 7


def test_the_next_trial_removes_directories_left_by_a_dead_search(tiny_twice) -> None:
    assert tiny_twice["second"].status == "ok", tiny_twice["second"].log_tail
    assert tiny_twice["left"] == ["autotune-trial-alive", "autotune-trial-no-owner", "autotune-trial-other-host"]


def test_amp_in_effect_is_none_where_the_model_has_no_4d_tensors(tiny_twice) -> None:
    result = tiny_twice["first"]  # channels_last asked
    assert result.status == "ok", result.log_tail
    assert result.in_effect["amp"]["channels_last_parameters"] is None  # an MLP: nothing to lay out


@pytest.fixture
def no_process_left() -> Any:
    """Watches every descendant of this test process (trial, DataLoader workers, torchrun ranks, watchdog)
    while the test runs; after it, none may be alive. Yields ``{pid: command line}`` of those seen."""
    import psutil

    me, stop = psutil.Process(), threading.Event()
    before = {child.pid for child in me.children(recursive=True)}  # not this test's (session fixtures')
    processes: dict[int, psutil.Process] = {}
    seen: dict[int, str] = {}

    def watch() -> None:
        while not stop.is_set():
            try:
                children = me.children(recursive=True)
            except psutil.Error:  # one of them ended while being listed: list again
                continue
            for child in (c for c in children if c.pid not in before):
                try:  # read again while it lives: a child is a copy of this test until it calls exec
                    cmdline = " ".join(child.cmdline())
                except psutil.Error:
                    continue
                if cmdline or child.pid not in seen:  # a killed child's zombie has an empty cmdline: keep the last
                    seen[child.pid] = cmdline
                processes.setdefault(child.pid, child)
            stop.wait(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    yield seen  # filled in as the test runs
    stop.set()
    watcher.join()

    def alive(process: psutil.Process) -> bool:
        try:
            return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    assert [seen[pid] for pid, process in processes.items() if alive(process)] == []


@pytest.fixture
def no_file_left(monkeypatch) -> Any:
    """A temporary directory for the test's trials (short: trials put sockets under it); after the test, a
    trial must have left nothing in it, however it ended. Under ``SHORT_TMPDIR``: below a TMPDIR of 10 characters
    and pytest-xdist's worker folder a trial's own directory is too long for a socket, and the trial keeps the
    inherited one (``_private_tmpdir``; its own test below)."""
    import shutil
    import tempfile

    from autotune.trial.runner import SHORT_TMPDIR

    root = Path(tempfile.mkdtemp(dir=SHORT_TMPDIR))
    monkeypatch.setenv("TMPDIR", str(root))  # the trial processes'
    monkeypatch.setattr(tempfile, "tempdir", str(root))  # run_trial's, in this process
    yield root
    left = sorted(path.name for path in root.iterdir())
    shutil.rmtree(root)
    assert left == []


def _trial_processes(seen: dict[int, str]) -> int:
    return sum("autotune.trial.child" in cmdline for cmdline in seen.values())


@pytest.mark.parametrize(
    ("workload", "status", "error"),
    [
        (f"{FAULTY}:crash", "crash", "ValueError: fake: the user's loss has a bug"),  # a Python exception
        (f"{FAULTY}:aborts", "crash", "killed by SIGABRT"),  # os.abort(): a failed assertion in native code
        (f"{FAULTY}:segfaults", "crash", "killed by SIGSEGV"),
        (f"{FAULTY}:nan", "nan", "the loss became nan"),
        (f"{FAULTY}:oom", "oom", "OutOfMemoryError"),
        (f"{FAULTY}:killed", "oom", "SIGKILL"),  # the kernel's out-of-memory killer
        ("nosuch_workload", "crash", "UsageError"),
    ],
)
def test_failures_are_classified(facts, fast_settings, no_process_left, no_file_left, workload, status, error) -> None:
    result = run_trial(workload, _params(facts, batch_size=64), facts, fast_settings, timeout_s=120)
    assert result.status == status
    assert error in result.error
    assert result.samples_per_s is None


def test_a_dead_dataloader_worker_fails_the_trial(facts, fast_settings, no_process_left, no_file_left) -> None:
    params = _params(facts, threads=1, num_workers=1, prefetch_factor=2, persistent_workers=True)
    result = run_trial(f"{FAULTY}:kills_its_dataloader_workers", params, facts, fast_settings, timeout_s=120)
    assert result.status == "crash" and "DataLoader worker" in result.error, result.error
    assert result.wall_s < 60  # found out by the DataLoader, not by the time limit


def test_hang_is_stopped_at_the_time_limit_with_its_whole_tree(facts, fast_settings, no_process_left,
                                                               no_file_left) -> None:
    params = _params(facts, num_workers=1, prefetch_factor=2)  # a DataLoader worker: a grandchild to stop too
    # 12 s: within 8, a loaded 2-vCPU Zen 3 had not yet started the DataLoader worker (5e2eeee failed so there)
    result = run_trial(f"{FAULTY}:hang", params, facts, fast_settings, timeout_s=12)
    assert result.status == "timeout" and 12 <= result.wall_s < 34
    assert _trial_processes(no_process_left) >= 2  # the trial and its worker (a fork: the same command line)


def test_a_rank_killed_in_a_two_process_trial_fails_it_at_once(facts, fast_settings, no_process_left,
                                                               no_file_left) -> None:
    from autotune import search_spaces as spaces

    if "gloo" not in spaces.processes._backends(facts) or (facts.cpu.allowed.cores or 0) < 2:
        pytest.skip("needs 2 allowed cores and gloo")
    params = _params(facts, threads=2, interop_threads=1, processes=2)
    result = run_trial(f"{FAULTY}:killed_on_rank_1", params, facts, fast_settings, timeout_s=120)
    assert result.status == "crash" and result.samples_per_s is None
    assert result.wall_s < 60  # rank 0, waiting on the dead rank, was stopped: no time-limit wait
    assert _trial_processes(no_process_left) >= 3  # torchrun and its two ranks


def test_pruning_stops_the_trial(facts, fast_settings) -> None:
    # windows of 400 tiny steps (0.4-1 s): at 40 steps the child wrote all four windows and ended between two of
    # the parent's looks (50 ms) beside another test run, and finished whole (status ok); at 1,000 the child's
    # first window and the stop cost 12 s of CPU beside two test runs
    settings = replace(fast_settings, measure_steps=4000, windows=10)
    result = run_trial("tiny", _params(facts), facts, settings, timeout_s=120, on_window=lambda i, s: i >= 0)
    assert result.status == "pruned"


@pytest.mark.parametrize(("channels_last", "amp_dtype"), [(False, "float32"), (True, "float32"), (True, "bfloat16")])
def test_amp_and_memory_format_are_reported_as_the_trial_ran_them(facts, fast_settings, channels_last,
                                                                  amp_dtype) -> None:
    """What the trial's first training step ran with, seen in the trial process, not the params echoed back."""
    from autotune.search_spaces import amp

    if amp_dtype not in amp.dtypes(facts, SpaceContext(conv=True)):
        pytest.skip(f"this CPU computes no {amp_dtype} natively (probe: no avx512_bf16/amx_bf16 in {facts.cpu.isa})")
    params = _params(facts, threads=1, interop_threads=1, channels_last=channels_last, amp_dtype=amp_dtype)
    result = run_trial("cnn", params, facts, fast_settings, timeout_s=180)
    assert result.status == "ok", result.log_tail
    assert result.in_effect["amp"] == {
        "autocast": None if amp_dtype == "float32" else amp_dtype,
        "output_dtype": amp_dtype,  # the CNN ends in a Linear layer: computed in the autocast dtype
        "channels_last_parameters": channels_last,
        "channels_last_inputs": channels_last,
    }
    assert result.in_effect["tf32"]["matmul"] is False  # a CPU trial never asks for TF32


def test_a_stopped_tree_is_gone_when_stop_tree_returns(tmp_path: Path) -> None:
    """A descendant that takes a while to end after its signal (here: freeing 2 GB it touched; seen on a loaded
    machine: a DataLoader worker) is waited for, not left ending after its parent was reaped."""
    import psutil

    from autotune.trial import launch

    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            "'import time; b = bytes(1) * (2 << 30); time.sleep(600)']); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        parent = psutil.Process(proc.pid)
        deadline = time.monotonic() + 60
        while not (kids := parent.children()) or kids[0].memory_info().rss < 2 << 30:
            assert time.monotonic() < deadline, "the descendant did not touch its 2 GB in 60 s"
            time.sleep(0.1)
        launch.stop_tree(proc, grace_s=0.5)
        assert proc.poll() is not None
        with contextlib.suppress(psutil.NoSuchProcess):
            assert kids[0].status() == psutil.STATUS_ZOMBIE, kids[0].status()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.parametrize("inherited", ["short", "long"])
def test_a_trial_gets_a_temporary_directory_where_multiprocessing_can_open_a_socket(tmp_path, inherited) -> None:
    """A DataLoader worker shares its batches through an AF_UNIX socket in TMPDIR (file_descriptor strategy).
    Under a deep trial directory and a deep inherited TMPDIR (pytest-xdist's tmp_path below a test's own host
    folder: 76 characters) the socket's path was over the kernel's limit and the trial waited for its first
    batch until its time ran out: the temporary directory a trial is given must hold one."""
    from autotune.trial.runner import _private_tmpdir

    work = tmp_path / ("w" * 80) / "autotune-trial-xxxxxxxx"
    work.mkdir(parents=True)
    home = tmp_path / ("h" * 80) if inherited == "long" else Path(tempfile.mkdtemp(dir="/tmp"))
    home.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(home)}
    try:
        _private_tmpdir(env, work)
        listen = "from multiprocessing.connection import Listener; Listener(family='AF_UNIX').close()"
        done = subprocess.run([sys.executable, "-c", listen], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert env["TMPDIR"] == (str(home) if inherited == "short" else "/tmp")
    finally:
        if inherited == "short":
            shutil.rmtree(home)
