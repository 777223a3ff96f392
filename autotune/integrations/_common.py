"""What the framework integrations share: the recipe this process trains with, applied once, and a trainer's
steps told to a search through a model's forward hooks (a trainer's loop is not ``Tuned.step``'s)."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..apply import RecipeSource, Tuned, apply
from ..recipe_file import RECIPE_VARIABLE
from ..steps import TRIAL

if TYPE_CHECKING:
    import torch

# Steps a trainer is given inside a search: it trains until the search stops its copy, never to its own end.
SEARCH_STEPS = 10**9

_applied: dict[str, Tuned] = {}  # the recipe applied in this process, once: apply() opens the search's pipe


def in_search() -> bool:
    """Whether this process is a copy a script-mode search started (``autotune search -- python train.py``)."""
    return os.environ.get(TRIAL) == "1"


def tuned(recipe: RecipeSource | Tuned = None) -> Tuned | None:
    """The recipe in effect in this process: ``recipe`` where given (a ``Tuned`` that ``autotune.apply()``
    returned is taken as it is), else the one ``autotune run`` or a search's copy was started with
    (``AUTOTUNE_RECIPE``), applied on the first call and the same ``Tuned`` after it; None without either (the
    trainer then runs as the user wrote it)."""
    if isinstance(recipe, Tuned):
        _applied["tuned"] = recipe
        return recipe
    if "tuned" in _applied:
        return _applied["tuned"]
    if recipe is None and not os.environ.get(RECIPE_VARIABLE):
        return None
    _applied["tuned"] = applied = apply(recipe)
    return applied


class StepTeller:
    """Tells a search each optimizer step a trainer takes: the samples of the training forward passes since the
    last step (their first tensor's leading dimension) and the loss the last one returned (``output.loss``, as a
    Hugging Face model computes it from its labels, or the output itself where it is a scalar tensor)."""

    def __init__(self, tuned: Tuned) -> None:
        self.tuned = tuned
        self.loss: torch.Tensor | None = None

    def watch(self, model: torch.nn.Module) -> None:
        """Hook ``model``'s forward passes (training mode only; evaluation's are not steps)."""
        if self.tuned.search_steps is None:
            return
        model.register_forward_pre_hook(self._counted, with_kwargs=True)
        model.register_forward_hook(self._returned)

    def batch(self) -> None:
        """The step's batches have come (what passed since the last step ended was the wait for data)."""
        if (steps := self.tuned.search_steps) is not None:
            steps.batch()

    def stepped(self) -> None:
        if (steps := self.tuned.search_steps) is not None and self.loss is not None:
            steps.stepped(self.loss)

    def _counted(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        steps = self.tuned.search_steps
        if steps is None or not module.training:
            return
        first = next((v for v in (*args, *kwargs.values()) if hasattr(v, "dim") and v.dim() > 0), None)
        if first is not None:
            steps.micro(int(first.shape[0]) * self.tuned.world_size)

    def _returned(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if not module.training:
            return
        loss = getattr(output, "loss", None)
        if loss is None and isinstance(output, dict):
            loss = output.get("loss")
        if loss is None and hasattr(output, "dim") and output.dim() == 0:
            loss = output
        if loss is not None:
            self.loss = loss
