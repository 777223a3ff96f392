"""The Hugging Face Trainer integration: the recipe's knobs on ``TrainingArguments``, each optimizer step told to a
search through the callback, and the README's block run as written under ``autotune run``."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.apply import Tuned
from autotune.integrations import _common
from autotune.recipe import Recipe
from autotune.steps import Effect, Evaluation, Loss, Model, Step, StepReporter, decode

from ..conftest import needs_module, run_cli

README = Path(__file__).resolve().parents[2] / "README.md"
RECIPE = {"batch_per_rank": 32, "reference_batch": 16, "amp_dtype": "bfloat16", "num_workers": 2,
          "persistent_workers": True, "prefetch_factor": 4, "device": "cpu"}


def _transformers():
    return needs_module("transformers", "the Trainer integration needs transformers (pip install -e '.[test]')")


def test_the_recipe_sets_the_trainers_arguments_and_a_search_keeps_its_copy_training(tmp_path: Path) -> None:
    transformers = _transformers()
    from autotune.integrations.transformers import arguments, tuned_arguments

    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=16, learning_rate=1e-4,
                                          max_steps=2000, warmup_steps=0.1, save_strategy="steps",
                                          gradient_accumulation_steps=4)
    assert tuned_arguments(args) is args  # no recipe: the user's arguments, untouched
    tuned = Tuned(params=RECIPE)
    got = dataclasses.replace(args, **arguments(tuned, args))
    # the user's accumulation stands where the recipe has none of its own (no --global-batch)
    assert (got.per_device_train_batch_size, got.gradient_accumulation_steps, got.bf16, got.fp16) == (32, 4, 1, 0)
    loader = (got.dataloader_num_workers, got.dataloader_persistent_workers, got.dataloader_prefetch_factor)
    assert loader == (2, True, 4)
    assert (got.use_cpu, got.torch_compile, got.max_steps, got.save_strategy) == (True, False, 2000, "steps")
    assert got.learning_rate == pytest.approx(1e-4 * tuned.lr_scale) and tuned.lr_scale > 1  # batch 32 of 16
    first = dataclasses.replace(args, **arguments(Tuned(params={"amp_dtype": "bfloat16", "device": "cpu"}), args))
    # a search's first copy given no --batch-size: the arguments' own batch and learning rate, told to the search
    assert (first.per_device_train_batch_size, first.learning_rate, first.bf16) == (16, 1e-4, True)
    searched = dataclasses.replace(args, **arguments(tuned, args, search=True))
    assert searched.max_steps == _common.SEARCH_STEPS  # the search stops the copy, not the Trainer
    assert searched.get_warmup_steps(searched.max_steps) == 200  # 10% of the user's 2000 steps, as it trains
    # saving put past the copy's end, not off (a user's EarlyStoppingCallback refuses no evaluation); none reported
    assert (searched.save_strategy, searched.save_steps, searched.eval_strategy, searched.report_to) == \
        ("steps", _common.SEARCH_STEPS, "no", [])
    # saving the best: the copy's one evaluation would be its best, and save a checkpoint into the user's folder
    best = dataclasses.replace(args, save_strategy="best", eval_strategy="steps", metric_for_best_model="loss")
    assert {k: v for k, v in arguments(tuned, best, search=True).items() if k.startswith(("save_", "eval_s"))} == {
        "save_strategy": "steps", "save_steps": _common.SEARCH_STEPS, "eval_strategy": "steps",
        "eval_steps": _common.SEARCH_STEPS}


def test_a_loss_given_the_steps_item_count_is_told_as_its_micro_batchs_own() -> None:
    """A Hugging Face loss given ``num_items_in_batch`` sums a micro-batch over the whole step's items: told times
    the step's micro-batches, it is the micro-batch's mean, as ``Tuned.step`` tells it."""
    import types

    import torch

    class Summed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, x, num_items_in_batch=None):
            return types.SimpleNamespace(loss=(x * self.w).sum() / num_items_in_batch)

    read, write = os.pipe()
    teller = _common.StepTeller(Tuned(params={"device": "cpu"}, _steps=StepReporter(write, loss_samples=8)),
                                accumulation=2)
    model = Summed()
    teller.watch(model)
    for value in (1.0, 3.0):  # two micro-batches of 4 items, 8 in the step
        model(torch.full((4, 1), value), num_items_in_batch=torch.tensor(8))
    teller.stepped()
    os.close(write)
    told = [decode(line) for line in os.read(read, 1 << 16).decode().splitlines()]
    assert [m for m in told if isinstance(m, Step)][0].samples == 8
    assert [m for m in told if isinstance(m, Loss)] == [Loss(8, 3.0)]  # the second micro-batch's mean, not 1.5


def test_the_callback_tells_a_search_each_optimizer_step_its_samples_and_the_loss(tmp_path: Path) -> None:
    """A real Trainer, 4 optimizer steps of 2 micro-batches of 4, its steps read from the pipe a search reads; its
    evaluation, moved past the copy's end as a search's copy has it, runs once, where the loss is due, and its
    held-out loss is told with the training loss."""
    transformers = _transformers()
    import torch

    from autotune.integrations.transformers import AutotuneCallback, tuned_arguments

    read, write = os.pipe()
    os.set_blocking(read, False)
    tuned = Tuned(params={"batch_per_rank": 4, "device": "cpu"}, _steps=StepReporter(write, loss_samples=16))
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=2)
    data = [{"input_ids": torch.randint(0, 64, (8,)), "labels": i % 2} for i in range(64)]
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=4,
                                          gradient_accumulation_steps=2, use_cpu=True, report_to="none",
                                          save_strategy="no", disable_tqdm=True, eval_strategy="steps",
                                          eval_steps=_common.SEARCH_STEPS)
    args = tuned_arguments(args, tuned)
    evaluations: list[int] = []
    trainer = transformers.Trainer(model=transformers.BertForSequenceClassification(config), args=args,
                                   train_dataset=data, eval_dataset=data[:8], callbacks=[AutotuneCallback(tuned)])
    trainer.add_callback(type("Seen", (transformers.TrainerCallback,), {
        "on_evaluate": lambda self, args, state, control, **kw: evaluations.append(state.global_step)}))
    trainer.train()
    os.close(write)
    told = [decode(line) for line in os.read(read, 1 << 16).decode().splitlines()]
    # the model prepared at the Trainer's start, told with the batch the user's arguments gave
    assert told[0] == Model(conv=False, conv_nd=False, batch=4)
    steps = [m for m in told if isinstance(m, Step)]
    assert [s.samples for s in steps] == [8, 16, 24, 32]  # both micro-batches of each optimizer step
    assert all(a.ended < b.ended for a, b in zip(steps, steps[1:], strict=False))
    assert [m for m in told if isinstance(m, Effect)] == [Effect(torch.get_num_threads())]
    (loss,) = [m for m in told if isinstance(m, Loss)]
    assert loss.samples == 16 and 0 < loss.value < 5  # once, at the step that reached 16 samples
    assert evaluations == [2, 4]  # after that step (and at the end of training, the Trainer's own: told nothing)
    (figure,) = [m for m in told if isinstance(m, Evaluation)]
    assert told.index(figure) == told.index(loss) + 1 and told.index(loss) > told.index(steps[1])
    assert figure.samples == 16 and 0 < figure.value < 5 and not figure.higher_is_better and figure.took_s > 0


def _readme_block() -> str:
    text = README.read_text()
    (block,) = re.findall(r"```python\n(from transformers import .*?)```", text, re.S)
    return block


def test_the_readmes_trainer_block_runs_as_written_under_autotune_run(tmp_path: Path, facts) -> None:
    """The block word for word, on a 2-layer BERT-style classifier built from its config (nothing downloaded),
    its 2,000 steps cut to 12 by the arguments' class: the recipe's threads, batch, workers and learning rate are
    the Trainer's."""
    _transformers()
    prologue = (
        "import dataclasses, json, sys, torch, transformers\n"
        "@dataclasses.dataclass\n"
        "class Short(transformers.TrainingArguments):\n"
        "    def __post_init__(self):\n"
        "        self.max_steps, self.use_cpu, self.disable_tqdm = min(self.max_steps, 12), True, True\n"
        "        super().__post_init__()\n"
        "torch.manual_seed(0)\n"
        "model = transformers.BertForSequenceClassification(transformers.BertConfig(vocab_size=64, hidden_size=16,\n"
        "    num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, max_position_embeddings=16))\n"
        "train = [{'input_ids': torch.randint(0, 64, (8,)), 'labels': i % 2} for i in range(256)]\n"
        "held_out = train[:32]\n"
        "sys.modules['transformers'].TrainingArguments = Short  # what 'from transformers import' reads\n"
    )
    epilogue = (
        "a = trainer.args\n"
        "print(json.dumps({'batch': a.per_device_train_batch_size, 'workers': a.dataloader_num_workers,\n"
        "    'persistent': a.dataloader_persistent_workers, 'lr': a.learning_rate,\n"
        "    'threads': torch.get_num_threads(), 'steps': trainer.state.global_step}))\n"
    )
    (tmp_path / "train_hf.py").write_text(prologue + _readme_block() + epilogue)
    params = {"threads": 1, "batch_per_rank": 8, "reference_batch": 16, "num_workers": 1,
              "persistent_workers": True, "device": "cpu"}
    recipe = Recipe(params=params, workload="script:train_hf.py", fingerprint=facts.fingerprint, speedup=1.2)
    (tmp_path / "r.json").write_text(json.dumps(recipe.to_dict()))
    done = run_cli("run", "--recipe", "r.json", "--", sys.executable, "train_hf.py", cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    learning_rate = 5e-5 * Tuned(params=params).lr_scale  # TrainingArguments' default, for batch 8 of 16
    assert got == {"batch": 8, "workers": 1, "persistent": True, "lr": pytest.approx(learning_rate), "threads": 1,
                   "steps": 12}


def test_importing_the_integrations_imports_no_framework() -> None:
    """Each framework is imported on first use of its callback, so a plain ``autotune`` install imports them."""
    code = ("import sys, autotune.integrations.transformers, autotune.integrations.lightning\n"
            "print(sorted({'transformers', 'lightning', 'pytorch_lightning'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr[-2000:]
