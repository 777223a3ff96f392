from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from autotune.errors import UsageError
from autotune.recipe import Recipe
from autotune.recipe_file import load_recipe_file, parse_env, to_env

NASTY = "it's $(touch pwned) `touch pwned2` \"q\" ; rm -rf / # \\ end"


def _recipe() -> Recipe:
    # the shell-looking text in a note: free text a recipe may hold (a param no search writes is refused)
    return Recipe(params={"threads": 2, "batch_size": 64}, workload="cnn", fingerprint="abc123", study="s",
                  samples_per_s=200.0, baseline_samples_per_s=100.0, speedup=2.0, id=7, notes=[NASTY])


def test_env_file_round_trips_without_executing_anything(tmp_path: Path) -> None:
    text = to_env(_recipe(), {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}, [0, 1])
    (tmp_path / "best.env").write_text(text)
    values = {key: value for key, (_, value) in parse_env(text).items()}
    assert values["OMP_NUM_THREADS"] == "2" and values["AUTOTUNE_CPUS"] == "0,1"
    assert load_recipe_file(tmp_path / "best.env") == _recipe()
    script = 'set -a; . ./best.env; set +a; printf "%s\\n%s" "$OMP_NUM_THREADS" "$AUTOTUNE_RECIPE"'
    out = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    threads, recipe_json = out.split("\n", 1)
    assert threads == "2"
    assert json.loads(recipe_json)["notes"] == [NASTY]
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


def test_json_recipe_file(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_recipe().to_dict()))
    assert load_recipe_file(path).params["batch_size"] == 64


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.env", "OMP_NUM_THREADS=2\n", "no AUTOTUNE_RECIPE"),
        ("b.env", "echo hello\n", "b.env:1: not a KEY='VALUE' line"),
        ("c.env", "A=$(date)x y\n", "c.env:1: not a KEY='VALUE' line"),
        ("d.env", "AUTOTUNE_RECIPE='{not json'\n", "not valid JSON"),
        ("e.json", '{"threads": 2}', "not an autotune recipe"),
        ("missing.env", None, "cannot read"),
    ],
)
def test_bad_recipe_files_give_one_clear_error(tmp_path: Path, name: str, text: str | None, message: str) -> None:
    if text is not None:
        (tmp_path / name).write_text(text)
    with pytest.raises(UsageError, match=message):
        load_recipe_file(tmp_path / name)


def test_a_recipe_says_its_format_and_one_without_is_format_1(tmp_path: Path) -> None:
    """Format 2 holds the batch of one process (``batch_per_rank``); a recipe written before (no ``format``)
    is format 1, whose ``batch_size`` is summed over the processes, and says so in one line."""
    from autotune.recipe import FORMAT, format_note

    current = Recipe(params={"batch_per_rank": 64, "processes": 8}, workload="cnn", fingerprint="abc123")
    assert (FORMAT, current.format, format_note(current)) == (2, 2, None)
    (tmp_path / "best.env").write_text(to_env(current, {}, None))
    assert "# recipe format 2: batch_per_rank is each process's batch" in (tmp_path / "best.env").read_text()
    assert load_recipe_file(tmp_path / "best.env").format == 2
    old = {"params": {"batch_size": 64, "processes": 8}, "workload": "cnn", "fingerprint": "abc123"}  # as an older
    # autotune wrote it
    (tmp_path / "old.json").write_text(json.dumps(old))
    loaded = load_recipe_file(tmp_path / "old.json")
    assert loaded.format == 1 and Recipe(params=old["params"], workload="cnn").format == 1  # a stored row, too
    assert format_note(loaded) == (f"recipe from {tmp_path / 'old.json'} is format 1: its batch_size 64 is the batch "
                                   "of all 8 processes together (8 per process); recipes searched now hold "
                                   "batch_per_rank")


def test_best_says_what_a_format_1_recipe_means(tmp_path: Path) -> None:
    from .conftest import cli

    (tmp_path / "old.json").write_text(json.dumps({"params": {"batch_size": 64, "processes": 2}, "workload": "cnn",
                                                   "fingerprint": "abc123"}))
    (tmp_path / "new.json").write_text(json.dumps({"params": {"batch_per_rank": 64, "processes": 2},
                                                   "workload": "cnn", "format": 2, "fingerprint": "abc123"}))
    old = cli("best", "--recipe", "old.json", cwd=tmp_path)
    assert old.returncode == 0, old.stderr
    assert ("note: recipe from old.json is format 1: its batch_size 64 is the batch of all 2 processes together "
            "(32 per process); recipes searched now hold batch_per_rank") in " ".join(old.stdout.split())
    new = cli("best", "--recipe", "new.json", cwd=tmp_path)
    assert new.returncode == 0 and "format 1" not in new.stdout, new.stderr


def test_a_recipe_says_where_it_stands_against_the_machines_peak_as_stored_and_shown(tmp_path: Path) -> None:
    """GFLOP/s is samples/s x the workload's FLOP per sample; its share is of the matmul peak at the recipe's
    precision, float32's beside a lower one; the defaults' against float32's. Kept by the store (its details)."""
    from autotune.store import RecipeStore

    from .conftest import cli

    recipe = Recipe(params={"amp_dtype": "bfloat16"}, workload="cnn", fingerprint="abc123", samples_per_s=4000.0,
                    baseline_samples_per_s=1000.0, speedup=4.0, flop_per_sample=41e6,
                    matmul_gflops={"float32": 205.0, "bfloat16": 820.0})
    said = ("164 GFLOP/s = 20% of the bfloat16 matmul peak (820 GFLOP/s), 80% of float32's (205); the defaults "
            "41 GFLOP/s = 20% of float32's")
    assert recipe.place_text == said
    url = f"sqlite:///{tmp_path}/studies.db"
    with RecipeStore.open(url) as store:
        stored = store.save(recipe)
    with RecipeStore.open(url, readonly=True) as store:
        again = store.get(stored.id)
    assert (again.flop_per_sample, again.matmul_gflops, again.place_text) == (41e6, recipe.matmul_gflops, said)
    shown = cli("best", cwd=tmp_path)
    assert shown.returncode == 0 and f"at {said}" in " ".join(shown.stdout.split()), shown.stdout
    unknown = Recipe(params={}, workload="cnn", samples_per_s=4000.0, baseline_samples_per_s=1000.0)
    assert unknown.place_text is None  # FLOP not counted: nothing said, not 0 GFLOP/s
    fp32 = Recipe(params={}, workload="cnn", samples_per_s=2000.0, baseline_samples_per_s=1000.0, flop_per_sample=41e6,
                  matmul_gflops={"float32": 205.0})
    assert fp32.place_text == ("82 GFLOP/s = 40% of the float32 matmul peak (205 GFLOP/s); the defaults 41 GFLOP/s "
                               "= 20%")
