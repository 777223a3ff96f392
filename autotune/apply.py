"""``autotune.apply()``: put a recipe into effect in the user's training process.

The trial runner calls the same function inside every trial subprocess, so what was measured is what
is applied. Environment-level knobs (thread variables, LD_PRELOAD, CPU affinity) must be in effect
before Python starts: ``apply()`` cannot change them afterwards and warns, naming the fix
(``autotune run --recipe FILE -- python train.py``, or ``set -a; . ./best.env; set +a``).

Example::

    import autotune, torch
    tuned = autotune.apply("best.env")
    model = tuned.prepare_model(MyNet())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * tuned.lr_scale)
    model, optimizer = tuned.prepare(model, optimizer)
    loader = torch.utils.data.DataLoader(dataset, batch_size=tuned.batch_size, shuffle=True,
                                         **tuned.dataloader_kwargs)
    for batch in loader:
        x, y = tuned.to_device(*batch)
        with tuned.autocast():
            loss = torch.nn.functional.cross_entropy(model(x), y)
        tuned.step(loss, optimizer)
"""
from __future__ import annotations

import contextlib
import logging
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from . import distributed
from . import search_spaces as spaces
from .errors import DeviceMissingError, UsageError, printable
from .hardware_check import ALLOW_OTHER_HARDWARE, check_machine, cuda_missing
from .recipe import Recipe, checked, format_note
from .recipe_file import load_recipe_file, recipe_from_variable
from .steps import Model, StepReporter

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data.distributed import DistributedSampler

    from .probes import Facts

log = logging.getLogger(__name__)

# What apply() takes: a recipe file, a recipe id, a Recipe, a params dict, or None (AUTOTUNE_RECIPE).
RecipeSource: TypeAlias = str | Path | int | Recipe | dict[str, Any] | None
# Datasets, batches and forward outputs are the user's own (any map-style dataset, any batch structure): Any.


@dataclass
class Tuned:
    """What a training loop needs from a recipe; returned by ``apply()``."""

    params: dict[str, Any]
    device: str = "cpu"
    warnings: list[str] = field(default_factory=list)
    worker_cpus: list[int] | None = None  # the DataLoader workers' CPUs, apart from the compute threads'
    in_effect: dict[str, Any] = field(default_factory=dict)  # knob -> what prepare_model/prepare/a step did
    _scaler: torch.amp.GradScaler | None = None
    _micro_step: int = 0
    _ddp: DistributedDataParallel | None = None  # what prepare_model wrapped the model in, with several ranks
    _steps: StepReporter | None = None  # a script-mode trial's pipe to the search (``autotune.steps``)
    _model: torch.nn.Module | None = None  # the model prepared (``switch`` converts it)
    _autocasts: bool = False  # the script's forward passes run under ``autocast``: a precision can switch
    _relayout: bool = False  # a switch changed the layout: the optimizer's state follows at the next step

    def __post_init__(self) -> None:
        self._scaler = spaces.amp.grad_scaler(self.params, self.device)
        if self._steps is not None:
            self._steps.switcher = self.switch

    def switch(self, params: dict[str, Any]) -> str | None:
        """Train on with ``params`` from the next step, where they differ from this recipe only in knobs a running
        process can change (``spaces.in_place``): a search's copy asked to (``steps.Switched``). Returns why not,
        or None. A larger batch takes effect only where the script builds its DataLoader from ``batch_size`` again
        (its steps then tell it), and the learning rate it scaled once stays."""
        import torch

        changed = sorted(k for k in {*params, *self.params} if params.get(k) != self.params.get(k))
        movable = set(spaces.in_place())
        fixed = [k for k in changed if k not in movable]
        if fixed:
            return f"{', '.join(fixed)} cannot change in a running process"
        if "channels_last" in changed and self._model is None:
            return "channels_last: no model was prepared"
        if changed and self.world_size > 1:
            return "a recipe of several processes: its other ranks would train on with the one before"
        if "amp_dtype" in changed and not self._autocasts:
            return "amp_dtype: the script runs no forward pass under tuned.autocast() (its trainer set it once)"
        if "batch_per_rank" in changed and not (self._steps is not None and self._steps.moves):
            return ("batch_per_rank: no batch the script moves with tuned.to_device leads with its batch (its steps "
                    "would not tell it)")
        self.params = dict(params)
        if "amp_dtype" in changed:  # float16's scaler, made again only where the precision changes
            self._scaler = spaces.amp.grad_scaler(self.params, self.device)
        if "channels_last" in changed and self._model is not None:
            spaces.amp.relayout(params, self._model)
            self._relayout = True
        if "matmul_precision" in changed and self.device == "cpu":
            torch.set_float32_matmul_precision(spaces.matmul.wanted(params))
        return None

    @property
    def batch_size(self) -> int:
        """This process's DataLoader batch: the recipe's ``batch_per_rank`` (a format-1 recipe's
        ``batch_size`` was summed over the ranks: its share)."""
        if "batch_size" in self.params:  # format 1, or a params dict written that way
            return max(1, int(self.params["batch_size"]) // self.world_size)
        if not self.has_batch:
            raise UsageError("the recipe sets no batch: a script-mode search given no --batch-size takes the batch "
                             "a framework integration tells (autotune search --batch-size N -- python train.py)")
        return spaces.batch.per_rank(self.params)

    @property
    def world_size(self) -> int:
        """How many data-parallel processes train together (1 without a process group)."""
        return distributed.world()[1]

    @property
    def rank(self) -> int:
        return distributed.world()[0]

    @property
    def step_samples(self) -> int:
        """Samples of one optimizer step over all ranks and accumulated micro-batches."""
        return self.batch_size * self.world_size * self.accumulation

    def sampler(self, dataset: Any, *, shuffle: bool = True, seed: int = 0) -> DistributedSampler[Any] | None:
        """This rank's shard of ``dataset`` (a ``DistributedSampler``), or None with one process: pass it as
        ``DataLoader(..., sampler=s, shuffle=s is None)`` and call ``s.set_epoch(epoch)`` every epoch."""
        return distributed.sampler(dataset, shuffle=shuffle, seed=seed)

    @property
    def accumulation(self) -> int:
        """Micro-batches per optimizer step (``--global-batch``), 1 otherwise."""
        return spaces.batch.accumulation(self.params)

    @property
    def lr_scale(self) -> float:
        """Multiply the learning rate tuned at the reference batch size by this (1 where the recipe sets no batch)."""
        if not self.has_batch:
            return 1.0
        reference = self.params.get("reference_batch") or spaces.batch.global_size(self.params)
        return spaces.batch.lr_scale(self.params, int(reference))

    @property
    def dataloader_kwargs(self) -> dict[str, Any]:
        return spaces.data.dataloader_kwargs(self.params, self.worker_cpus)

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """Context for the forward pass and the loss."""
        self._autocasts = True
        return spaces.amp.autocast(self.params, self.device)

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Prune, move, convert and compile the model as the recipe says; create the optimizer after this."""
        model = self._note("sparsity", spaces.sparsity.prepare_model(self.params, model, self.device)).model
        model = model.to(self.device)
        model = spaces.amp.prepare_model(self.params, model, self.device).model
        from torch.nn.parallel import DistributedDataParallel

        options = spaces.ddp.ddp_options(self.params, model)
        wrapped = distributed.wrap_model(model, self.device, options)  # DDP with several ranks; compiled around it
        if isinstance(wrapped, DistributedDataParallel):
            self._ddp, self.in_effect["ddp"] = wrapped, options
            distributed.sync_next_backward(self._ddp, self._steps_next())
        model = spaces.compilation.prepare_model(self.params, wrapped, self.device).model
        self._model = model
        self._watch_first_step(model)
        self._tell_model(model)
        return model

    def prepare_in_place(self, model: torch.nn.Module, *, batch: int = 0) -> torch.nn.Module:
        """What ``prepare_model`` does to the module itself (pruning, channels_last), for a trainer that moves,
        wraps and compiles the model on its own (``autotune.integrations``); call it before the optimizer is made.
        ``batch``: the batch a process trains with by the script's own arguments, told to a search, which takes it
        for the defaults' batch when it was given none."""
        model = self._note("sparsity", spaces.sparsity.prepare_model(self.params, model, self.device)).model
        model = spaces.amp.prepare_model(self.params, model, self.device).model
        self._model = model
        self._watch_first_step(model)
        self._tell_model(model, batch)
        return model

    @property
    def search_steps(self) -> StepReporter | None:
        """The pipe to the search in a script-mode copy (rank 0), for a trainer whose loop is not ``step``'s;
        None outside a search."""
        return self._steps if self.rank == 0 else None

    def _tell_model(self, model: torch.nn.Module, batch: int = 0) -> None:
        if self._steps is not None and self.rank == 0:
            # The launcher's ranks: a recipe of one process joins no group, and each rank would train alone.
            launched = spaces.processes.launched_ranks()
            ranks = max(self.world_size, launched[1] if launched else 1)
            self._steps.model(Model(*spaces.conv_layers(model), ranks=ranks, batch=batch))

    @property
    def has_batch(self) -> bool:
        """Whether the recipe sets the batch (a search's first copy, given no ``--batch-size``, has none: the
        script's own stands, and a framework integration tells it)."""
        return "batch_per_rank" in self.params or "batch_size" in self.params

    def _watch_first_step(self, model: torch.nn.Module) -> None:
        """Record in ``in_effect["amp"]`` what the first training forward pass really ran with (autocast
        dtype, output dtype, memory format), then stop watching. The hook is on the outermost module, so
        it runs outside ``torch.compile``'s graph."""

        def hook(module: torch.nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
            if not module.training or "amp" in self.in_effect:
                return
            handle.remove()
            self.in_effect["amp"] = spaces.amp.forward_in_effect(self.device, self.unwrap(module), inputs, output)

        handle = model.register_forward_hook(hook)

    def prepare(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """What needs the model and its optimizer together (``ipex.optimize``); call after creating the
        optimizer for the model ``prepare_model`` returned: ``model, optimizer = tuned.prepare(model, optimizer)``."""
        prepared = self._note("ipex", spaces.ipex.prepare(self.params, model, optimizer))
        # ipex's prepare always returns an optimizer (its own or the one given)
        return prepared.model, prepared.optimizer if prepared.optimizer is not None else optimizer

    def _note(self, knob: str, prepared: spaces.Prepared) -> spaces.Prepared:
        if prepared.done:
            self.in_effect[knob] = prepared.done
        self.warnings.extend(prepared.problems)
        for problem in prepared.problems:
            warnings.warn(problem, stacklevel=3)
        return prepared

    def scale_lr(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Scale an optimizer's learning rates for this batch size (see ``lr_scale``)."""
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * self.lr_scale
        return optimizer

    @staticmethod
    def unwrap(model: torch.nn.Module) -> torch.nn.Module:
        """The module under ``torch.compile`` and ``DistributedDataParallel`` (for evaluation and saving)."""
        model = getattr(model, "_orig_mod", model)
        from torch.nn.parallel import DistributedDataParallel

        return model.module if isinstance(model, DistributedDataParallel) else model

    def to_device(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self._steps is not None:
            self._steps.batch(len(tensors[0]) if tensors and tensors[0].dim() else None,
                              self.batch_size if self.has_batch else None)
        non_blocking = bool(self.params.get("pin_memory"))
        moved = tuple(t.to(self.device, non_blocking=non_blocking) for t in tensors)
        return spaces.amp.prepare_batch(self.params, moved)

    def _steps_next(self) -> bool:
        """Whether the next micro-batch is the one that steps the optimizer."""
        return (self._micro_step + 1) % self.accumulation == 0

    def finish(self) -> None:
        """The end of training: leave the process group that ``apply()`` joined (all ranks call it; none
        with one process). Rather than ``torch.distributed.destroy_process_group()`` alone: a gloo rank
        that leaves while another completes its last all-reduce can abort that one."""
        distributed.finish()

    def evaluate(self, figure: Callable[[], float], *, higher_is_better: bool = False) -> None:
        """Give a search your own held-out figure (a validation loss, or a metric with ``higher_is_better``): its
        quality guard then compares it, not the training loss. In a search's copy ``figure()`` is called once,
        right after the step where the study takes its loss, untimed; it switches the model to evaluation and back
        itself, as your validation does. Outside a search it is never called."""
        if self._steps is not None and self.rank == 0:
            self._steps.evaluator = (figure, higher_is_better)

    def step(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> bool:
        """Backward (scaled for float16, divided over accumulated micro-batches), then the optimizer
        step once every ``accumulation`` calls. Returns True when the optimizer stepped. In a script-mode
        trial it tells the search the step's end and samples (``autotune.steps``)."""
        told, loss = loss, loss / self.accumulation
        if self._micro_step % self.accumulation == 0:
            # before the window's first backward, as a plain loop: after the step, glibc re-faults large grads each step
            optimizer.zero_grad(set_to_none=True)
        if self._scaler is not None:
            self._scaler.scale(loss).backward()
        else:
            loss.backward()
        self._micro_step += 1
        distributed.sync_next_backward(self._ddp, self._steps_next())  # no all-reduce before the stepping one
        if self._steps is not None and self.rank == 0:  # rank 0 tells for all: its samples times the ranks
            self._steps.micro((self._steps.samples_of() or self.batch_size) * self.world_size)
        if self._micro_step % self.accumulation:
            return False
        if self._relayout:
            spaces.amp.relayout_state(optimizer)
            self._relayout = False
        if self._scaler is not None:
            self._scaler.step(optimizer)
            self._scaler.update()
        else:
            optimizer.step()
        if self._steps is not None and self.rank == 0:
            self._steps.stepped(told)
        return True


def _resolve(source: RecipeSource, storage: str | None) -> Recipe:
    if source is None:
        text = os.environ.get("AUTOTUNE_RECIPE")
        if not text:
            raise UsageError("apply() without a recipe needs AUTOTUNE_RECIPE: load an env file or use 'autotune run'")
        return recipe_from_variable(text)  # 'autotune run' keeps the file it read in ``source``
    if isinstance(source, Recipe):
        return checked(source)
    if isinstance(source, dict):
        return checked(Recipe(params=dict(source), workload="(params)"))
    if isinstance(source, int) or (isinstance(source, str) and source.isdigit()):
        from .database import default_storage
        from .store import RecipeStore
        with RecipeStore.open(storage or default_storage(), readonly=True) as store:
            return checked(store.get(int(source)))
    if isinstance(source, (str, Path)):
        return load_recipe_file(source)
    raise UsageError(f"apply() takes a recipe file, a recipe id or a Recipe, not {type(source).__name__}")


def apply(
    source: RecipeSource = None,
    *,
    workload: str | None = None,
    storage: str | None = None,
    facts: Facts | None = None,
    check_hardware: bool = True,
    allow_other_hardware: bool = False,
) -> Tuned:
    """Apply a recipe (``.env``/``.json`` file, recipe id, ``Recipe``, params dict, or by default the
    ``AUTOTUNE_RECIPE`` variable that the env file and ``autotune run`` set) to this process.

    Sets torch's thread pools and precision flags now; returns a ``Tuned`` with the batch size,
    DataLoader kwargs, autocast context and model preparation. Raises ``HardwareMismatchError`` for a
    recipe measured on other hardware (the machine and its cgroup cpuset: the CPUs ``autotune run`` pinned
    this process to do not count), or recorded with an older fingerprint scheme, unless
    ``allow_other_hardware`` (or ``AUTOTUNE_ALLOW_OTHER_HARDWARE=1``, which ``autotune run
    --allow-other-hardware`` sets), then it warns; ``DeviceMissingError`` (one of them, whatever
    ``allow_other_hardware`` says) for a CUDA recipe where torch has no CUDA or sees no GPU. Warns
    (``Tuned.warnings``) for environment-level knobs not in effect.
    With ``workload`` (and no ``source``): the newest recipe of that workload in ``storage`` (default
    ``$AUTOTUNE_STORAGE``, else ``sqlite:///studies.db``) measured on this machine's hardware
    (``autotune.service``), e.g. ``apply(workload="cnn", storage="postgresql+psycopg://…")``.

    >>> tuned = apply({"threads": 1, "batch_size": 8}, check_hardware=False)
    >>> tuned.batch_size
    8
    """
    from . import probes

    if source is None and workload is not None:  # the recipe service: this machine's recipe from a store
        from .database import default_storage, shown_url
        from .service import fetch

        facts = facts or probes.probe()
        storage = storage or default_storage()
        recipe = fetch(storage, workload, facts.fingerprint)
        shown = shown_url(storage)
        fix = f"autotune run --storage {shown} --workload {workload} -- python ..."
    else:
        recipe, fix = _resolve(source, storage), "autotune run --recipe FILE -- python ..."
    params = dict(recipe.params)
    note = format_note(recipe) if not isinstance(source, dict) else None  # a dict is no old recipe
    if note and spaces.processes.count(params) > 1:  # applied as measured; where it matters, said once
        warnings.warn(note, stacklevel=2)
    elif note:
        log.info(note)
    if facts is None:
        facts = probes.probe()
    if check_hardware:
        allowed = allow_other_hardware or os.environ.get(ALLOW_OTHER_HARDWARE) == "1"
        other = check_machine(recipe, facts, allow_other_hardware=allowed)
        if other:
            warnings.warn(printable(other), stacklevel=2)  # it quotes the recipe's workload
    missing_cuda = cuda_missing(recipe)  # before torch.cuda.set_device would fail with an AttributeError
    if missing_cuda:
        raise DeviceMissingError(missing_cuda)
    problems = spaces.apply_process(params, facts)
    missing = spaces.check_environment(params, facts)
    if missing:
        problems.append(
            "environment-level knobs not in effect: " + "; ".join(missing)
            + f". Start Python under '{fix}' (or load the env file "
            "with 'set -a; . ./best.env; set +a' before starting Python)"
        )
    for problem in problems:
        warnings.warn(problem, stacklevel=2)
    return Tuned(params=params, device=params.get("device", "cpu"), warnings=problems,
                 worker_cpus=spaces.worker_cpus(params, facts), _steps=StepReporter.from_environment())
