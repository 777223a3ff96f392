from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autotune import Workload
from autotune.cli import main
from autotune.errors import UsageError
from autotune.workloads import load_workload

# A user's workload that names itself nothing (the tiny model, built from its parts).
UNNAMED = """
from autotune import Workload
from autotune.workloads import tiny

def make():
    return Workload(model=tiny._model, dataset=tiny._dataset, loss=tiny._loss, optimizer=tiny._optimizer)
"""


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A user's project directory as the working directory, as the ``autotune`` console script sees it: not on
    sys.path (load_workload puts it there, as ``python -m`` does for the trial child); nothing imported stays."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    yield tmp_path
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


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
        ("nosuch_module_xyz:build", "no module 'nosuch_module_xyz': the modules in .* are "),
        ("autotune.workloads.nosuch:build", "no module 'autotune.workloads.nosuch': autotune.workloads has cnn, tiny, "
                                            "transformer$"),
        ("autotune.workloads.tiny:nosuch", "tiny has no function 'nosuch'; its functions: workload$"),
        ("/nonexistent/file.py:build", "does not exist"),
        ("autotune.workloads.tiny:_model", "not autotune.Workload"),
    ],
)
def test_bad_workload_specs(spec: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        load_workload(spec)


def test_workload_is_importable_from_the_top() -> None:
    assert Workload is load_workload("tiny").__class__


@pytest.mark.parametrize(
    ("source", "spec", "message"),
    [
        ("import json\nraise ValueError('no data in /data/gru')\n", "gru_tagger.py:make",
         r"^your workload gru_tagger.py raised ValueError: no data in /data/gru \(gru_tagger.py, line 2\)$"),
        ("def make(:\n", "gru_tagger.py:make",
         r"^your workload gru_tagger.py raised SyntaxError: invalid syntax \(gru_tagger.py, line 1\)$"),
        ("import sys\nsys.exit('usage: gru_tagger.py DATA')\n", "gru_tagger.py:make",
         "^your workload gru_tagger.py raised SystemExit: usage: gru_tagger.py DATA"),
        ("import nosuch_dependency_xyz\n", "gru_tagger:make",
         "^your workload module gru_tagger raised ModuleNotFoundError: No module named 'nosuch_dependency_xyz'"),
        ("def make():\n    raise KeyError('vocab')\n", "gru_tagger.py:make",
         r"^your workload gru_tagger.py:make raised KeyError: 'vocab' \(gru_tagger.py, line 2\)$"),
        ("import json\ndef make():\n    return json.loads('{')\n", "gru_tagger.py:make",  # the user's line, not json's
         r"^your workload gru_tagger.py:make raised JSONDecodeError: .* \(gru_tagger.py, line 3\)$"),
    ],
)
def test_what_the_users_code_raises_is_their_error(user_dir: Path, source: str, spec: str, message: str) -> None:
    (user_dir / "gru_tagger.py").write_text(source)
    with pytest.raises(UsageError, match=message):
        load_workload(spec)


def test_a_workload_file_that_raises_is_a_usage_error_and_writes_nothing(
        user_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the CLI's main() in this process (a fresh process's exit 2: tests/study/test_inputs.py)
    (user_dir / "gru_tagger.py").write_text("raise ValueError('no data')\n")
    assert main(["search", "--workload", "gru_tagger.py:make", "--trials", "1"]) == 2
    assert capsys.readouterr().err.strip() == (
        "autotune search: error: your workload gru_tagger.py raised ValueError: no data (gru_tagger.py, line 1)"
    )
    assert sorted(p.name for p in user_dir.iterdir()) == ["gru_tagger.py"]


def test_a_model_factory_that_raises_is_a_usage_error(user_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (user_dir / "gru_tagger.py").write_text(UNNAMED.replace("model=tiny._model", "model=lambda: 1 / 0"))
    assert main(["search", "--workload", "gru_tagger.py:make", "--trials", "1"]) == 2
    assert capsys.readouterr().err.strip() == ("autotune search: error: your workload gru_tagger.py:make's model() "
                                               "raised ZeroDivisionError: division by zero (gru_tagger.py, line 6)")
    assert sorted(p.name for p in user_dir.iterdir()) == ["gru_tagger.py"]  # nothing written


def test_a_module_in_the_working_directory_is_found_without_it_on_the_path(user_dir: Path) -> None:
    # The ``autotune`` console script has its own directory on sys.path, not the working directory; the
    # trial child (``python -m``) has the working directory: both must find ``gru_tagger:make``.
    (user_dir / "gru_tagger.py").write_text(UNNAMED)
    assert load_workload("gru_tagger:make").name == "gru_tagger.make"


@pytest.mark.parametrize(
    ("spec", "name"),
    [("tiny", "tiny"), ("autotune.workloads.cnn:workload", "cnn"), ("models/gru_tagger.py:make", "gru_tagger.make")],
)
def test_the_default_name_comes_from_the_spec(user_dir: Path, spec: str, name: str) -> None:
    (user_dir / "models").mkdir()
    (user_dir / "models" / "gru_tagger.py").write_text(UNNAMED)
    assert load_workload(spec).name == name


def test_two_unnamed_user_workloads_get_two_studies(user_dir: Path, facts) -> None:
    """Naming the study is the search's logic: the trials are measured by the scripted measurer."""
    import optuna

    from autotune.study import SearchOptions, search

    from .study.test_race import Scripted

    storage = f"sqlite:///{user_dir}/studies.db"
    for stem in ("gru_tagger", "mlp"):
        (user_dir / f"{stem}.py").write_text(UNNAMED)
        search(f"{stem}.py:make", options=SearchOptions(storage=storage, trials=1, confirm_top=0), measurer=Scripted(),
               facts=facts)
    names = sorted(optuna.get_all_study_names(storage))
    assert len(names) == 2 and names[0].startswith("gru_tagger.make-") and names[1].startswith("mlp.make-")


def _two_layers(loss: Any = None) -> Workload:
    import torch

    return Workload(
        model=lambda: torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)),
        dataset=lambda: torch.utils.data.TensorDataset(torch.randn(16, 64), torch.randn(16, 8)),
        loss=loss or (lambda out, batch: torch.nn.functional.mse_loss(out, batch[1])),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1))


def test_flop_per_sample_counts_a_training_step_of_a_known_model() -> None:
    from autotune.workloads import flop_per_sample

    # a sample: forward 64x32 + 32x8 multiply-adds; backward the second layer's weight and input gradients (32x8
    # each) and the first's weight gradient (64x32; its input needs none); 2 FLOP a multiply-add
    expected = 2 * (64 * 32 + 32 * 8) + 2 * (2 * 32 * 8 + 64 * 32)
    assert flop_per_sample(_two_layers()) == expected == 9728
    assert flop_per_sample(_two_layers(), samples=8) == expected  # the same per sample at any batch


def test_flop_per_sample_never_calls_the_users_loss_and_is_unknown_where_the_model_fails_or_counts_nothing() -> None:
    import torch

    from autotune.workloads import flop_per_sample

    def loss(out: Any, batch: Any) -> Any:
        raise AssertionError("the search's process called the user's loss")  # it may count, log or fail

    assert flop_per_sample(_two_layers(loss)) == 9728  # backward from the outputs' sum: the same graph
    broken = _two_layers()
    broken = Workload(model=lambda: torch.nn.Linear(3, 2), dataset=broken.dataset, loss=broken.loss,
                      optimizer=broken.optimizer)  # 3 inputs where the data has 64: the forward raises
    assert flop_per_sample(broken) is None  # its trials say why, with the traceback
    elementwise = Workload(model=lambda: torch.nn.LayerNorm(3), dataset=lambda: torch.utils.data.TensorDataset(
        torch.randn(4, 3), torch.randn(4, 3)), loss=lambda out, batch: (out - batch[1]).pow(2).mean(),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1))
    assert flop_per_sample(elementwise) is None  # no matmul to count: unknown, not 0
