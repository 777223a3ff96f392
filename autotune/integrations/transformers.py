"""Hugging Face ``Trainer``, tuned by a recipe and searched (``pip install 'autotune[transformers]'``)::

    from transformers import Trainer, TrainingArguments
    from autotune.integrations.transformers import AutotuneCallback, tuned_arguments

    args = tuned_arguments(TrainingArguments(output_dir="out", per_device_train_batch_size=16, max_steps=2000))
    trainer = Trainer(model=model, args=args, train_dataset=train, callbacks=[AutotuneCallback()])
    trainer.train()

``tuned_arguments`` applies the recipe this process was started with (``autotune run``, or a search's copy) as
``autotune.apply()`` does and maps its in-process knobs onto the arguments; ``AutotuneCallback`` prepares the
model as ``apply()`` does (pruning, channels_last) before the optimizer is made and, in a search's copy, tells
the search each optimizer step. Without a recipe neither changes anything. In a search's copy the arguments
also save no checkpoint, report to no tracker and train until the search stops the copy (the warm-up taken in steps
of the user's ``max_steps``); where they evaluate, the copy evaluates once, at the step where the search takes its
loss, and the quality guard compares that held-out loss (``eval_loss``), not the training loss. transformers is
imported on first use, never at import.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING, Any

from .. import search_spaces as spaces
from ..apply import RecipeSource, Tuned
from ._common import SEARCH_STEPS, StepTeller, in_search, made_on_first_use, own_batch, tuned

if TYPE_CHECKING:
    from transformers import TrainingArguments

    AutotuneCallback: type  # made on first use (``__getattr__``)

# In a search's copy: nothing pushed or reported, no progress bar in the copy's log; evaluating and saving are
# put past the copy's end (``_later``) rather than off, which a user's EarlyStoppingCallback refuses.
_IN_SEARCH = {"report_to": "none", "push_to_hub": False, "disable_tqdm": True, "eval_on_start": False}


def _later(strategy: Any) -> bool:
    """Whether an evaluation or save strategy acts at steps, epochs or a best evaluation (saving; the copy's one
    evaluation would be its best): then moved to the search's last step."""
    return str(getattr(strategy, "value", strategy)) in ("steps", "epoch", "best")


def _eval_loss(metrics: dict[str, Any]) -> float | None:
    """The evaluation's loss: ``eval_loss``, or with several evaluation sets (``eval_NAME_loss``) the first set's;
    None where there is none (the training loss is told then)."""
    if "eval_loss" in metrics:
        return float(metrics["eval_loss"])
    named = [key for key in metrics if key.startswith("eval_") and key.endswith("_loss")]
    return float(metrics[named[0]]) if named else None


def arguments(applied: Tuned, args: Any, *, search: bool = False) -> dict[str, Any]:
    """The ``TrainingArguments`` fields the recipe sets, by name: batch, accumulation, learning rate, DataLoader,
    precision, compilation and device (only the fields this transformers has)."""
    params = applied.params
    loader = spaces.data.dataloader_kwargs(params)
    amp, mode = params.get("amp_dtype"), params.get("compile_mode", "none")
    changes: dict[str, Any] = {
        "dataloader_num_workers": loader["num_workers"],
        "dataloader_pin_memory": loader["pin_memory"],
        "dataloader_persistent_workers": loader.get("persistent_workers", False),
        "dataloader_prefetch_factor": loader.get("prefetch_factor"),
        "bf16": amp == "bfloat16", "fp16": amp == "float16",
        "torch_compile": mode != "none", "torch_compile_mode": None if mode == "none" else mode,
        "use_cpu": applied.device == "cpu",
    }
    if applied.has_batch:  # a search's first copy, told no --batch-size, trains with the arguments' own
        changes.update(per_device_train_batch_size=applied.batch_size, learning_rate=args.learning_rate
                       * applied.lr_scale)
    if "global_batch" in params:  # the recipe accumulates; else the user's own accumulation stands
        changes["gradient_accumulation_steps"] = applied.accumulation
    if applied.device == "cuda" and "tf32_matmul" in params:  # or the arguments' own TF32 rule would set it
        changes["tf32"] = bool(params["tf32_matmul"])
    if search:
        changes.update(_IN_SEARCH)
        for kind in ("eval", "save"):
            if _later(getattr(args, f"{kind}_strategy")):
                changes.update({f"{kind}_strategy": "steps", f"{kind}_steps": SEARCH_STEPS})
        if args.max_steps > 0:  # the schedule's warm-up in the user's steps, not a share of the search's
            changes.update(warmup_steps=args.get_warmup_steps(args.max_steps), warmup_ratio=0.0)
        if args.max_steps > 0 or not 0 < args.warmup_steps < 1:
            changes["max_steps"] = SEARCH_STEPS
    names = {f.name for f in dataclasses.fields(args)}
    return {name: value for name, value in changes.items() if name in names}


def tuned_arguments(args: TrainingArguments, recipe: RecipeSource | Tuned = None) -> TrainingArguments:
    """``args`` with the recipe's knobs (``arguments``), the recipe applied to this process; ``args`` itself
    where there is no recipe (``recipe``: a recipe file, id, ``Recipe``, params or what ``autotune.apply()``
    returned; else ``AUTOTUNE_RECIPE``)."""
    own_batch(args.per_device_train_batch_size)
    applied = tuned(recipe)
    if applied is None:
        return args
    if applied.worker_cpus and applied.dataloader_kwargs["num_workers"]:
        warnings.warn("the recipe's CPUs for DataLoader workers are not applied: the Trainer starts its workers "
                      "itself", stacklevel=2)
    return dataclasses.replace(args, **arguments(applied, args, search=in_search()))


def _callback_class() -> type:
    from transformers import TrainerCallback

    class AutotuneCallback(TrainerCallback):
        """Prepares the model as ``autotune.apply()`` does (at the end of the Trainer's ``__init__``, before the
        optimizer is made; in place) and tells a search each optimizer step and the loss; nothing without a recipe."""

        def __init__(self, recipe: RecipeSource | Tuned = None) -> None:
            self.recipe = recipe
            self.teller: StepTeller | None = None
            self.prepared: Any = None  # the model prepared: pruned once, never twice
            self.evaluates = False

        def _prepare(self, args: Any, model: Any) -> None:
            applied = tuned(self.recipe)
            if applied is None or model is None or model is self.prepared:
                return
            self.prepared = model
            applied.prepare_in_place(model, batch=own_batch())
            self.teller = StepTeller(applied, args.gradient_accumulation_steps)
            self.teller.watch(model)
            # where the user's arguments evaluate (moved past the copy's end), the copy evaluates once, at the step
            # where the search takes its loss: the held-out loss is what the quality guard compares
            self.evaluates = args.eval_steps == SEARCH_STEPS and _later(args.eval_strategy)
            if self.evaluates:
                self.teller.evaluate_after()

        def on_init_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            self._prepare(args, model)

        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            # A callback added after the Trainer was made, or a model its model_init made: prepared in place.
            self._prepare(args, model)

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.teller is not None:
                self.teller.batch()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.teller is not None:
                if self.evaluates and self.teller.loss is not None and self.teller.loss_due():
                    control.should_evaluate = True  # once: the loss and the figure are told together
                self.teller.stepped()

        def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
            if self.teller is not None and self.evaluates:
                self.teller.evaluated(_eval_loss(metrics or {}))

    return AutotuneCallback


__getattr__ = made_on_first_use(globals(), "AutotuneCallback", _callback_class)
