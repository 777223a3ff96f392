"""The example user script runs plain and under ``autotune run`` with a recipe, applying it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.recipe import Recipe

from .conftest import run_cli

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("script", ["train_cnn.py", "train_transformer.py"])
def test_the_example_script_trains_plain_and_with_a_recipe(tmp_path: Path, facts, script: str) -> None:
    """The bundled CNN and transformer as a user writes them (``benchmarks/claims.py`` runs both ways)."""
    SCRIPT = EXAMPLES / script
    env = {**os.environ, "TRAIN_S": "0.3"}
    plain = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120)
    assert plain.returncode == 0, plain.stderr
    assert json.loads(plain.stdout.splitlines()[-1])["tuned"] is False
    recipe = Recipe(params={"threads": 1, "channels_last": True, "batch_size": 32, "device": "cpu"},
                    workload="cnn", fingerprint=facts.fingerprint, speedup=1.2)
    (tmp_path / "r.json").write_text(json.dumps(recipe.to_dict()))
    tuned = run_cli("run", "--recipe", "r.json", "--", sys.executable, str(SCRIPT), cwd=tmp_path,
                    env={"TRAIN_S": "0.3"})
    assert tuned.returncode == 0, tuned.stderr
    got = json.loads(tuned.stdout.splitlines()[-1])
    assert (got["tuned"], got["threads"]) == (True, 1)  # the recipe's threads, not torch's default of 2 here
    assert "warn" not in tuned.stderr.lower(), tuned.stderr
