"""``ipex``: offered only where a matching IPEX is installed; ``Tuned.prepare`` calls ``ipex.optimize``.

IPEX cannot be installed beside torch 2.13 (its last release needs torch 2.8), so the apply path runs
against ``FAKE_IPEX``, a stand-in ``intel_extension_for_pytorch`` put on ``PYTHONPATH`` of a subprocess: it
records how ``optimize`` was called. The space is tested with fake probe facts.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest

from autotune import search_spaces as spaces
from autotune.trial import run_trial

# Stands in for intel-extension-for-pytorch, which cannot be installed beside torch 2.13.
FAKE_IPEX = r'''
import json, os
__version__ = "9.9.9+fake"

def optimize(model, dtype=None, optimizer=None, level="O1", inplace=False, **kwargs):
    with open(os.environ["FAKE_IPEX_RECORD"], "a") as f:  # one line per call
        f.write(json.dumps({"dtype": str(dtype), "inplace": inplace, "model": type(model).__name__,
                   "optimizer": type(optimizer).__name__,
                   "same_params": [id(p) for p in model.parameters()] == [id(p) for g in optimizer.param_groups
                                                                          for p in g["params"]]}) + "\n")
    return model, optimizer
'''


@pytest.fixture
def fake_ipex(tmp_path, monkeypatch):
    package = tmp_path / "site" / "intel_extension_for_pytorch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FAKE_IPEX)
    record = tmp_path / "record.json"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(package.parent), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("FAKE_IPEX_RECORD", str(record))
    return record


def _runtime(facts, version, compatible):
    return replace(facts, runtime=replace(facts.runtime, ipex_version=version, ipex_compatible=compatible))


@pytest.mark.parametrize(
    ("version", "compatible", "device", "offered"),
    [("2.8.0", True, "cpu", True), ("2.8.0", False, "cpu", False), ("2.8.0", None, "cpu", False),
     (None, None, "cpu", False), ("2.8.0", True, "cuda", False)],
)
def test_offered_only_with_a_matching_ipex_on_cpu(facts, version, compatible, device, offered) -> None:
    import optuna

    fake = _runtime(facts, version, compatible)
    ctx = spaces.SpaceContext(device=device)
    assert spaces.ipex.available(fake, ctx) is offered
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen = set()
    for _ in range(12):
        trial = study.ask()
        seen.add(spaces.suggest(trial, fake, ctx)["ipex"])
        study.tell(trial, 0.0)
    assert seen == ({False, True} if offered else {False})
    assert ("ipex" in study.trials[0].params) is offered


def test_apply_calls_ipex_optimize_with_model_optimizer_and_dtype(facts, fake_ipex) -> None:
    script = textwrap.dedent(f"""
        import json, torch, autotune
        from autotune.probes import Facts
        facts = Facts.from_json({facts.to_json()!r})
        for amp, compile_mode in (("bfloat16", "default"), ("float32", "none")):
            tuned = autotune.apply({{"batch_size": 8, "ipex": True, "amp_dtype": amp, "compile_mode": compile_mode}},
                                   facts=facts, check_hardware=False)
            model = tuned.prepare_model(torch.nn.Linear(4, 2))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            model2, optimizer2 = tuned.prepare(model, optimizer)
            print(json.dumps({{"in_effect": tuned.in_effect, "same": model2 is model and optimizer2 is optimizer}}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    calls = [json.loads(line) for line in fake_ipex.read_text().splitlines()]
    # Under torch.compile the wrapped Linear is optimized in place, so the compiled model stays valid.
    assert calls == [{"dtype": dtype, "inplace": True, "model": "Linear", "optimizer": "SGD", "same_params": True}
                     for dtype in ("torch.bfloat16", "None")]
    assert [json.loads(line) for line in done.stdout.splitlines()[-2:]] == [
        {"in_effect": {"ipex": {"ipex": "9.9.9+fake", "ipex_dtype": dtype}}, "same": True}
        for dtype in ("torch.bfloat16", "None")
    ]


def test_missing_ipex_warns_and_leaves_the_model(facts) -> None:
    import torch

    import autotune

    tuned = autotune.apply({"batch_size": 8, "ipex": True}, facts=facts, check_hardware=False)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(UserWarning, match="ipex=True not applied"):
        assert tuned.prepare(model, optimizer) == (model, optimizer)
    assert "ipex" not in tuned.in_effect


@pytest.mark.slow
def test_trial_subprocess_runs_ipex_optimize(facts, fast_settings, fake_ipex) -> None:
    params = {**spaces.defaults(facts, spaces.SpaceContext()), "device": "cpu", "reference_batch": 32,
              "threads": 1, "ipex": True}
    result = run_trial("tiny", params, facts, fast_settings, timeout_s=120)
    assert result.status == "ok", result.log_tail
    assert result.in_effect["ipex"] == {"ipex": "9.9.9+fake", "ipex_dtype": "None"}
    assert [json.loads(line)["model"] for line in fake_ipex.read_text().splitlines()] == ["Sequential"]
