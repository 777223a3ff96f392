"""The user's path: search, best, export, then apply() in a fresh Python process; the quality guard's verdicts in
the same search."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune import probes
from autotune.measure.measurer import told_apart
from autotune.recipe import format_place
from autotune.recipe_file import load_recipe_file
from autotune.study import choose_recipe
from autotune.trial import TrialSettings, loss_samples
from autotune.workloads import flop_per_sample, load_workload

from . import quality_workloads as qw
from .conftest import cli, defaults_env, run_cli
from .study.conftest import trials

PROBE_SCRIPT = """
import json, os, warnings, torch, autotune
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    tuned = autotune.apply({source})
print(json.dumps({{"threads": torch.get_num_threads(), "batch_size": tuned.batch_size,
                  "cpus": sorted(os.sched_getaffinity(0)), "warnings": [str(w.message) for w in caught]}}))
"""


def _python(code: str, cwd: Path, prefix: list[str] | None = None) -> dict:
    out = subprocess.run([*(prefix or []), sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


# One real search of ``slow`` serves the user's path and the quality guard's verdicts in a search (its losses,
# trained as arms, in tests/study/test_quality.py).

GUARD_REASON = re.compile(r"loss \d+\.\d+ is \+\d+\.\d% over the baseline's \d+\.\d+ \(limit \+5%\)")
# Its calibration, the stored recipe's trial (stopped by the guard after its first round), batch 256's race and
# one confirmation round (fresh processes) took 62-66 s alone (69 s on a Xeon with the sampler's two turns): the
# race stops where the time its confirmation needs begins (before, it raced to its 24-pair cap, and the
# confirmation was left out for want of time). Beside another test run and stress-ng, 80 s left it out: the
# calibration took 24 s and the two candidates 17 s, and the round, estimated from that calibration's start, no
# longer fitted in the 35 s left.
BUDGET_S = 100


def _search(folder: Path, workload: str, *args: str, study: str = "q",
            budget_s: int = BUDGET_S) -> tuple[str, list, str]:
    """A search stops at its budget (its own clock, however loaded the machine): the limit is that and its
    start and end (``run_cli``'s default limit is a fixed 300 s). Its output, trials and warnings."""
    out = run_cli("search", "--workload", qw.spec(workload), "--study", study, "--budget", f"{budget_s}s",
                  "--no-compile", "--busy-limit", "inf", *defaults_env(), *args, cwd=folder, timeout=budget_s + 120)
    assert out.returncode == 0, out.stderr
    return out.stdout, trials(f"sqlite:///{folder}/studies.db", study), out.stderr


# Precisions held at float32: where the CPU computes bf16 (or fp16), their seeds would come before the heuristic the
# tests expect, and the sampled trial's draw would differ from one CPU to the next; workers held at 0 keep the
# sampled trial an arm in the defaults' worker.
SLOW_RUN = ("--global-batch", "256", "--fix", "batch_per_rank=256", "--fix", "matmul_precision=highest",
            "--fix", 'amp_dtype="float32"', "--fix", "num_workers=0", "--steps", "8", "--warmup-steps", "2")


@pytest.fixture(scope="module")
def slow_study(facts, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict]:
    """A search of ``slow`` under --global-batch 256, where every batch size takes the same optimizer steps, in a
    folder whose database holds a stored recipe of this workload and machine: batch 256 with ``HURTS``, which the
    search measures first (its warm start) and its guard rejects; then the sampler's turn (only the sparsity is
    left to draw) and the heuristic, batch 256 alone (~4x the defaults, feasible), which the draw may have measured
    already; the fastest feasible trial confirmed in a round of fresh processes. Its folder, its output and its
    trials other than the confirmation's: ``baseline``, ``hurting`` (the warm start), ``alone`` (the first of batch
    256 alone) and ``all``.

    One round, whose interval is that round's alone (the recipe says so): rounds are the units of a confirmed
    interval, a Student-t over their medians, and two rounds (1 degree of freedom) beside another test run read
    3.65x and 2.99x, [0.93-11.75], no recipe. How rounds combine: ``tests/study/test_race.py`` (scripted)."""
    from autotune import search_spaces as spaces
    from autotune.recipe import Recipe
    from autotune.store import RecipeStore

    folder = tmp_path_factory.mktemp("slow-study")
    stored = {**spaces.defaults(facts, spaces.SpaceContext(default_batch_size=64)), "batch_per_rank": 256, **qw.HURTS}
    with RecipeStore.open(f"sqlite:///{folder}/studies.db") as store:  # as an earlier search would have stored it
        store.save(Recipe(params=stored, workload=qw.spec("slow"), fingerprint=facts.fingerprint, study="earlier"))
    # --trials ends it on a fast machine; the budget is for a slow one: on a loaded 2-vCPU Zen 3 its calibration took
    # 35 s, and 100 s left no time for the confirmation's round (5e2eeee failed so there); no claim about your runs
    # (tests/study/test_claim.py's): its pairs would run on to the budget's end, 60 s more of the suite
    chosen, ts, warned = _search(folder, "slow", *SLOW_RUN, "--trials", "4", "--confirm", "1", "--confirm-rounds", "1",
                                 "--claim-pairs", "0",
                                 budget_s=150)
    searched = [t for t in ts if t.user_attrs["role"] != "confirm" and t.user_attrs["status"] != "duplicate"]
    baseline, hurting = searched[:2]
    alone = {**baseline.user_attrs["params"], "batch_per_rank": 256}
    found = [t for t in searched if t.user_attrs["params"] == alone and t.user_attrs["status"] == "ok"]
    assert hurting.user_attrs["role"] == "warm-start" and found, (chosen, warned)
    return folder, chosen, {"baseline": baseline, "hurting": hurting, "alone": found[0], "all": searched}


@pytest.mark.slow
def test_search_export_apply(slow_study, facts) -> None:
    # A workload made slow on purpose: batch 256 runs one forward pass per optimizer step of 256 samples where
    # the default 64 runs four (--global-batch 256), ~4x the samples/s at the same loss. The search must find it,
    # and the speedup must come from the confirmation's fresh pairs against the defaults, with its interval.
    tmp_path, stdout, searched = slow_study
    assert f"PyTorch defaults (trial {searched['baseline'].number})" in stdout, stdout
    claim = re.search(r"^(\d+\.\d\d)x \[(\d+\.\d\d)-(\d+\.\d\d)\] over PyTorch defaults "
                      r"\(provisional: not measured in processes of your training, (\d+(?:\.\d)?)% interval\)$",
                      stdout, re.M)
    # The round's 8 pairs give the median's order-statistic interval min to max (99.2%): one window stalled by
    # another test run sets a bound (CI, AVX2: 3.69x [1.08-8.95] where the search read 4.17x). So the low bound
    # must clear no gain and the median most of the ~4x there is idle: beside another test run, batch 256's two
    # OpenMP threads (the defaults', held) lose their cores at every parallel region, and it read 1.93x [1.74-3.25]
    # (a Xeon); how narrow it gets is the machine's noise, not a claim.
    assert claim and 1.0 < float(claim[2]) <= float(claim[1]) <= float(claim[3]) and float(claim[1]) > 1.5, stdout
    # the noise line: both noises as measured, and the gain the confirmed interval could tell apart
    noise = re.search(r"^noise: identical arms in one process differed by up to \d+\.\d% a window pair \(\d+ A/A "
                      r"pairs\); between fresh processes .*; the smallest gain this search tells apart 4 times in 5 is "
                      r"(\d+\.\d)% \(trial \d+'s one-round interval\)$", stdout, re.M)
    margin = optuna.load_study(study_name="q", storage=f"sqlite:///{tmp_path}/studies.db").user_attrs["noise"]["margin"]
    # from the bounds as printed, to 2 decimals: a wide interval's rounding moves it by more than the line's 0.1
    # (a suite run printed 212.4% where the rounded bounds gave 212.07%)
    # at the interval's coverage as printed (the round's 8 pairs: 99.2%), 4 times in 5
    low, high, coverage = float(claim[2]), float(claim[3]), float(claim[4]) / 100
    told = (told_apart(margin, low + 0.005, high - 0.005, confidence=coverage),
            told_apart(margin, low - 0.005, high + 0.005, confidence=coverage))
    # the lines that say it, not the whole output (pytest cuts a long message in its middle, where they are)
    said = [line for line in stdout.splitlines() if line.startswith(("noise:", "note:"))]
    assert noise and 100 * told[0] - 0.05 <= float(noise[1]) <= 100 * told[1] + 0.05, (said, told)

    best = cli("best", "--json", cwd=tmp_path)  # its console script: tests/test_read_while_searching.py
    stored = json.loads(best.stdout)
    assert stored["workload"] == qw.spec("slow") and stored["baseline_samples_per_s"] > 0
    assert stored["params"]["batch_per_rank"] == 256 and stored["params"]["reference_batch"] == 64
    assert stored["format"] == 2 and "batch_size" not in stored["params"]
    assert stored["speedup"] == pytest.approx(float(claim[1]), abs=0.005), stored
    interval = (stored["speedup_low"], stored["speedup_high"])
    assert interval == pytest.approx((float(claim[2]), float(claim[3])), abs=0.005), stored
    # one round asked: offered as provisional, never said to be confirmed
    assert any(n.startswith("best (trial ") and "provisional at" in n for n in stored["notes"]), stored["notes"]
    assert stored["claim"] == "provisional" and f"{stored['confidence'] * 100:.3g}" == claim[4], stored
    assert any("in one round of fresh processes" in note and "that round's interval alone" in note
               for note in stored["notes"]), stored["notes"]
    # no process pairs of the user's runs (--claim-pairs 0): the workers' interval is stated, and named theirs
    assert any(n.startswith("not measured in processes of your training (--claim-pairs 0)")
               for n in stored["notes"]), stored["notes"]
    # both rates measured in the confirmation's windows, side by side: their quotient lies near the interval
    quotient = stored["samples_per_s"] / stored["baseline_samples_per_s"]
    assert 0.97 * stored["speedup_low"] <= quotient <= 1.03 * stored["speedup_high"], stored
    # where it stands against this machine's limit: the workload's FLOP counted once, the peaks as probed (cached)
    flop = flop_per_sample(load_workload(qw.spec("slow")))
    peak = dict(probes.limits(facts).matmul)
    assert flop and stored["flop_per_sample"] == flop and stored["matmul_gflops"] == peak, stored
    # (format_place's arithmetic is its doctests'; here: the stored figures are what the summary says)
    assert f"best: {format_place(stored['samples_per_s'], flop, peak)}; the defaults " in stdout, said

    assert cli("export", "--format", "env", "-o", "best.env", cwd=tmp_path).returncode == 0
    assert cli("export", "--format", "json", "-o", "best.json", cwd=tmp_path).returncode == 0
    recipe = load_recipe_file(tmp_path / "best.env")
    assert recipe == load_recipe_file(tmp_path / "best.json")
    assert recipe.id == stored["id"] and recipe.params == stored["params"]

    # Loaded by bash, then applied in a fresh process: the recipe's settings are in effect.
    code = PROBE_SCRIPT.format(source="'best.env'")
    loaded = _python(code, tmp_path, ["bash", "-c", 'set -a; . ./best.env; set +a; exec "$@"', "bash"])
    assert loaded["threads"] == recipe.params["threads"]
    assert loaded["batch_size"] == recipe.params["batch_per_rank"]

    # Under `autotune run`, even affinity is in effect, and apply() with no argument finds the recipe.
    under_run = _python(PROBE_SCRIPT.format(source=""), tmp_path,
                        [sys.executable, "-m", "autotune", "run", "--recipe", "best.env", "--"])
    assert under_run["threads"] == recipe.params["threads"] and under_run["warnings"] == []


def test_apply_warns_when_environment_knobs_are_missing(tmp_path: Path, facts: Any) -> None:
    recipe = {"params": {"threads": 1, "interop_threads": 1, "affinity": "compact", "batch_size": 8},
              "workload": "tiny", "fingerprint": facts.fingerprint}
    (tmp_path / "r.json").write_text(json.dumps(recipe))
    plain = _python(PROBE_SCRIPT.format(source="'r.json'"), tmp_path)
    assert plain["threads"] == 1  # in-process knobs are applied anyway
    assert any("autotune run" in w and "OMP_NUM_THREADS=1" in w for w in plain["warnings"])


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    for args, message in [
        (("search", "--workload", "nosuch", "--budget", "10s"), "not a bundled name"),
        (("search", "--workload", "tiny", "--budget", "soon"), "bad duration"),
        # (`--budget -5m`, argparse's usage error: tests/cli/test_usage.py)
        (("search", "--workload", "tiny", "--budget=-5m"), "bad duration '-5m': it must be more than zero"),
        (("best",), "no studies.db here: run 'autotune search' first"),
        (("export", "--recipe", "missing.env"), "cannot read recipe file"),
        # nothing listens on port 1: refused at once, or (seen on a loaded 2-core machine) psycopg's timeout first
        (("best", "--storage", "postgresql+psycopg://nobody@127.0.0.1:1/x"), ("Connection refused",
                                                                              "connection timeout expired")),
    ]:
        result = cli(*args, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        wanted = (message,) if isinstance(message, str) else message
        assert len(lines) == 1 and any(m in lines[0] for m in wanted), result.stderr
        assert "Traceback" not in result.stderr


def test_a_reader_that_closes_the_pipe_is_no_internal_error(tmp_path: Path) -> None:
    # `autotune recipes | head`: `true` exits before autotune writes, so the write meets a closed pipe
    out = subprocess.run(["bash", "-c", f'"{sys.executable}" -m autotune probe --no-runtime --json | true; '
                          'echo "${PIPESTATUS[0]}"'], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "141" and out.stderr == "", out.stderr


# The quality guard in a search: what it records and prints, and the recipe chosen.

def _slow_loss_samples(facts) -> int:
    return loss_samples(TrialSettings(warmup_steps=2, measure_steps=8),
                        {"reference_batch": 64, "batch_per_rank": 64, "global_batch": 256}, facts)


@pytest.mark.slow
def test_a_knob_that_hurts_quality_is_rejected_with_its_reason(facts, slow_study) -> None:
    """HURTS misses the defaults' loss after 4 steps of 256 by over the 5% the guard allows (by how much on
    ``regression`` at the default steps: ``test_a_knob_that_hurts_quality_trains_to_a_far_worse_loss``)."""
    _, stdout, searched = slow_study
    baseline, hurting = searched["baseline"], searched["hurting"]
    assert baseline.user_attrs["role"] == "baseline"
    assert hurting.user_attrs["params"]["sparsity"] == 0.8
    reason = hurting.user_attrs["infeasible"]
    assert GUARD_REASON.fullmatch(reason), reason
    assert hurting.user_attrs["loss"] > 1.05 * baseline.user_attrs["loss"]
    assert hurting.user_attrs["loss_samples"] == baseline.user_attrs["loss_samples"] == _slow_loss_samples(facts)
    assert f"[{reason}]" in stdout  # the trial's line in the report
    # a sampled trial's too, if it hurts
    rejected = sum(bool(GUARD_REASON.fullmatch(t.user_attrs.get("infeasible", ""))) for t in searched["all"])
    assert f"{rejected} trial(s) rejected by the quality guard" in stdout


@pytest.mark.slow
def test_a_knob_that_does_not_hurt_passes_the_guard(facts, slow_study) -> None:
    """Batch 256 under --global-batch 256 takes the defaults' optimizer steps: it reaches their loss."""
    _, _, searched = slow_study
    baseline, feasible = searched["baseline"], searched["alone"]
    assert feasible.user_attrs["params"]["batch_per_rank"] == 256 and feasible.user_attrs["status"] == "ok"
    assert "infeasible" not in feasible.user_attrs, feasible.user_attrs["infeasible"]
    assert feasible.user_attrs["loss"] == pytest.approx(baseline.user_attrs["loss"], rel=0.03)
    assert feasible.user_attrs["loss_samples"] == baseline.user_attrs["loss_samples"] == _slow_loss_samples(facts)


@pytest.mark.slow
def test_the_recipe_is_a_feasible_trial_and_the_rejected_one_is_never_chosen(facts, slow_study) -> None:
    """HURTS, rejected by the guard, is the recipe neither with confirmation (it confirms a feasible trial) nor
    without (the fastest feasible trial of the search). That a faster infeasible trial is passed over is
    ``tests/study/test_guard.py``'s, with scripted speeds: measured, HURTS's lead over batch 256 alone ranged
    from 18x on an idle machine to 0.70x beside stress-ng (its step is compute where batch 256's is a sleep)."""
    folder, stdout, searched = slow_study
    feasible = {t.number: t for t in searched["all"][1:] if t.user_attrs["status"] == "ok"
                and "infeasible" not in t.user_attrs}
    assert searched["alone"].number in feasible and searched["hurting"].number not in feasible
    confirmed = re.search(r"best \(trial (\d+)\) ", stdout)  # the summary table's row of the confirmation's choice
    assert confirmed and int(confirmed[1]) in feasible, stdout  # the confirmation chose a feasible one

    study = optuna.load_study(study_name="q", storage=f"sqlite:///{folder}/studies.db")
    recipe, _, best, _ = choose_recipe(study, "slow", facts, "q", confirmation=None)
    fastest = max(feasible.values(), key=lambda t: t.user_attrs["objective"])
    assert best.number == fastest.number and recipe.params == fastest.user_attrs["params"]
    assert recipe.speedup > 1.5 and recipe.loss == fastest.user_attrs["loss"]  # 2.14x beside another test run
    assert any("rejected by the quality guard" in note for note in recipe.notes)
