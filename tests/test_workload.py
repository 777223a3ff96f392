from __future__ import annotations

from pathlib import Path

import pytest

from autotune import Workload
from autotune.errors import UsageError
from autotune.workload import load_workload


@pytest.mark.parametrize("name", ["cnn", "transformer", "tiny"])
def test_bundled_workloads_train_one_step(name: str) -> None:
    import torch

    workload = load_workload(name)
    model = workload.model()
    batch = next(iter(torch.utils.data.DataLoader(workload.dataset(), batch_size=4)))
    loss = workload.loss(model(*workload.model_inputs(batch)), batch)
    loss.backward()
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert workload.optimizer(model.parameters()).param_groups


def test_module_and_file_specs(tmp_path: Path) -> None:
    assert load_workload("autotune.workloads.tiny:workload").name == "tiny"
    (tmp_path / "mine.py").write_text(
        "from autotune.workloads import tiny\n"
        "def build():\n    w = tiny.workload()\n    return type(w)(**{**w.__dict__, 'name': 'mine'})\n"
    )
    assert load_workload(f"{tmp_path / 'mine.py'}:build").name == "mine"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nosuch", "not a bundled name"),
        ("nosuch_module_xyz:build", "cannot be imported"),
        ("autotune.workloads.tiny:nosuch", "has no function"),
        ("/nonexistent/file.py:build", "does not exist"),
        ("autotune.workloads.tiny:_model", "not autotune.Workload"),
    ],
)
def test_bad_workload_specs(spec: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        load_workload(spec)


def test_workload_is_importable_from_the_top() -> None:
    assert Workload is load_workload("tiny").__class__
