"""A recipe is checked where it enters (a file, the AUTOTUNE_RECIPE variable, a store): every param a known knob
with a value the search space offers on some machine, or one line naming it and nothing started (issue 31)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from autotune import search_spaces as spaces
from autotune.errors import UsageError
from autotune.recipe import FORMAT, Recipe, checked
from autotune.recipe_file import load_recipe_file
from autotune.search_spaces import SpaceContext, allowed_values

from .conftest import cli
from .fakes.machines import two_sockets

BAD = [  # (what changes in a real recipe of this machine, what the line names)
    ({"threads": "1; touch /tmp/x"}, "threads='1; touch /tmp/x': not allowed (an integer from 1 to 4096)"),
    ({"threads": 0}, "threads=0: not allowed (an integer from 1 to 4096)"),
    ({"threads": True}, "threads=True: not allowed (an integer from 1 to 4096)"),
    ({"threads": 2.0}, "threads=2.0: not allowed (an integer from 1 to 4096)"),
    ({"allocator": "/tmp/evil.so"},
     "allocator='/tmp/evil.so': not allowed (one of 'default', 'glibc-kept', 'jemalloc', 'tcmalloc')"),
    ({"openmp": "llvm"}, "openmp='llvm': not allowed (one of 'gnu', 'intel')"),
    ({"num_workers": -3}, "num_workers=-3: not allowed (an integer from 0 to 8)"),
    ({"compile_mode": "fastest"}, "compile_mode='fastest': not allowed (one of 'none', 'default'"),
    ({"amp_dtype": "float8"}, "amp_dtype='float8': not allowed (one of 'float32', 'bfloat16', 'float16')"),
    ({"pin_memory": "yes"}, "pin_memory='yes': not allowed (true or false)"),
    ({"bucket_cap_mb": "25"}, "bucket_cap_mb='25': not allowed (one of 5, 25, 100)"),
    ({"sparsity": 0.95}, "sparsity=0.95: not allowed (a number from 0 to 0.8)"),
    ({"LD_PRELOAD": "/tmp/evil.so"}, "'LD_PRELOAD'='/tmp/evil.so': not a knob autotune knows"),
    ({"batch_per_rank": 100_000}, "batch_per_rank=100000: not allowed (at most 128, the largest the search offers "
                                  "for a default batch of 32)"),
]


def _recipe(facts: Any, **changes: Any) -> dict[str, Any]:
    params = {**spaces.defaults(facts, SpaceContext(default_batch_size=32)), "device": "cpu", "reference_batch": 32,
              "global_batch": None, "lr_scaling": "sqrt", **changes}
    return {"params": params, "workload": "tiny", "fingerprint": facts.fingerprint, "format": FORMAT,
            "samples_per_s": 100.0, "baseline_samples_per_s": 90.0, "speedup": 1.1}


@pytest.mark.parametrize(("changes", "named"), BAD, ids=[next(iter(c)) for c, _ in BAD])
def test_a_recipe_file_no_search_could_write_is_refused_in_one_line_and_nothing_runs(
        facts: Any, tmp_path: Path, changes: dict[str, Any], named: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_recipe(facts, **changes)))
    ran = tmp_path / "ran"
    done = cli("run", "--recipe", str(path), "--", "touch", str(ran), cwd=tmp_path)
    assert done.returncode == 2 and not ran.exists(), (done.returncode, done.stderr)
    (line,) = done.stderr.strip().splitlines()
    assert f"recipe from {path} holds what no search writes: " in line and named in line, line


def test_the_recipes_format_and_params_are_checked_and_format_1_stays_valid(facts: Any, tmp_path: Path) -> None:
    for data, said in (({**_recipe(facts), "format": FORMAT + 1}, f"is format {FORMAT + 1}, this autotune reads"),
                       ({k: v for k, v in _recipe(facts).items() if k != "params"}, "has no 'params'"),
                       ({**_recipe(facts), "params": ["threads", 1]}, "params is list")):
        path = tmp_path / "r.json"
        path.write_text(json.dumps(data))
        with pytest.raises(UsageError, match=said):
            load_recipe_file(path)
    old = _recipe(facts)  # format 1: no format field, a global batch_size
    old = {**{k: v for k, v in old.items() if k != "format"},
           "params": {**{k: v for k, v in old["params"].items() if k != "batch_per_rank"}, "batch_size": 64}}
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert load_recipe_file(tmp_path / "old.json").format == 1


def test_a_stored_recipe_and_the_variable_are_checked_too(facts: Any, tmp_path: Path, monkeypatch: Any) -> None:
    import autotune
    from autotune.store import RecipeStore

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    with RecipeStore.open(url) as store:
        stored = store.save(replace(Recipe.from_dict(_recipe(facts, allocator="/tmp/evil.so")), study="s"))
    with pytest.raises(UsageError, match=r"recipe \d+ holds what no search writes: allocator='/tmp/evil.so'"):
        autotune.apply(stored.id, storage=url, facts=facts)
    monkeypatch.setenv("AUTOTUNE_RECIPE", json.dumps(_recipe(facts, num_workers=-1)))
    with pytest.raises(UsageError, match="the AUTOTUNE_RECIPE variable holds what no search writes: num_workers=-1"):
        autotune.apply(facts=facts)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_value_the_space_offers_passes_the_check(facts: Any, device: str) -> None:
    """One source of truth: what the space offers on a two-socket machine (with a GPU for CUDA) is allowed, and
    every knob of every family and run setting is declared."""
    from autotune.probes import Gpu

    machine = two_sockets(facts)
    if device == "cuda":
        gpu = Gpu(0, "A100", "8.0", 80 * 2**30, "00000000:81:00.0", numa_node=1, cpu_affinity="4-7,12-15")
        machine = replace(machine, gpus=(gpu,))
    ctx = SpaceContext(device=device, default_batch_size=32, conv=True, allow_compile=True)
    for key, allowed in allowed_values(machine, ctx).items():
        values = list(allowed.choices) + [v for low, high, _ in allowed.ranges for v in (int(low), high)]
        for value in values:
            assert spaces.recipe_problems({key: value, "reference_batch": 32}) == [], (key, value)
    declared = {k for family in spaces.FAMILIES for k in family.KEYS} | set(spaces.RUN_KEYS)
    assert declared <= set(spaces.schema()), declared - set(spaces.schema())
    assert checked(Recipe.from_dict(_recipe(facts))).params["threads"] >= 1
    # with --global-batch a GPU's batch goes up to the global batch
    assert spaces.recipe_problems({"batch_per_rank": 1024, "global_batch": 1024, "reference_batch": 32}) == []
