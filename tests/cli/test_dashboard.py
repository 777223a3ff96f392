"""``autotune dashboard``: optuna-dashboard on loopback for the storage in use, or the line to install it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ..conftest import _free_port, run_cli
from .conftest import DEFAULTS, add_study


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    add_study(f"sqlite:///{tmp_path}/studies.db", "tiny-done",
              trials=[("baseline", DEFAULTS, "ok", 100.0), ("seed", {**DEFAULTS, "threads": 1}, "ok", 180.0)])
    return tmp_path


def test_dashboard_serves_the_studies_on_loopback(storage: Path) -> None:
    pytest.importorskip("optuna_dashboard", reason="optuna-dashboard is not installed: pip install "
                        "'autotune[dashboard]' (the extra) to run this test")
    port = _free_port()
    command = [sys.executable, "-m", "autotune", "dashboard", "--port", str(port), "--study", "tiny-done"]
    proc = subprocess.Popen(command, cwd=storage, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, studies = time.monotonic() + 60, None
        while studies is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5) as response:
                    studies = json.load(response)["study_summaries"]
            except OSError:
                time.sleep(0.3)
        assert studies is not None, f"no answer on 127.0.0.1:{port}; exit {proc.poll()}"
        assert [(s["study_name"], s["directions"]) for s in studies] == [("tiny-done", ["maximize"])]
        assert studies[0]["user_attrs"] == [{"key": "fingerprint", "value": "v2-aaaaaaaaaaaa"},
                                            {"key": "workload", "value": "tiny"}]
    finally:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert stderr.startswith(f"optuna-dashboard on http://127.0.0.1:{port}/dashboard/studies/1 (Ctrl-C to stop)\n")


def test_without_optuna_dashboard_it_names_the_install_command(storage: Path) -> None:
    hidden = storage / "hide"
    (hidden / "optuna_dashboard").mkdir(parents=True)  # shadows an installed copy: as if it were not there
    (hidden / "optuna_dashboard" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'optuna_dashboard'\", name='optuna_dashboard')\n")
    out = run_cli("dashboard", cwd=storage, env={"PYTHONPATH": os.pathsep.join(filter(None, (
        str(hidden), os.environ.get("PYTHONPATH"))))})
    assert out.returncode == 2
    assert out.stderr == "autotune dashboard: error: optuna-dashboard is not installed: " \
                         "pip install 'autotune[dashboard]'\n"


def test_dashboard_of_an_unknown_study_names_those_there(storage: Path) -> None:
    pytest.importorskip("optuna_dashboard", reason="optuna-dashboard is not installed")
    out = run_cli("dashboard", "--study", "nosuch", "--port", str(_free_port()), cwd=storage)
    assert out.returncode == 2
    assert out.stderr.strip() == ("autotune dashboard: error: no study 'nosuch' in sqlite:///studies.db; "
                                  "its studies: tiny-done")
