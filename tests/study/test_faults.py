"""A search stopped by Ctrl-C or killed outright, or meeting trials that fail: nothing lost, nothing left
running, and it continues."""
from __future__ import annotations

import json
from pathlib import Path

import optuna
import psutil

from .. import quality_workloads
from ..conftest import REPO, defaults_env
from .conftest import interrupt, running_trial, start_search, trials, wait_for

FAULTY = REPO / "tests" / "faulty_workloads.py"
# A tiny CNN: its channels_last seed comes right after the baseline on every CPU (``quality_workloads.conv``).
CONV = quality_workloads.spec("conv")


def _roles(ts: list, state: str | None = None) -> list[str]:
    return [t.user_attrs.get("role") for t in ts if state is None or t.state.name == state]


def test_ctrl_c_records_the_running_trial_and_the_same_command_continues(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path}/studies.db"
    args = ("--workload", CONV, "--study", "s", "--trials", "2", "--confirm", "1", "--confirm-rounds", "1")
    first = start_search(*args, cwd=tmp_path)
    wait_for(running_trial(storage, "s", 1), 120, "trial 1 to start")
    out, err = interrupt(first)
    assert first.returncode == 130, err
    assert "interrupted; everything recorded so far is kept" in err
    before = trials(storage, "s")
    assert [(t.number, t.state.name) for t in before] == [(0, "COMPLETE"), (1, "FAIL")]
    assert before[1].user_attrs["status"] == "interrupted" and before[1].user_attrs["role"] == "seed"
    assert "run_ended" in before[1].user_attrs  # the trial was stopped and recorded, not abandoned

    second = start_search(*args, cwd=tmp_path)
    out, err = second.communicate(timeout=300)
    assert second.returncode == 0, err
    assert "(continued)" in out
    after = trials(storage, "s")
    assert [t.state.name for t in after[:2]] == ["COMPLETE", "FAIL"]  # the first run's record is kept as it was
    assert _roles(after, "COMPLETE").count("baseline") == 1  # measured once, by the first run
    # The interrupted seed was measured again; --trials 2 counts the study's trials, so nothing more.
    searched = [t for t in after if t.user_attrs.get("role") != "confirm" and t.state.name == "COMPLETE"]
    assert [t.user_attrs["role"] for t in searched] == ["baseline", "seed"]
    assert [t.number for t in searched] == [0, 2]
    assert searched[1].user_attrs["params"] == before[1].user_attrs["params"]
    # Then the confirmation: the candidate measured again with fresh pairs (if the guard let it through).
    # A candidate slower with confidence (bf16 autocast on a tiny MLP read 0.71x) is not confirmed.
    confirms = [t for t in after if t.user_attrs.get("role") == "confirm"]
    margin = optuna.load_study(study_name="s", storage=storage).user_attrs["noise"]["margin"]
    could_win = "infeasible" not in searched[1].user_attrs and searched[1].user_attrs["speedup_high"] >= 1 + margin
    assert [t.user_attrs["confirms"] for t in confirms] == ([2] if could_win else [])
    assert all(t.user_attrs["params"] == after[t.user_attrs["confirms"]].user_attrs["params"] for t in confirms)
    assert "speedup over PyTorch defaults" in out and "noise: identical runs here differ by up to" in out, out


def test_kill_9_leaves_no_process_and_the_next_search_fails_the_stale_trial_and_removes_its_directory(
        tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path}/studies.db"
    temp = tmp_path / "tmp"  # the searches' temporary directory: their trial directories and host lock
    temp.mkdir()
    # DataLoader workers in every trial but the baseline: grandchildren of the search to be cleaned up.
    # The workload stalls while its workers run and the flag file exists, so the kill finds the whole tree.
    stall = tmp_path / "stall"
    stall.touch()
    args = ("--study", "k", "--trials", "2", "--confirm", "0", "--fix", "num_workers=1", "--fix", "prefetch_factor=2",
            "--fix", "persistent_workers=true", "--workload", f"{FAULTY}:stalls_with_workers")
    env = {"AUTOTUNE_TEST_STALL": str(stall), "TMPDIR": str(temp)}
    first = start_search(*args, cwd=tmp_path, env=env)
    wait_for(running_trial(storage, "k", 1), 120, "trial 1 to start")
    search = psutil.Process(first.pid)

    def trial_tree() -> list[psutil.Process]:
        kids = search.children(recursive=True)
        worker = [p for p in kids if "autotune.trial.worker" in " ".join(p.cmdline())]
        return kids if worker and worker[0].children() else []  # the paired worker and its arm's DataLoader worker

    tree = wait_for(trial_tree, 120, "the trial's DataLoader worker to start")
    first.kill()
    first.communicate(timeout=30)
    gone, alive = psutil.wait_procs(tree, timeout=5)
    assert alive == [], [p.cmdline() for p in alive]
    stale = trials(storage, "k")[1]
    assert stale.state.name == "RUNNING"  # nobody could record it: the next search must
    left = list(temp.glob("autotune-trial-*"))
    assert len(left) == 1 and (left[0] / "spec.json").exists()  # nor remove the trial's directory

    stall.unlink()
    second = start_search(*args, cwd=tmp_path, env=env)
    out, err = second.communicate(timeout=300)
    assert second.returncode == 0, err
    after = trials(storage, "k")
    assert after[1].state.name == "FAIL" and after[1].user_attrs["status"] == "interrupted"
    assert "died" in after[1].user_attrs["error"]
    assert [(t.user_attrs["role"], t.state.name) for t in after[2:]] == [(after[1].user_attrs["role"], "COMPLETE")]
    assert after[2].user_attrs["params"]["num_workers"] == 1
    assert "recipe 1 stored" in out
    assert list(temp.glob("autotune-trial-*")) == []  # the dead search's directory and the second's own
    survivors = [p for p in psutil.process_iter(["cmdline"]) if str(temp) in " ".join(p.info["cmdline"] or [])]
    assert survivors == []  # no trial process of either search (their command lines name their spec in temp)


def test_each_fault_of_a_trial_is_recorded_with_its_reason_and_the_search_goes_on(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path}/studies.db"
    # One fault per model trained, in order (tests/faulty_workloads.py:scripted): the defaults' arm and its A/A copy
    # (the baseline), then each candidate's arm in the defaults' worker; a worker that died is started again for the
    # next candidate, with a defaults arm of its own ("ok"). The environment is held at the defaults' (--fix).
    script = tmp_path / "faults.json"
    script.write_text(json.dumps(["ok", "ok", "crash", "abort", "ok", "segfault", "ok", "nan", "killed"]))
    args = ("--study", "f", "--trials", "6", "--confirm", "0", "--workload", f"{FAULTY}:scripted", *defaults_env())
    search = start_search(*args, cwd=tmp_path, env={"AUTOTUNE_TEST_FAULTS": str(script)})
    out, err = search.communicate(timeout=300)
    assert search.returncode == 0, err
    assert json.loads(script.read_text()) == []  # every fault was met by a trial
    # Optuna's state is the loop's business (nan and oom: infeasible, so the sampler learns); the status and
    # the reason are what the report shows.
    recorded = [(t.user_attrs["status"], t.user_attrs.get("error") or "") for t in trials(storage, "f")]
    expected = [("ok", ""), ("crash", "ValueError: fake: the user's loss has a bug"), ("crash", "killed by SIGABRT"),
                ("crash", "killed by SIGSEGV"), ("nan", "the loss became nan"), ("oom", "killed by SIGKILL")]
    assert [status for status, _ in recorded] == [status for status, _ in expected]
    for (_, error), (_, reason) in zip(recorded, expected, strict=True):
        assert reason in error
