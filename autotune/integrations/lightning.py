"""Lightning's ``Trainer``, tuned by a recipe and searched (``pip install 'autotune[lightning]'``)::

    import lightning as L
    from autotune.integrations.lightning import AutotuneCallback, learning_rate, loader_arguments, trainer_arguments

    loader = DataLoader(train, shuffle=True, **loader_arguments(batch_size=32))
    model = MyModule(lr=learning_rate(1e-3))             # the module's optimizer takes the scaled learning rate
    trainer = L.Trainer(**trainer_arguments(max_steps=2000), callbacks=[AutotuneCallback()])
    trainer.fit(model, loader)

Each of the three applies the recipe this process was started with (``autotune run``, or a search's copy) as
``autotune.apply()`` does, once, and returns the user's arguments with the recipe's: the DataLoader's batch and
settings, the learning rate scaled for that batch, the Trainer's precision in Lightning's own strings
(``"bf16-mixed"``, ``"16-mixed"``, ``"32-true"``), accelerator and, where the recipe accumulates, gradient
accumulation. ``AutotuneCallback`` prepares the module as ``apply()`` does (pruning, channels_last) in the Trainer's
``setup``, before the optimizers are made, and, in a search's copy, tells the search each optimizer step. Without a
recipe nothing changes. In a search's copy the Trainer also checkpoints, validates, stops early, logs and shows
nothing, and trains until the search stops the copy.
lightning (or pytorch_lightning) is imported on first use of the callback, never at import.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..apply import RecipeSource, Tuned
from ._common import StepTeller, in_search, loss_of, made_on_first_use, own_batch, tuned

if TYPE_CHECKING:
    AutotuneCallback: type  # made on first use (``__getattr__``)

PRECISION = {"bfloat16": "bf16-mixed", "float16": "16-mixed"}  # anything else trains in "32-true"
# In a search's copy: no validation, logger or summary, no end but the search's. Checkpoints, early stopping and
# the progress bar go in the callback's ``setup`` (switched off here, a user's own such callback is refused).
_IN_SEARCH = {"logger": False, "enable_model_summary": False, "limit_val_batches": 0, "num_sanity_val_steps": 0,
              "max_steps": -1, "max_epochs": -1, "max_time": None}


def trainer_arguments(recipe: RecipeSource | Tuned = None, **kwargs: Any) -> dict[str, Any]:
    """``Trainer(**kwargs)``'s arguments with the recipe's precision, accelerator and accumulation (where the recipe
    accumulates); ``kwargs`` as given without a recipe."""
    applied = tuned(recipe)
    if applied is None:
        return kwargs
    if applied.params.get("compile_mode", "none") != "none":
        warnings.warn(f"the recipe compiles the model (mode {applied.params['compile_mode']!r}): a Trainer does not; "
                      f"pass torch.compile(model, mode=...) to fit", stacklevel=2)
    out = {**kwargs, "precision": PRECISION.get(str(applied.params.get("amp_dtype")), "32-true"),
           "accelerator": "gpu" if applied.device == "cuda" else "cpu"}
    if "global_batch" in applied.params:  # else the user's own accumulation stands
        out["accumulate_grad_batches"] = applied.accumulation
    return {**out, **_IN_SEARCH} if in_search() else out


def loader_arguments(recipe: RecipeSource | Tuned = None, **kwargs: Any) -> dict[str, Any]:
    """``DataLoader(dataset, **kwargs)``'s arguments with the recipe's batch, workers, pinning, persistence and
    prefetch; ``kwargs`` as given without a recipe."""
    own_batch(kwargs.get("batch_size"))
    applied = tuned(recipe)
    if applied is None:
        return kwargs
    recipe_kwargs = applied.dataloader_kwargs
    out = {**kwargs, **recipe_kwargs}
    if applied.has_batch:  # a search's first copy, told no --batch-size, loads the user's own
        out["batch_size"] = applied.batch_size
    if not recipe_kwargs["num_workers"]:  # the DataLoader refuses these without workers
        out.pop("persistent_workers", None)
        out.pop("prefetch_factor", None)
    if kwargs.get("worker_init_fn") and recipe_kwargs.get("worker_init_fn"):
        out["worker_init_fn"] = _both(recipe_kwargs["worker_init_fn"], kwargs["worker_init_fn"])
    return out


def _both(first: Callable[[int], Any], then: Callable[[int], Any]) -> Callable[[int], None]:
    """A DataLoader worker's start: the recipe's (its CPUs), then the user's."""
    def start(worker_id: int) -> None:
        first(worker_id)
        then(worker_id)
    return start


def learning_rate(value: float, recipe: RecipeSource | Tuned = None) -> float:
    """``value`` (the learning rate tuned at the batch the search was told) scaled for the recipe's batch."""
    applied = tuned(recipe)
    return value if applied is None else value * applied.lr_scale  # 1 where the recipe sets no batch


def _callback_class() -> type:
    try:
        from lightning.pytorch import Callback
        from lightning.pytorch.callbacks import Checkpoint, EarlyStopping, ProgressBar
    except ImportError:
        from pytorch_lightning import Callback  # type: ignore[assignment]
        from pytorch_lightning.callbacks import Checkpoint, EarlyStopping, ProgressBar  # type: ignore[assignment]
    left_out = (Checkpoint, EarlyStopping, ProgressBar)  # in a search's copy: nothing saved, no validation, no bar

    class AutotuneCallback(Callback):
        """Prepares the module as ``autotune.apply()`` does (in ``setup``, before the optimizers are made) and tells
        a search each optimizer step, its samples and the loss; nothing without a recipe."""

        def __init__(self, recipe: RecipeSource | Tuned = None) -> None:
            self.recipe = recipe
            self.teller: StepTeller | None = None
            self.steps = 0  # the Trainer's optimizer steps told so far

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            applied = tuned(self.recipe)
            if stage != "fit" or applied is None or self.teller is not None:
                return
            applied.prepare_in_place(pl_module, batch=own_batch())
            self.teller = StepTeller(applied)
            if in_search():
                trainer.callbacks = [c for c in trainer.callbacks if not isinstance(c, left_out)]

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.steps = trainer.global_step  # a run resumed from a checkpoint starts past 0

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if self.teller is not None:
                self.teller.came(batch)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if self.teller is None:
                return
            loss = loss_of(outputs)  # divided by the accumulated micro-batches: the micro-batch's own, as step()'s
            self.teller.returned(None if loss is None else loss * trainer.accumulate_grad_batches)
            if trainer.global_step > self.steps:
                self.steps = trainer.global_step
                self.teller.stepped()

    return AutotuneCallback


__getattr__ = made_on_first_use(globals(), "AutotuneCallback", _callback_class)
