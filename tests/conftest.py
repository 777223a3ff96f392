"""Shared fixtures: the live machine's facts, fast trial settings, the CLI in a subprocess, a real PostgreSQL."""
from __future__ import annotations

import fcntl
import functools
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
PG_ROOT = Path("/usr/lib/postgresql")  # Debian's postgresql package: one VERSION/bin per installed server


def _memory_temp(root: Path = Path("/dev/shm"), room: int = 2 * 2**30) -> Path | None:
    """``root`` where it is a file system in memory this user may write and run files in (a test runs the scripts
    it writes), with ``room`` bytes free; else None."""
    try:
        fs, mounts = os.statvfs(root), Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    in_memory = any(line.split()[1:3] == [str(root), "tmpfs"] for line in mounts)
    usable = not fs.f_flag & (os.ST_RDONLY | os.ST_NOEXEC) and os.access(root, os.W_OK | os.X_OK)
    return root if in_memory and usable and fs.f_bavail * fs.f_frsize >= room else None


def pytest_configure(config: pytest.Config) -> None:
    """The Ctrl-C tests send SIGINT to the processes they start, as a terminal would. A runner started in the
    background without job control (``nohup ... &``, some CI agents) starts pytest with SIGINT ignored, and an
    ignored signal stays ignored in every child: their Ctrl-C did nothing (the dashboard ran on, the search
    finished with exit 0). A handled signal is reset to its default in a child, so pytest handles it."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # The tests' folders in memory where the machine has room: a scripted search's SQLite commits each wait for the
    # disk (docs/contributing.md). A TMPDIR already set is the runner's choice; pytest-xdist's workers inherit it.
    fast = _memory_temp()
    if not os.environ.get("PYTEST_XDIST_WORKER") and "TMPDIR" not in os.environ and fast is not None:
        os.environ["TMPDIR"] = str(fast)
        tempfile.tempdir = None
    # Under pytest-xdist each worker gets a temporary directory of its own, and with it its own host lock
    # (autotune.trial.lock): the workers' searches run side by side as the tests' subjects, each its own host.
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        temp = tempfile.mkdtemp(prefix=f"autotune-tests-{worker}-")
        os.chmod(temp, 0o755)  # the PostgreSQL server's user reaches its data folder in it
        os.environ["TMPDIR"] = temp
        tempfile.tempdir = None
        # xdist gives its workers a terminal's COLUMNS=80 and LINES=24; the CLI's tables are wrapped by them,
        # and the tests read them as a pipe (120 columns) as when pytest runs alone.
        for name in ("COLUMNS", "LINES"):
            os.environ.pop(name, None)
    # The kernels' measured speeds (``probes.measured``) are cached in the test run's folder, not the user's.
    os.environ["AUTOTUNE_CACHE"] = str(Path(tempfile.gettempdir()) / "autotune-cache")
    # GNU OpenMP's threads wait at a barrier by sleeping, not spinning, in every process the tests start (a
    # variable no knob sets, so trials keep it): two threads of a sleep-bound fixture spun 0.37 of a CPU where
    # they slept at 0.05, on the 2 CPUs the suite's three processes share.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# The files that take longest, run first: pytest-xdist's --dist loadfile hands out whole files in collection order,
# and collected in folder order a long file that came last ran alone at the end. Their seconds summed over their
# tests in two runs of the whole suite (three processes, 2-vCPU Zen 4, 2026-11-29): 147, 95, 88, 81, 73, 68, 65,
# 64, 54, 39, 33, 31, 31, 28, 27, 27, 25, 22; the rest take 17 s or less each.
LONGEST_FILES = ("study/test_script_mode.py", "test_end_to_end.py", "study/test_faults.py", "study/test_hopeless.py",
                 "trial/test_runner.py", "measure/test_live.py", "study/test_workers.py", "study/test_race.py",
                 "measure/test_arms.py", "search_spaces/test_processes.py", "test_run_apply.py",
                 "measure/test_process_pair.py", "study/test_inputs.py", "test_imports.py", "measure/test_script.py",
                 "test_read_while_searching.py", "cli/test_search_progress.py", "test_replay_search.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.path.relative_to(REPO / "tests").as_posix()
        return LONGEST_FILES.index(path) if path in LONGEST_FILES else len(LONGEST_FILES)

    items.sort(key=rank)  # stable: each file's tests, and the other files, keep their order


def pytest_unconfigure(config: pytest.Config) -> None:
    worker_tmp = os.environ.get("TMPDIR", "")
    if os.environ.get("PYTEST_XDIST_WORKER") and "autotune-tests-" in worker_tmp:
        shutil.rmtree(worker_tmp, ignore_errors=True)


def missing(reason: str) -> NoReturn:
    """A test that needs what ``tests/system-deps.sh`` or ``pip install -e '.[test]'`` installs, and finds it
    missing: a skip with the reason on a developer's machine; under CI (``CI=true``), where the install step
    ran, a failure, so that a broken install step cannot turn tests into skips unnoticed."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: the install step should have provided it)", pytrace=False)
    pytest.skip(reason)


def needs_module(name: str, reason: str) -> Any:
    """``pytest.importorskip`` for a package of the test extra: a failure under CI (``missing``)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        missing(reason)


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs: not gone, nor a zombie its parent has not reaped."""
    from autotune.measure import freeze

    return freeze.proc_state(pid) not in ("?", "Z")


def _children() -> dict[int, psutil.Process]:
    found: dict[int, psutil.Process] = {}
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                found[child.pid] = child
        except psutil.Error:
            pass
    return found


@pytest.fixture(autouse=True)
def _leaves_no_process() -> Iterator[None]:
    """Every test stops what it started: a process of its own still alive 5 s after it ends (a trial worker,
    a watchdog whose tree was never stopped) fails it here, not a later test that happens to look.
    Session fixtures' processes (the PostgreSQL server) started before the test and are not counted."""
    before = set(_children())
    yield
    deadline = time.monotonic() + 5
    while True:
        left = {pid: p for pid, p in _children().items() if pid not in before}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    lines = []
    for process in left.values():
        try:
            lines.append(" ".join(process.cmdline()))
        except psutil.Error:
            continue
    if lines:
        for process in left.values():  # so the next test starts clean
            try:
                process.kill()
            except psutil.Error:
                pass
        pytest.fail(f"the test left processes running: {lines}")


@pytest.fixture(scope="session")
def facts():
    from autotune import probes

    return probes.probe()


@pytest.fixture(scope="session")  # frozen: module fixtures share it
def fast_settings():
    from autotune.trial import TrialSettings

    return TrialSettings(warmup_steps=2, measure_steps=6, windows=2, max_extra_windows=0, eval_samples=128)


def run_cli(
    *args: str, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``autotune ARGS`` in a fresh process, as a user would type it."""
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``autotune ARGS`` through the CLI's ``main()`` in this process (no Python start, no imports again), for
    what a verb reads and prints; ``run_cli`` where the process itself is the subject (the console script, its
    exit status, signals, log lines). Its exit status and output as ``run_cli`` gives them."""
    import contextlib
    import io
    from unittest import mock

    from autotune.cli import main

    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    try:
        with mock.patch.dict(os.environ, env or {}):
            time.tzset()
            os.chdir(cwd)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = main(list(args))
                except SystemExit as e:  # argparse's usage errors and --help
                    code = e.code if isinstance(e.code, int) else 2
    finally:
        os.chdir(here)
        time.tzset()  # the environment is restored by now
    return subprocess.CompletedProcess(["autotune", *args], code, out.getvalue(), err.getvalue())


# No calibration is too wide for a test search whose subject is not the noise (``--busy-limit``): beside another
# test run, six A/A pairs of a sleep-bound workload read [0.54-1.56]. The limit's own test: tests/measure/test_stats.py.
FAST = ("--steps", "6", "--warmup-steps", "2", "--busy-limit", "inf")
# A tiny CNN whose steps are sleep, its channels_last seed slower with confidence (``faulty_workloads.sleepy``).
SLEEPY = f"{REPO / 'tests' / 'faulty_workloads.py'}:sleepy"


@functools.cache
def held_env() -> dict[str, Any]:
    """Every environment-level knob at the defaults' value on this machine: held (``--fix``), every candidate is
    an arm in the defaults' worker, measured in-process (no process pairs, no worker start per environment). For
    searches whose subject is not the environment factor."""
    from autotune import probes
    from autotune import search_spaces as spaces
    from autotune.measure.environment import environment_keys

    defaults = spaces.defaults(probes.probe(), spaces.SpaceContext(default_batch_size=32))
    return {k: defaults[k] for k in environment_keys() if k in defaults}


def defaults_env() -> tuple[str, ...]:
    """``held_env`` as ``--fix`` options of ``autotune search``; a later ``--fix`` overrides."""
    return tuple(arg for k, v in held_env().items() for arg in ("--fix", f"{k}={json.dumps(v)}"))


def pg_bin(root: Path = PG_ROOT) -> Path | None:
    """The server binaries of the highest PostgreSQL installed under ``root`` (``VERSION/bin`` with initdb), or None.

    Versions compare as numbers (``9.6`` < ``15`` < ``16``); a directory that is not a version is ignored.
    """
    found = []
    for initdb in root.glob("*/bin/initdb"):
        version = initdb.parent.parent.name
        if all(part.isdigit() for part in version.split(".")):
            found.append((tuple(int(part) for part in version.split(".")), initdb.parent))
    return max(found)[1] if found else None


def _free_port() -> int:
    from autotune.measure.script.copies import free_port

    return free_port()


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    """A PostgreSQL server (the highest version installed) on loopback for the session, run as the
    unprivileged ``postgres`` user (the server refuses root); its SQLAlchemy URL."""
    bin_dir = pg_bin()
    if bin_dir is None:
        missing(f"PostgreSQL server binaries not found in {PG_ROOT}/*/bin (tests/system-deps.sh installs them)")
    as_postgres: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: cannot start PostgreSQL as an unprivileged user")
        as_postgres = ["runuser", "-u", "postgres", "--"]
    data = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
    if as_postgres:
        shutil.chown(data, "postgres")
    port = _free_port()

    def pg(*cmd: str) -> None:
        subprocess.run([*as_postgres, *cmd], check=True, capture_output=True, timeout=120)

    try:
        pg(str(bin_dir / "initdb"), "-D", str(data / "db"), "-A", "trust", "-U", "postgres")
        pg(str(bin_dir / "pg_ctl"), "-D", str(data / "db"), "-l", str(data / "log"), "-w", "start", "-o",
           f"-h 127.0.0.1 -p {port} -k {data} -c fsync=off")
        pg(str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "autotune")
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/autotune"
    finally:
        subprocess.run([*as_postgres, str(bin_dir / "pg_ctl"), "-D", str(data / "db"), "-m", "immediate", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="session")
def live_search(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One real ``autotune search``, not on a terminal, shared by the tests of what it prints and of the report it
    writes: its folder and its completed process. As short as they allow: the baseline and one candidate (the
    report's per-knob plot), both arms of the defaults' worker (no compile, no DataLoader processes), and a
    one-minute budget, which sizes the calibration and the race (``LiveMeasurer.calibrate``). Its workload's
    steps are sleep (``faulty_workloads.sleepy``): on ``tiny`` two OpenMP threads took 27-33 s of CPU in a 22 s
    search. Under pytest-xdist the files that use it may run in different processes: the first runs it, under a
    lock in their common temporary folder, and the others read what it left (22 s each)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    root = tmp_path_factory.getbasetemp().parent if worker else tmp_path_factory.getbasetemp()
    folder, record = root / "live-search", root / "live-search.json"
    with open(root / "live-search.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held while the first process searches; released when the file closes
        if not record.exists():
            folder.mkdir()
            out = run_cli("search", "--workload", SLEEPY, "--budget", "1m", "--trials", "2", "--confirm", "0",
                          "--no-compile", *defaults_env(), "--fix", "num_workers=0", *FAST, cwd=folder)
            record.write_text(json.dumps([out.returncode, out.stdout, out.stderr]))
        code, stdout, stderr = json.loads(record.read_text())
    assert code == 0, stderr
    return folder, subprocess.CompletedProcess(["autotune", "search"], code, stdout, stderr)
