"""The Lightning integration: the recipe's knobs as the Trainer's and the DataLoader's arguments, each optimizer step
told to a search through the callback, and the example script run under ``autotune run``."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from autotune.apply import Tuned
from autotune.recipe import Recipe
from autotune.steps import Loss, Model, Step, StepReporter, decode

from ..conftest import needs_module, run_cli

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_lightning.py"


def _lightning():
    return needs_module("lightning", "the Lightning integration needs lightning (pip install -e '.[test]')")


def test_the_recipe_sets_the_trainers_and_the_loaders_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.integrations.lightning import learning_rate, loader_arguments, trainer_arguments

    assert trainer_arguments(max_steps=5) == {"max_steps": 5}  # no recipe: the user's own
    assert (loader_arguments(batch_size=8), learning_rate(0.1)) == ({"batch_size": 8}, 0.1)
    tuned = Tuned(params={"batch_per_rank": 32, "reference_batch": 64, "amp_dtype": "bfloat16", "num_workers": 2,
                          "persistent_workers": True, "prefetch_factor": 4, "device": "cpu"})
    got = trainer_arguments(tuned, max_steps=5, logger=True, devices=2, accumulate_grad_batches=4)
    assert got == {"max_steps": 5, "logger": True, "precision": "bf16-mixed", "accelerator": "cpu", "devices": 2,
                   "accumulate_grad_batches": 4}  # the user's devices and accumulation: the recipe sets neither
    loader = loader_arguments(tuned, batch_size=64, shuffle=True)
    assert {k: loader[k] for k in ("batch_size", "shuffle", "num_workers", "persistent_workers", "prefetch_factor")} \
        == {"batch_size": 32, "shuffle": True, "num_workers": 2, "persistent_workers": True, "prefetch_factor": 4}
    started = []
    loader = loader_arguments(tuned, worker_init_fn=started.append)
    loader["worker_init_fn"](0)
    assert started == [0]  # the user's worker start runs after the recipe's
    no_workers = loader_arguments(Tuned(params={"batch_per_rank": 8, "device": "cpu"}), persistent_workers=True,
                                  prefetch_factor=4)
    assert "persistent_workers" not in no_workers and "prefetch_factor" not in no_workers  # refused without workers
    assert learning_rate(0.1, tuned) == pytest.approx(0.1 * tuned.lr_scale) and tuned.lr_scale < 1
    assert trainer_arguments(Tuned(params={"device": "cpu"}))["precision"] == "32-true"
    monkeypatch.setenv("AUTOTUNE_TRIAL", "1")  # a search's copy: nothing saved or logged, no end of its own
    searched = trainer_arguments(tuned, max_steps=5, logger=True)
    assert (searched["max_steps"], searched["max_epochs"], searched["logger"]) == (-1, -1, False)
    assert (searched["limit_val_batches"], searched["num_sanity_val_steps"]) == (0, 0)


def test_the_callback_tells_a_search_each_optimizer_step_its_samples_and_the_loss(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real Trainer in a search's copy, 4 optimizer steps of 2 micro-batches of 4, one step an epoch, its steps read
    from the pipe a search reads; the user's checkpoint and early stopping (on a validation a copy does not run)
    are left out of the copy."""
    lightning = _lightning()
    monkeypatch.setenv("AUTOTUNE_TRIAL", "1")
    import torch

    from autotune.integrations.lightning import AutotuneCallback

    class Line(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            losses.append(float(loss))
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    read, write = os.pipe()
    os.set_blocking(read, False)
    tuned = Tuned(params={"batch_per_rank": 4, "device": "cpu"}, _steps=StepReporter(write, loss_samples=16))
    torch.manual_seed(0)
    losses: list[float] = []
    data = torch.utils.data.TensorDataset(torch.randn(8, 3), torch.randn(8, 1))
    checkpoint = lightning.pytorch.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "saved"))
    stopping = lightning.pytorch.callbacks.EarlyStopping(monitor="val_loss")
    trainer = lightning.Trainer(max_steps=4, accumulate_grad_batches=2, accelerator="cpu", logger=False,
                                enable_model_summary=False, default_root_dir=str(tmp_path),
                                callbacks=[AutotuneCallback(tuned), checkpoint, stopping])
    trainer.fit(Line(), torch.utils.data.DataLoader(data, batch_size=4))
    assert not (tmp_path / "saved").exists() and trainer.global_step == 4
    os.close(write)
    told = [decode(line) for line in os.read(read, 1 << 16).decode().splitlines()]
    assert told[0] == Model(conv=False, conv_nd=False)  # the module prepared in the Trainer's setup
    steps = [m for m in told if isinstance(m, Step)]
    assert [s.samples for s in steps] == [8, 16, 24, 32]  # both micro-batches of each optimizer step
    (loss,) = [m for m in told if isinstance(m, Loss)]
    assert loss == Loss(16, pytest.approx(losses[3]))  # the micro-batch's own, not divided by the accumulation


def test_the_lightning_example_trains_under_autotune_run_with_the_recipes_knobs(tmp_path: Path, facts) -> None:
    """``examples/train_lightning.py``, 8 steps under ``autotune run``: the recipe's threads, batch and precision are
    the Trainer's (the user's own without a recipe: the first test)."""
    _lightning()
    params = {"threads": 1, "batch_per_rank": 32, "reference_batch": 64, "amp_dtype": "bfloat16",
              "channels_last": True, "device": "cpu"}
    recipe = Recipe(params=params, workload="script:train_lightning.py", fingerprint=facts.fingerprint, speedup=1.2)
    (tmp_path / "r.json").write_text(json.dumps(recipe.to_dict()))
    done = run_cli("run", "--recipe", "r.json", "--", sys.executable, str(EXAMPLE), cwd=tmp_path, timeout=180,
                   env={"MAX_STEPS": "8"})
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert (got["tuned"], got["threads"], got["batch"], got["precision"]) == (True, 1, 32, "bf16-mixed")
