"""``matmul_precision``: oneDNN's bfloat16 path for float32 matmuls, offered where the CPU computes bf16, set and read
in this process, each arm's own in its windows, and verified in effect in a real worker's arms."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from autotune import search_spaces as spaces
from autotune.search_spaces import SpaceContext, allowed_values

CPU = SpaceContext(device="cpu")


@pytest.fixture
def restore_precision() -> Iterator[None]:
    """torch's float32 matmul precision as a fresh process has it, after the test (it is process state)."""
    import torch

    yield
    onednn: Any = torch.backends.mkldnn
    onednn.matmul.fp32_precision = "none"  # a fresh process's: no API has set it
    torch.set_float32_matmul_precision("highest")


def _with_isa(facts: Any, *flags: str) -> Any:
    return replace(facts, cpu=replace(facts.cpu, isa=tuple(flags)))


@pytest.mark.parametrize(("isa", "offered"), [(("avx2", "avx512f"), False), (("avx2", "avx512f", "avx512_bf16"), True),
                                              (("avx2", "amx_bf16"), True)])
def test_offered_on_the_cpu_only_where_it_computes_bfloat16(facts: Any, isa: tuple[str, ...], offered: bool) -> None:
    machine = _with_isa(facts, *isa)
    assert spaces.defaults(machine, CPU)["matmul_precision"] == "highest"  # PyTorch's
    choices = set(allowed_values(machine, CPU)["matmul_precision"].choices)
    assert choices == ({"highest", "medium"} if offered else {"highest"})
    assert ({"matmul_precision": "medium"} in spaces.matmul.promising(machine, CPU)) is offered  # a seed where offered
    assert not spaces.matmul.offered(machine, SpaceContext(device="cuda"))  # CUDA: the cuda family's TF32 flags


def test_apply_sets_it_and_reads_it_back_and_warns_where_the_script_set_another(restore_precision: None) -> None:
    import torch

    assert spaces.matmul.in_effect() == "highest"
    assert spaces.matmul.apply_process({"device": "cpu", "matmul_precision": "medium"}, None) == []
    assert spaces.matmul.in_effect() == "medium" == torch.get_float32_matmul_precision()
    assert str(torch.backends.mkldnn.matmul.fp32_precision) == "bf16"  # what oneDNN's matmuls read
    problems = spaces.matmul.apply_process({"device": "cpu", "matmul_precision": "highest"}, None)
    assert problems == ["torch's float32 matmul precision is 'medium' in this process, but the recipe was measured "
                        "with 'highest' (PyTorch's default): remove the line of your script that sets it, or search "
                        "again with it"]
    spaces.matmul.set_flags({"device": "cpu"})  # a recipe without the key: PyTorch's
    assert spaces.matmul.in_effect() == "highest"


def test_set_through_onednns_own_api_it_is_still_read(restore_precision: None) -> None:
    import torch

    onednn: Any = torch.backends.mkldnn
    onednn.matmul.fp32_precision = "bf16"  # a user's script on the per-backend API: torch's reader raises now
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        torch.get_float32_matmul_precision()
    assert spaces.matmul.in_effect() == "medium"


def test_each_arm_runs_its_windows_with_its_own_precision(facts: Any, restore_precision: None) -> None:
    from types import SimpleNamespace

    from autotune.measure.worker.arms import Arm

    bench: Any = SimpleNamespace(facts=facts)
    arms = {name: Arm(name, {"device": "cpu", "matmul_precision": name}, bench) for name in ("highest", "medium")}
    for name in ("medium", "highest", "medium", "highest"):
        arms[name]._enter()  # not built: the precision is process state
        assert spaces.matmul.in_effect() == name
        arms[name]._leave()


def test_a_trial_that_ran_another_precision_is_not_scored_as_the_recipe() -> None:
    asked = {"device": "cpu", "matmul_precision": "medium"}
    assert spaces.not_in_effect(asked, {"matmul_precision": "highest"}) == [
        "matmul_precision=medium is not in effect: the process ran with highest"]
    assert spaces.not_in_effect(asked, {"matmul_precision": "medium"}) == []
    assert spaces.not_in_effect({**asked, "device": "cuda"}, {"matmul_precision": "high"}) == []  # TF32's, there
    assert spaces.recipe_problems({"matmul_precision": "low"}) == [
        "matmul_precision='low': not allowed (one of 'highest', 'medium')"]


def test_in_a_real_worker_each_arm_reports_its_own_precision(facts: Any) -> None:
    from autotune.measure.live.paired_worker import PairedWorker
    from autotune.trial.spec import TrialSettings

    settings = TrialSettings(warmup_steps=2, measure_steps=6, windows=2, max_extra_windows=0, eval_samples=64)
    params = {**spaces.defaults(facts, SpaceContext(default_batch_size=32)), "device": "cpu", "reference_batch": 32,
              "threads": 1, "interop_threads": 1}
    with PairedWorker("tiny", params, facts, settings) as worker:
        worker.add_arm("defaults", params)
        medium = worker.add_arm("medium", {**params, "matmul_precision": "medium"})
        run = worker.run_pairs("defaults", "medium", 2, 0.05)
    assert (run.base.in_effect["matmul_precision"], medium.in_effect["matmul_precision"]) == ("highest", "medium")
    assert run.cand.state == run.base.state == "ok"
