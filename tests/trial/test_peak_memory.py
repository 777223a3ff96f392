"""Peak device memory: measured per trial on CUDA after the warm-up, None on the CPU, and a recipe above 90%
of its device's memory says so (the trial's warnings, the recipe's notes). The CUDA calls are faked here
(no GPU on this machine); tests/test_gpu.py measures a real one."""
from __future__ import annotations

from types import SimpleNamespace

import optuna
import pytest

from autotune.study import choose_recipe
from autotune.trial import run_trial, training

GIB = 2**30


def test_a_cpu_trial_leaves_peak_memory_unknown(facts, fast_settings) -> None:
    from autotune import search_spaces as spaces

    params = {**spaces.defaults(facts, spaces.SpaceContext()), "device": "cpu", "reference_batch": 32, "threads": 1}
    result = run_trial("tiny", params, facts, fast_settings, timeout_s=120)
    assert result.status == "ok", result.log_tail
    assert result.peak_memory_bytes is None and result.in_effect["device_memory_bytes"] is None  # unknown, not 0
    assert not any("peak memory" in w for w in result.warnings)


def test_on_cuda_the_peak_is_reset_after_warm_up_and_read_over_the_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 75 * GIB)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=80 * GIB))
    monkeypatch.setattr(training.distributed, "max_over_ranks", lambda v: calls.append("max") or v)
    training.reset_peak_memory("cpu")
    assert training.peak_memory("cpu") == (None, None) and calls == []  # no CUDA call on the CPU
    training.reset_peak_memory("cuda")
    assert training.peak_memory("cuda") == (75 * GIB, 80 * GIB)
    assert calls == ["reset", "max"]  # the fullest rank's peak: a collective every rank calls


def _trial(study: optuna.Study, role: str, objective: float, **attrs: object) -> None:
    user = {"role": role, "status": "ok", "params": {"batch_per_rank": 64 if role == "baseline" else 256},
            "objective": objective, "samples_per_s": objective, "spread": 0.01, "loss": 1.0, **attrs}
    study.add_trial(optuna.trial.create_trial(value=objective, user_attrs=user))


@pytest.mark.parametrize(("peak", "noted"), [(75 * GIB, True), (40 * GIB, False), (None, False)])
def test_a_recipe_above_90_percent_of_its_device_says_so(facts, peak: int | None, noted: bool) -> None:
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("measure", "paired-v1")  # values are speedups over the defaults, with intervals
    _trial(study, "baseline", 1.0, peak_memory_bytes=20 * GIB, in_effect={"device_memory_bytes": 80 * GIB},
           speedup_low=0.99, speedup_high=1.01, samples_per_s=100.0)
    _trial(study, "search", 3.0, peak_memory_bytes=peak, in_effect={"device_memory_bytes": 80 * GIB},
           speedup_low=2.9, speedup_high=3.1, samples_per_s=300.0)
    recipe, _, best, _ = choose_recipe(study, "cnn", facts, "s", confirmation=None)
    assert best.number == 1 and recipe.peak_memory_bytes == peak
    said = [n for n in recipe.notes if n.startswith("peak memory")]
    assert said == (["peak memory 75.0 GiB is 94% of the device's 80.0 GiB (above 90%): a longer run, another "
                     "input shape or fragmentation may run out of memory"] if noted else [])
