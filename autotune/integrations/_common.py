"""What the framework integrations share: the recipe this process trains with, applied once, and a trainer's
steps told to a search through a model's forward hooks (a trainer's loop is not ``Tuned.step``'s)."""
from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..apply import RecipeSource, Tuned, apply
from ..recipe_file import RECIPE_VARIABLE
from ..steps import TRIAL

if TYPE_CHECKING:
    import torch

# Steps a trainer is given inside a search: it trains until the search stops its copy, never to its own end.
SEARCH_STEPS = 10**9

_applied: dict[str, Tuned] = {}  # the recipe applied in this process, once: apply() opens the search's pipe
_own: dict[str, int] = {}  # the batch the script's own arguments give a process, told to a search


def in_search() -> bool:
    """Whether this process is a copy a script-mode search started (``autotune search -- python train.py``)."""
    return os.environ.get(TRIAL) == "1"


def own_batch(batch: int | None = None) -> int:
    """The batch a process trains with by the script's own arguments: recorded where given (the user's arguments,
    before the recipe's), read where not (0: never given)."""
    if batch:
        _own["batch"] = int(batch)
    return _own.get("batch", 0)


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


def made_on_first_use(namespace: dict[str, Any], name: str, make: Callable[[], type]) -> Callable[[str], Any]:
    """A module's ``__getattr__`` that makes the class ``name`` on first use (``make`` imports its framework then)
    and keeps it in the module."""
    def get(attr: str) -> Any:
        if attr != name:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {attr!r}")
        namespace[name] = made = make()
        return made

    return get


def leading(batch: Any) -> int | None:
    """The samples of a batch: the leading dimension of its first tensor (in a tuple, list or dict), if any."""
    if hasattr(batch, "dim"):
        return int(batch.shape[0]) if batch.dim() > 0 else None
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (tuple, list)) else ()
    return next((n for n in map(leading, values) if n is not None), None)


def loss_of(output: Any) -> Any:
    """The loss in what a model or a training step returned: ``output.loss`` (a Hugging Face model given its
    labels), ``output["loss"]``, or the output itself where it is a scalar tensor; else None."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if loss is None and hasattr(output, "dim") and output.dim() == 0:
        loss = output
    return loss


class StepTeller:
    """Tells a search each optimizer step a trainer takes: when its batches came, the samples trained since the
    last step and the loss of the last micro-batch, either told by the trainer's hooks (``came``, ``returned``) or
    read from the model's training forward passes (``watch``). Nothing outside a search. ``accumulation``: the
    micro-batches of a step, by which a Hugging Face loss given the step's ``num_items_in_batch`` is divided."""

    def __init__(self, tuned: Tuned, accumulation: int = 1) -> None:
        # The pipe and the ranks, read once: a trainer sets up its process group before its callbacks prepare.
        self.steps, self.ranks, self.accumulation = tuned.search_steps, tuned.world_size, accumulation
        self.loss: torch.Tensor | None = None
        self._step_count = False  # the last forward pass was given the step's item count
        self._warned = False

    def watch(self, model: torch.nn.Module) -> None:
        """Count the samples and take the loss from ``model``'s training forward passes (evaluation's are no steps)."""
        if self.steps is not None:
            model.register_forward_pre_hook(self._counted, with_kwargs=True)
            model.register_forward_hook(self._returned)

    def batch(self) -> None:
        """The step's batches have come (what passed since the last step ended was the wait for data)."""
        if self.steps is not None:
            self.steps.batch()

    def came(self, batch: Any) -> None:
        """A micro-batch came: the wait for data, and its samples."""
        self.batch()
        self._count(batch)

    def returned(self, loss: Any) -> None:
        if loss is not None:
            self.loss = loss

    def stepped(self) -> None:
        if self.steps is None:
            return
        if self.loss is None and not self._warned:
            self._warned = True  # the quality guard then has no loss of this script to compare
            warnings.warn("autotune: the training step returned no loss to tell the search (a model given no labels, "
                          "a loss computed outside the model, or outputs as a tuple)", stacklevel=2)
        self.steps.stepped(self.loss)
        self.loss = None

    def loss_due(self) -> bool:
        """Whether the study takes its loss at the step now ending."""
        return self.steps is not None and self.steps.loss_due()

    def evaluate_after(self) -> None:
        """The trainer evaluates after the step where the loss is due: the loss waits for its figure."""
        if self.steps is not None:
            self.steps.deferred = True

    def evaluated(self, figure: float | None) -> None:
        """The trainer's held-out loss at that step (None: its evaluation gave none; the training loss is told)."""
        if self.steps is not None:
            self.steps.evaluated(figure)

    def _count(self, batch: Any) -> None:
        if self.steps is not None and (samples := leading(batch)) is not None:
            self.steps.micro(samples * self.ranks)

    def _counted(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if module.training:
            self._step_count = kwargs.get("num_items_in_batch") is not None
            self._count((*args, *(v for k, v in kwargs.items() if k != "num_items_in_batch")))

    def _returned(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if module.training and (loss := loss_of(output)) is not None:
            # Given the step's item count, a loss is the micro-batch's sum over the whole step's items.
            self.returned(loss * self.accumulation if self._step_count else loss)
