"""``autotune dashboard``: optuna-dashboard on loopback for the storage in use, or the line to install it."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from autotune.study import Budget

from ..conftest import _free_port, needs_module, run_cli
from ..stubs import StubMeasurer
from .conftest import DEFAULTS, add_study


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    add_study(f"sqlite:///{tmp_path}/studies.db", "tiny-done",
              trials=[("baseline", DEFAULTS, "ok", 100.0), ("seed", {**DEFAULTS, "threads": 1}, "ok", 180.0)])
    return tmp_path


def test_dashboard_serves_the_studies_on_loopback(storage: Path) -> None:
    needs_module("optuna_dashboard", "optuna-dashboard is not installed: pip install "
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
        assert studies[0]["user_attrs"] == [{"key": "fingerprint", "value": "v3-aaaaaaaaaaaa"},
                                            {"key": "workload", "value": "tiny"}]
        # Ctrl-C while a request is being served: a reader that does not read its 6 MB script holds the server
        # in the middle of sending it (wsgiref took the interrupt there for a failed request and served on).
        reader = socket.create_connection(("127.0.0.1", port))
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.sendall(b"GET /static/bundle.js HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept-Encoding: identity\r\n\r\n")
        time.sleep(1.0)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, stderr = proc.communicate(timeout=30)
        finally:
            proc.kill()
            proc.communicate()
            with contextlib.suppress(NameError):
                reader.close()
    assert proc.returncode == 0, stderr
    assert stderr.startswith(f"optuna-dashboard on http://127.0.0.1:{port}/dashboard/studies/1 (Ctrl-C to stop)\n")
    assert stderr.endswith("optuna-dashboard stopped\n"), stderr


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
    needs_module("optuna_dashboard", "optuna-dashboard is not installed")
    out = run_cli("dashboard", "--study", "nosuch", "--port", str(_free_port()), cwd=storage)
    assert out.returncode == 2
    assert out.stderr.strip() == ("autotune dashboard: error: no study 'nosuch' in sqlite:///studies.db; "
                                  "its studies: tiny-done")


def _loop_study(url: str, facts) -> None:
    """A study recorded by the real search loop (real Optuna, real SQLite); only the measurements are scripted:
    the baseline, a trial over the quality guard, one whose loss became NaN, one out of memory."""

    from autotune.search_spaces import SpaceContext, defaults
    from autotune.study import SearchOptions
    from autotune.study.loop import SearchLoop
    from autotune.trial import TrialResult

    ctx = SpaceContext(default_batch_size=32)
    from autotune.measure import Noise
    from autotune.measure.stats import Interval

    script = [TrialResult("ok", samples_per_s=100.0, objective=1.0, speedup_low=0.99, speedup_high=1.01, loss=1.0),
              TrialResult("ok", samples_per_s=150.0, objective=1.5, speedup_low=1.4, speedup_high=1.6, loss=2.0),
              TrialResult("nan", error="the loss became nan"), TrialResult("oom", error="out of memory")]

    class Scripted(StubMeasurer):  # a PairedMeasurer whose measurements are the script's
        def calibrate(self, timeout_s):
            return Noise(window_s=0.3, pairs=8, half_width=0.03, margin=0.02, spread=0.04, aa=(1.0, 0.99, 1.01))

        def begin(self, params, timeout_s):  # a result at once: the loop records it as measured
            return script.pop(0)

        def more(self, handle, n, timeout_s, confidence=0.95):
            return Interval(handle.objective, handle.speedup_low, handle.speedup_high, 0.95, 8)

        def end(self, handle):
            return handle

        def close(self):
            pass

    import optuna

    study = optuna.create_study(storage=url, study_name="loop", direction="maximize")
    options = SearchOptions(storage=url, trials=4, budget_s=None)
    loop = SearchLoop(study, "tiny", facts, ctx, {"device": "cpu", "reference_batch": 32}, options,
                      budget=Budget.start(600), notify=lambda event: None,
                      seeds=[("baseline", defaults(facts, ctx))], measurer=Scripted())
    assert loop.run() == "trials" and script == []


def test_the_dashboard_marks_infeasible_trials_and_gives_failed_ones_no_value(tmp_path: Path, facts) -> None:
    needs_module("optuna_dashboard", "optuna-dashboard is not installed")
    from autotune.study.records import records

    url = f"sqlite:///{tmp_path}/studies.db"
    _loop_study(url, facts)
    import optuna

    recs = records(optuna.load_study(study_name="loop", storage=url))
    assert [(r.result.status, r.feasible, r.rejected_by) for r in recs] == [
        ("ok", True, ()), ("ok", False, ("quality",)), ("nan", False, ("finite_loss",)),
        ("oom", False, ("fits_memory",))]
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "dashboard", "--port", str(port)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, detail = time.monotonic() + 60, None
        while detail is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/1?after=0", timeout=5) as r:
                    detail = json.load(r)
            except OSError:
                time.sleep(0.3)
        assert detail is not None, f"no answer on 127.0.0.1:{port}; exit {proc.poll()}"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    shown = [(t["number"], t["state"], t.get("values"), t["constraints"]) for t in detail["trials"]]
    # the quality guard's rejection: measured (its value kept) and infeasible; NaN and OOM: failed, no value
    # (constraints: quality = loss increase - 5%, fits_memory, finite_loss, applied; feasible when all <= 0)
    assert shown == [(0, "Complete", [1.0], [pytest.approx(-0.05), 0.0, 0.0, 0.0]),
                     (1, "Complete", [1.5], [pytest.approx(0.95), 0.0, 0.0, 0.0]),
                     (2, "Fail", None, [0.0, 0.0, 1.0, 0.0]), (3, "Fail", None, [0.0, 1.0, 0.0, 0.0])]
