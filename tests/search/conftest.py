"""Searches as users run them (``autotune search`` subprocesses), their studies, and a real PostgreSQL."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ..conftest import FAST

PG_BIN = Path("/usr/lib/postgresql/15/bin")
# Quick trials: the tiny MLP, no DataLoader processes or torchrun ranks unless a test asks for them.
QUICK = (*FAST, "--workload", "tiny", "--budget", "10m", "--fix", "processes=1")


def start_search(*args: str, cwd: Path, prefix: tuple[str, ...] = (),
                 env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``autotune search ARGS`` started in the background, as a user would in a terminal."""
    return subprocess.Popen([*prefix, sys.executable, "-m", "autotune", "search", *QUICK, *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def trials(storage: str, study: str) -> list:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = condition()
        except Exception:  # noqa: BLE001 - the study may not exist yet
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def running_trial(storage: str, study: str, number: int) -> Callable[[], object]:
    """True once trial ``number`` (or a later one) is being measured."""
    import optuna

    return lambda: any(t.number >= number and t.state == optuna.trial.TrialState.RUNNING and "run_started" in t.user_attrs
                       for t in trials(storage, study))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    """A PostgreSQL 15 server on loopback for the session, run as the unprivileged ``postgres`` user
    (the server refuses root); its SQLAlchemy URL."""
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"PostgreSQL server binaries not found in {PG_BIN} (tests/system-deps.sh installs them)")
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
        pg(str(PG_BIN / "initdb"), "-D", str(data / "db"), "-A", "trust", "-U", "postgres")
        pg(str(PG_BIN / "pg_ctl"), "-D", str(data / "db"), "-l", str(data / "log"), "-w", "start", "-o",
           f"-h 127.0.0.1 -p {port} -k {data} -c fsync=off")
        pg(str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "autotune")
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/autotune"
    finally:
        subprocess.run([*as_postgres, str(PG_BIN / "pg_ctl"), "-D", str(data / "db"), "-m", "immediate", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(data, ignore_errors=True)


def interrupt(proc: subprocess.Popen[str], sig: int = signal.SIGINT, timeout: float = 60) -> tuple[str, str]:
    proc.send_signal(sig)
    return proc.communicate(timeout=timeout)
