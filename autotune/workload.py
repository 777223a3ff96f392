"""What a user tunes: a ``Workload`` of zero-argument factories, and how a spec string finds one.

A workload spec is one of:
- a bundled name: ``cnn``, ``transformer``, ``tiny`` (see ``autotune.workloads``);
- ``package.module:function``;
- ``path/to/file.py:function``.
The function takes no arguments and returns a ``Workload``.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import UsageError

BUNDLED = {
    "cnn": "autotune.workloads.cnn:workload",
    "transformer": "autotune.workloads.transformer:workload",
    "tiny": "autotune.workloads.tiny:workload",
}


@dataclass(frozen=True)
class Workload:
    """A training job autotune can run for a few steps.

    ``model()`` builds the ``nn.Module``; ``dataset()`` a map-style dataset of tuples;
    ``loss(output, batch)`` returns a scalar tensor; ``optimizer(parameters)`` builds the optimizer.
    ``batch_size`` is the default batch size (the baseline's); ``evaluate(model) -> float``, when
    given, is the quality metric the guard compares (lower is better) instead of the loss on the
    held-out slice of ``dataset()`` (``held_out_split``).

    Example::

        >>> import torch
        >>> Workload(model=lambda: torch.nn.Linear(4, 2),
        ...          dataset=lambda: torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,))),
        ...          loss=lambda out, batch: torch.nn.functional.cross_entropy(out, batch[1]),
        ...          optimizer=lambda params: torch.optim.SGD(params, lr=0.1))
    """

    model: Callable[[], Any]
    dataset: Callable[[], Any]
    loss: Callable[[Any, Any], Any]
    optimizer: Callable[[Any], Any]
    batch_size: int = 32
    evaluate: Callable[[Any], float] | None = None
    inputs: Callable[[Any], tuple[Any, ...]] | None = None  # batch -> model args; default: batch[:-1]
    name: str = "workload"

    def model_inputs(self, batch: Any) -> tuple[Any, ...]:
        if self.inputs is not None:
            return tuple(self.inputs(batch))
        return tuple(batch[:-1]) if len(batch) > 1 else tuple(batch)


HELD_OUT_SEED = 0  # one split for every trial of every study: not the trial's seed


def held_out_split(dataset: Any, samples: int) -> tuple[Any, Any]:
    """``(train, held_out)`` subsets of ``dataset``: ``min(samples, len(dataset) // 4)`` samples chosen by
    a fixed seed are held out, and no trial trains on them. The choice depends only on the dataset's
    length, so every trial of a study evaluates the same samples, whatever its seed or batch size.

    >>> import torch
    >>> train, held_out = held_out_split(torch.utils.data.TensorDataset(torch.arange(100)), 10)
    >>> len(train), len(held_out), set(train.indices) & set(held_out.indices)
    (90, 10, set())
    """
    import torch

    count = min(samples, len(dataset) // 4)
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(HELD_OUT_SEED)).tolist()
    # Both in index order: the held-out loss sums the same batches in the same order every time.
    train, held_out = sorted(order[count:]), sorted(order[:count])
    return torch.utils.data.Subset(dataset, train), torch.utils.data.Subset(dataset, held_out)


def _import_function(spec: str) -> Callable[[], Any]:
    target, _, func_name = spec.rpartition(":")
    if not target or not func_name:
        raise UsageError(
            f"workload {spec!r} is not a bundled name ({', '.join(BUNDLED)}), MODULE:FUNCTION or FILE.py:FUNCTION"
        )
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise UsageError(f"workload file {target!r} does not exist")
        module_name = f"_autotune_workload_{abs(hash(str(path.resolve())))}"
        file_spec = importlib.util.spec_from_file_location(module_name, path)
        if file_spec is None or file_spec.loader is None:
            raise UsageError(f"workload file {target!r} cannot be imported")
        module = importlib.util.module_from_spec(file_spec)
        sys.modules[module_name] = module
        file_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise UsageError(f"workload module {target!r} cannot be imported: {e}") from e
    func = getattr(module, func_name, None)
    if not callable(func):
        raise UsageError(f"workload {spec!r}: {target} has no function {func_name!r}")
    return func


def load_workload(spec: str) -> Workload:
    """Resolve a workload spec and call its function; raises UsageError for a bad spec."""
    func = _import_function(BUNDLED.get(spec, spec))
    workload = func()
    if not isinstance(workload, Workload):
        raise UsageError(f"workload {spec!r} returned {type(workload).__name__}, not autotune.Workload")
    return workload
