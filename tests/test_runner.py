"""Real trial subprocesses: what runs in them, and how every kind of failure is recorded."""
from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.runner import run_trial
from autotune.search_spaces import SpaceContext, defaults

FAULTY = "tests.faulty_workloads"


def _params(facts, **changes):
    params = {**defaults(facts, SpaceContext(default_batch_size=32)), "device": "cpu", "reference_batch": 32}
    return {**params, **changes}


def test_ok_trial_reports_throughput_loss_and_settings_in_effect(facts, fast_settings) -> None:
    params = _params(facts, threads=1, interop_threads=1, batch_size=16)
    windows = []
    result = run_trial("tiny", params, facts, fast_settings, timeout_s=120,
                       on_window=lambda i, s: windows.append((i, s)) or False)
    assert result.status == "ok", result.log_tail
    assert result.samples_per_s > 0 and result.objective > 0 and result.loss > 0
    assert len(result.windows) == fast_settings.windows and [i for i, _ in windows] == [0, 1]
    assert result.in_effect["threads"] == 1 and result.in_effect["env"]["OMP_NUM_THREADS"] == "1"
    assert result.startup_s > 0 and result.compile_s >= 0


def test_same_seed_same_loss(facts, fast_settings) -> None:
    params = _params(facts, threads=1)
    first = run_trial("tiny", params, facts, fast_settings, timeout_s=120)
    second = run_trial("tiny", params, facts, fast_settings, timeout_s=120)
    assert first.loss == pytest.approx(second.loss, rel=1e-5)


def test_inherited_thread_variables_do_not_leak_into_the_baseline(facts, fast_settings, monkeypatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    result = run_trial("tiny", _params(facts, threads=1), facts, fast_settings, timeout_s=120)
    assert result.in_effect["env"]["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize(
    ("workload", "status", "error"),
    [
        (f"{FAULTY}:crash", "crash", "ValueError: fake: the user's loss has a bug"),
        (f"{FAULTY}:nan", "nan", "the loss became nan"),
        (f"{FAULTY}:oom", "oom", "OutOfMemoryError"),
        (f"{FAULTY}:killed", "oom", "SIGKILL"),
        ("nosuch_workload", "crash", "UsageError"),
    ],
)
def test_failures_are_classified(facts, fast_settings, workload, status, error) -> None:
    result = run_trial(workload, _params(facts, batch_size=64), facts, fast_settings, timeout_s=120)
    assert result.status == status
    assert error in result.error
    assert result.samples_per_s is None


def test_hang_is_stopped_at_the_time_limit(facts, fast_settings) -> None:
    import psutil

    before = {p.pid for p in psutil.process_iter()}
    result = run_trial(f"{FAULTY}:hang", _params(facts), facts, fast_settings, timeout_s=8)
    assert result.status == "timeout" and 8 <= result.wall_s < 30
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if p.pid not in before
                 and "autotune._trial" in " ".join(p.info["cmdline"] or [])]
    assert leftovers == []


def test_pruning_stops_the_trial(facts, fast_settings) -> None:
    settings = replace(fast_settings, measure_steps=40, windows=4)
    result = run_trial("tiny", _params(facts), facts, settings, timeout_s=120, on_window=lambda i, s: i >= 0)
    assert result.status == "pruned"


def test_the_next_trial_removes_directories_left_by_a_dead_search(facts, fast_settings, tmp_path, monkeypatch) -> None:
    """``kill -9`` runs no clean-up: the search's trial directory stays until the next trial on this host."""
    import json
    import subprocess
    import sys
    import tempfile

    from autotune import _host

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where run_trial makes its directory
    dead = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead_owner = _host.owner(dead.pid)
    dead.kill()
    dead.wait()
    owners = {"dead": dead_owner, "alive": _host.owner(), "other-host": {**dead_owner, "host": "elsewhere/boot"}}
    for name, owner in owners.items():
        (tmp_path / f"autotune-trial-{name}").mkdir()
        (tmp_path / f"autotune-trial-{name}" / "owner.json").write_text(json.dumps(owner))
    (tmp_path / "autotune-trial-no-owner").mkdir()  # being created by another search: not ours to judge
    result = run_trial("tiny", _params(facts, threads=1), facts, fast_settings, timeout_s=120)
    assert result.status == "ok", result.log_tail
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["autotune-trial-alive", "autotune-trial-no-owner", "autotune-trial-other-host"]


@pytest.mark.parametrize(("channels_last", "amp_dtype"), [(False, "float32"), (True, "float32"), (True, "bfloat16")])
def test_amp_and_memory_format_are_reported_as_the_trial_ran_them(facts, fast_settings, channels_last, amp_dtype) -> None:
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


def test_amp_in_effect_is_none_where_the_model_has_no_4d_tensors(facts, fast_settings) -> None:
    result = run_trial("tiny", _params(facts, threads=1, channels_last=True), facts, fast_settings, timeout_s=120)
    assert result.status == "ok", result.log_tail
    assert result.in_effect["amp"]["channels_last_parameters"] is None  # an MLP: nothing to lay out
