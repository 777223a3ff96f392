"""The recipe applies on the machine that measured it: ``autotune run --recipe R -- python train.py`` whose
script calls ``autotune.apply()`` with the hardware check on; recipes and studies recorded with an older
fingerprint scheme are refused with a message that says so and how to search again."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

import autotune
from autotune import search_spaces as spaces
from autotune.errors import HardwareMismatchError
from autotune.recipe import Recipe
from autotune.recipe_file import to_env
from autotune.store import RecipeStore
from autotune.study import SearchOptions
from autotune.study.driver import open_study
from autotune.study.seeds import warm_start

from .conftest import FAST, missing, run_cli

# One step of the tiny workload. The torch work before apply() (building the model, as any script does) runs
# a parallel region: with KMP_AFFINITY that is where libiomp5 pins the main thread to one CPU.
TRAIN = """
import json, torch
from autotune.workloads.tiny import workload
wl = workload()
model = wl.model()
torch.randn(256, 256) @ torch.randn(256, 256)
import autotune
tuned = autotune.apply()
model = tuned.prepare_model(model)
optimizer = wl.optimizer(model.parameters())
x, y = tuned.to_device(*wl.dataset()[: tuned.batch_size])
with tuned.autocast():
    loss = wl.loss(model(x), (x, y))
json.dump({"stepped": tuned.step(loss, optimizer), "loss": float(loss)}, open("seen.json", "w"))
"""


def _env_file(path: Path, facts, **params) -> Path:
    """An env file as 'autotune export' writes it, for a recipe measured here (the live fingerprint)."""
    params = {"batch_size": 8, "device": "cpu", **params}
    recipe = Recipe(params=params, workload="tiny", fingerprint=facts.fingerprint)
    path.write_text(to_env(recipe, spaces.environment(params, facts), spaces.cpus_for(params, facts),
                           spaces.memory_nodes(params, facts)))
    return path


def _run(tmp_path: Path, recipe: Path) -> subprocess.CompletedProcess[str]:
    (tmp_path / "train.py").write_text(TRAIN)
    return run_cli("run", "--recipe", str(recipe), "--", sys.executable, "train.py", cwd=tmp_path, timeout=120)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: a recipe cannot pin fewer CPUs than allowed")
def test_autotune_run_with_one_pinned_thread_applies_and_trains(facts, tmp_path: Path) -> None:
    recipe = _env_file(tmp_path / "best.env", facts, threads=1, affinity="compact")
    assert "\nAUTOTUNE_CPUS=" + str(min(os.sched_getaffinity(0))) + "\n" in recipe.read_text()  # it really narrows
    done = _run(tmp_path, recipe)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "seen.json").read_text())["stepped"] is True


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: libiomp5 has no other CPU to leave")
def test_autotune_run_with_libiomp5_pinning_applies_and_trains(facts, tmp_path: Path) -> None:
    if facts.runtime is None or facts.runtime.iomp5_path is None:
        missing("libiomp5 not found by the probe (pip install intel-openmp)")
    threads = facts.cpu.allowed.cores  # autotune run narrows nothing: libiomp5 pins the main thread itself
    recipe = _env_file(tmp_path / "best.env", facts, threads=threads, affinity="compact", openmp="intel",
                       kmp_blocktime=1)
    assert "KMP_AFFINITY=granularity=fine,compact,1,0" in recipe.read_text()
    done = _run(tmp_path, recipe)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "seen.json").read_text())["stepped"] is True


def test_a_recipe_file_from_other_hardware_is_named_in_the_refusal(facts, tmp_path: Path) -> None:
    path = tmp_path / "theirs.json"
    path.write_text(json.dumps({"params": {"batch_size": 8}, "workload": "tiny", "fingerprint": "v3-0123456789ab"}))
    with pytest.raises(HardwareMismatchError) as refused:
        autotune.apply(str(path), facts=facts)
    message = str(refused.value)
    assert message.startswith(f"recipe from {path} was measured on hardware v3-0123456789ab, this machine is "
                              f"{facts.fingerprint}: search again here (autotune search --workload tiny)")
    stored = Recipe(params={"batch_size": 8}, workload="tiny", fingerprint="v3-0123456789ab", id=7)
    with pytest.raises(HardwareMismatchError, match="^recipe 7 was measured on hardware"):
        autotune.apply(stored, facts=facts)
    # a script's recipe: its search is the script after --, "--workload script:..." names no workload
    script = Recipe(params={"batch_size": 8}, workload="script:my dir/train.py", fingerprint="v3-0123456789ab", id=8)
    with pytest.raises(HardwareMismatchError) as refused:
        autotune.apply(script, facts=facts)
    assert "search again here (autotune search -- python 'my dir/train.py'), or pass" in str(refused.value)


def test_autotune_run_refuses_a_recipe_of_other_hardware_before_the_command_starts(facts, tmp_path: Path) -> None:
    """In one line, before the script has loaded anything (its apply() would refuse it after); told to, it starts
    the script, whose apply() warns where it would refuse."""
    recipe = tmp_path / "theirs.json"
    recipe.write_text(json.dumps({"params": {"batch_size": 8}, "workload": "tiny", "fingerprint": "v3-0123456789ab",
                                  "id": 3}))
    (tmp_path / "train.py").write_text('open("started", "w").close()\n' + TRAIN)
    command = ("run", "--recipe", str(recipe), "--", sys.executable, "train.py")
    done = run_cli(*command, cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and not (tmp_path / "started").exists(), done.stderr
    assert done.stderr.splitlines() == [
        f"autotune run: error: recipe 3 from {recipe} was measured on hardware v3-0123456789ab, this machine is "
        f"{facts.fingerprint}: search again here (autotune search --workload tiny), or pass --allow-other-hardware"]

    allowed = run_cli(*command[:1], "--allow-other-hardware", *command[1:], cwd=tmp_path, timeout=120)
    assert allowed.returncode == 0, allowed.stderr
    assert json.loads((tmp_path / "seen.json").read_text())["stepped"] is True
    why = f"recipe 3 from {recipe} was measured on hardware v3-0123456789ab, this machine is {facts.fingerprint}"
    assert f"autotune run: warning: {why}: search again here (autotune search --workload tiny)\n" in allowed.stderr
    assert f"UserWarning: {why}: search again here (autotune search --workload tiny)\n" in allowed.stderr


def test_a_recipe_of_the_old_fingerprint_scheme_is_refused_with_the_way_out(facts, tmp_path: Path) -> None:
    old = _old_scheme(facts)
    path = tmp_path / "old.env"
    path.write_text(to_env(Recipe(params={"batch_size": 8}, workload="cnn", fingerprint=old), {}, None))
    with pytest.raises(HardwareMismatchError) as refused:
        autotune.apply(str(path), facts=facts)
    assert str(refused.value) == (
        f"recipe from {path} was recorded with autotune's fingerprint v2 ({old}), which this autotune (v3) cannot "
        "compare: fingerprints now tell CPU generations apart by their family and model numbers, where the CPU's "
        "name may not: search again here (autotune search --workload cnn), or pass allow_other_hardware=True")
    with pytest.warns(UserWarning, match="fingerprint v2"):
        assert autotune.apply(str(path), facts=facts, allow_other_hardware=True).batch_size == 8


def _old_scheme(facts) -> str:
    """A fingerprint of the scheme before (v2): refused for its scheme, whatever its digits."""
    return "v2-" + facts.fingerprint.removeprefix("v3-")


def _old_study(storage: str, facts) -> None:
    study = optuna.create_study(storage=storage, study_name="old", direction="maximize")
    study.set_user_attr("fingerprint", _old_scheme(facts))
    study.set_user_attr("workload", "tiny")
    study.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=1.0))


def test_a_study_of_the_old_fingerprint_scheme_is_refused_and_kept(facts, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path}/studies.db"
    _old_study(storage, facts)
    done = run_cli("search", *FAST, "--workload", "tiny", "--trials", "1", "--storage", storage, "--study", "old",
                   cwd=tmp_path)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "study 'old' was recorded with autotune's fingerprint v2" in line
    assert "search again in a new study: autotune search --workload tiny --study NEW_NAME" in line
    assert len(optuna.load_study(study_name="old", storage=storage).trials) == 1  # its trials are kept


def test_a_new_study_names_the_old_scheme_studies_it_leaves_behind(facts, tmp_path: Path, caplog) -> None:
    storage = f"sqlite:///{tmp_path}/studies.db"
    _old_study(storage, facts)
    with caplog.at_level("WARNING", logger="autotune.study"):
        _, created = open_study(SearchOptions(storage=storage), "tiny-new", facts, "tiny")
    assert created
    assert "study 'old' (1 trials) of workload tiny is not continued: it was recorded with autotune's " \
           "fingerprint v2" in caplog.text


def test_a_warm_start_skips_an_old_scheme_recipe_with_a_note(facts, tmp_path: Path, caplog) -> None:
    storage = f"sqlite:///{tmp_path}/studies.db"
    with RecipeStore.open(storage) as store:
        store.save(Recipe(params={"threads": 1}, workload="tiny", fingerprint=facts.fingerprint))
        old = store.save(Recipe(params={"threads": 2}, workload="tiny", fingerprint=_old_scheme(facts)))
    with caplog.at_level("WARNING", logger="autotune.study"):
        assert warm_start(storage, "tiny", facts) == {"threads": 1}  # the newest of this scheme, not the old one
    assert f"warm start: recipe {old.id} of workload tiny is skipped: it was recorded with autotune's " \
           "fingerprint v2" in caplog.text


# Each rank: apply() with its hardware check (it probes the fake machine itself), then what it saw. This CPU
# build of torch has no CUDA, so a rank that passes the check fails right after it, at torch.cuda.set_device.
RANK = """
import json, os, traceback
import autotune
from autotune import probes
from autotune.errors import DeviceMissingError, HardwareMismatchError
try:
    autotune.apply()
    after = "applied"
except DeviceMissingError as e:  # the fake GPUs passed the hardware check; this torch has no CUDA
    after = "checked, then " + str(e)
except HardwareMismatchError as e:
    after = "refused: " + str(e)
except Exception as e:
    frames = [f.name for f in traceback.extract_tb(e.__traceback__)]
    after = "checked, then " + ("set_device" if "set_device" in frames else repr(e))
facts = probes.probe()
seen = {"after": after, "gpus": [g.nvml_index for g in facts.gpus], "fingerprint": facts.fingerprint,
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
json.dump(seen, open("rank%s.json" % os.environ["LOCAL_RANK"], "w"))
"""


def test_two_ranks_on_two_visible_gpus_of_eight_pass_the_hardware_check(facts, tmp_path: Path,
                                                                        monkeypatch) -> None:
    """A recipe measured with CUDA_VISIBLE_DEVICES=0,1 on the fake 8-GPU host: its fingerprint covers those two
    GPUs, and each rank of 'autotune run' (which inherits the variable, its local rank choosing the device)
    recognises the same machine."""
    from autotune.probes import _nvml

    from .fakes.nvml import load_machine
    from .test_export_run import NVIDIA_SMI

    if not NVIDIA_SMI.is_dir():
        pytest.skip(f"nvidia-smi dumps not found at {NVIDIA_SMI}")
    fake = load_machine(NVIDIA_SMI, "H100SXMx8")
    monkeypatch.setattr(_nvml, "load_library", lambda: fake)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    eight = autotune.probes.probe().fingerprint
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    here = autotune.probes.probe()
    assert [g.nvml_index for g in here.gpus] == [0, 1] and here.fingerprint != eight
    recipe = tmp_path / "best.json"
    recipe.write_text(json.dumps({"params": {"batch_per_rank": 4, "device": "cuda", "processes": 2, "threads": 2},
                                  "workload": "tiny", "fingerprint": here.fingerprint, "format": 2}))
    (tmp_path / "train.py").write_text(RANK)
    env = {"PYTHONPATH": os.pathsep.join([str(Path(__file__).parent / "fakes" / "pynvml_site"),
                                          os.environ.get("PYTHONPATH", "")]),
           "AUTOTUNE_FAKE_NVML": str(NVIDIA_SMI / "H100SXMx8"), "CUDA_VISIBLE_DEVICES": "0,1"}
    done = run_cli("run", "--recipe", str(recipe), "--", sys.executable, "train.py", cwd=tmp_path, timeout=180,
                   env=env)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    import torch  # the CPU build here: the fake GPUs pass the hardware check, then the one line on CUDA

    missing = (f"checked, then recipe from {recipe} trains on CUDA (device=cuda), but this torch {torch.__version__} "
               "is built without CUDA: install a CUDA build of torch")
    assert ranks == [{"after": missing, "gpus": [0, 1], "fingerprint": here.fingerprint, "visible": "0,1"}] * 2, \
        done.stderr


SAVES = """
import signal, sys, time
def saved(signum, frame):
    open("saved", "w").write(str(signum))
    sys.exit(7)
signal.signal(signal.SIGTERM, saved)
print("ready", flush=True)
time.sleep(120)
"""


def test_sigterm_reaches_the_command_as_run_plain_and_autotune_run_waits_for_it(facts, tmp_path: Path) -> None:
    """A batch scheduler's SIGTERM to ``autotune run`` goes on to the training, which saves its checkpoint and ends
    with its own status; without it, Python's default ended ``autotune run`` at once and its lifeline killed the
    training before it could save."""
    recipe = _env_file(tmp_path / "best.env", facts)
    (tmp_path / "train.py").write_text(SAVES)
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "run", "--recipe", str(recipe), "--", sys.executable,
                             "train.py"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 7 and (tmp_path / "saved").read_text() == str(15), err
