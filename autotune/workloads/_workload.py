"""What a user tunes: a ``Workload`` of zero-argument factories, and how a spec string finds one.

A workload spec is one of:
- a bundled name: ``cnn``, ``transformer``, ``tiny`` (the modules of this package);
- ``package.module:function``;
- ``path/to/file.py:function``.
The function takes no arguments and returns a ``Workload``. A workload without a ``name`` is named after
its spec (``path/to/gru_tagger.py:make`` -> ``gru_tagger.make``), which names its study. An exception
raised by the user's file, module or function is the user's error (``UsageError``), with its message.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import pkgutil
import sys
import sysconfig
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import UsageError

if TYPE_CHECKING:
    import torch

T = TypeVar("T")

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
    ``name`` names the study (``NAME-FINGERPRINT``); without one, ``load_workload`` derives it from the spec.

    Example::

        >>> import torch
        >>> workload = Workload(
        ...     model=lambda: torch.nn.Linear(4, 2),
        ...     dataset=lambda: torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,))),
        ...     loss=lambda out, batch: torch.nn.functional.cross_entropy(out, batch[1]),
        ...     optimizer=lambda params: torch.optim.SGD(params, lr=0.1))
    """

    # The dataset, its batches and the model's output are the user's own (any map-style dataset): Any.
    model: Callable[[], torch.nn.Module]
    dataset: Callable[[], Any]
    loss: Callable[[Any, Any], torch.Tensor]  # (model output, batch) -> scalar loss
    optimizer: Callable[[Iterator[torch.nn.Parameter]], torch.optim.Optimizer]
    batch_size: int = 32
    evaluate: Callable[[torch.nn.Module], float] | None = None
    inputs: Callable[[Any], tuple[Any, ...]] | None = None  # batch -> model args; default: batch[:-1]
    name: str | None = None

    def model_inputs(self, batch: Any) -> tuple[Any, ...]:
        if self.inputs is not None:
            return tuple(self.inputs(batch))
        return tuple(batch[:-1]) if len(batch) > 1 else tuple(batch)


def output_tensors(output: Any) -> list[torch.Tensor]:
    """The tensors of a forward pass's output (a tensor, or tuples, lists and dicts of them), in order: what the
    search reads of a user's model without calling the user's loss.

    >>> import torch
    >>> [t.shape[0] for t in output_tensors({"logits": torch.ones(2), "aux": (torch.ones(3), "text")})]
    [2, 3]
    """
    import torch

    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        return [t for part in output for t in output_tensors(part)]
    return []


def default_name(spec: str) -> str:
    """The name of a workload that gives none: the bundled name, else the spec's file stem (or module) and
    function, so two user workloads get two studies.

    >>> default_name("path/to/gru_tagger.py:make"), default_name("pkg.mod:build"), default_name("tiny")
    ('gru_tagger.make', 'pkg.mod.build', 'tiny')
    """
    if spec in BUNDLED:
        return spec
    target, _, func_name = spec.rpartition(":")
    return f"{Path(target).stem if target.endswith('.py') else target}.{func_name}"


def _user_error(what: str, e: BaseException) -> UsageError:
    """What the user's code (their file, module or function) raised, as their error on one line, with the
    line of their code that raised (``--debug`` shows the whole traceback)."""
    detail = f": {e}" if str(e) else ""
    return UsageError(f"your workload {what} raised {type(e).__name__}{detail}{_their_line(e)}")


def _their_line(e: BaseException) -> str:
    """`` (FILE, line N)``: the innermost frame outside Python, installed packages and autotune."""
    if isinstance(e, SyntaxError):
        return ""  # its message names the file and line already
    paths = sysconfig.get_paths()
    library = tuple(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")) + (str(Path(__file__).parent),)
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith(("<", *library))]
    return f" ({Path(frames[-1].filename).name}, line {frames[-1].lineno})" if frames else ""


def _names(names: Any, limit: int = 12) -> str:
    """Public names, sorted, at most ``limit`` of them."""
    names = sorted({n for n in names if not n.startswith("_")})
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "") if names else "none"


def _import_file(target: str) -> Any:
    path = Path(target)
    if not path.is_file():
        raise UsageError(f"workload file {target!r} does not exist")
    module_name = f"_autotune_workload_{abs(hash(str(path.resolve())))}"
    file_spec = importlib.util.spec_from_file_location(module_name, path)
    if file_spec is None or file_spec.loader is None:
        raise UsageError(f"workload file {target!r} cannot be imported")
    module = importlib.util.module_from_spec(file_spec)
    sys.modules[module_name] = module
    # The user's folder is left as it was: no __pycache__ beside their file (where bytecode is written at all)
    writes, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        file_spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # SystemExit: a script's top-level sys.exit() or argparse
        del sys.modules[module_name]
        raise _user_error(target, e) from e
    finally:
        sys.dont_write_bytecode = writes
    return module


def _import_module(target: str) -> Any:
    # The trial child starts as ``python -m autotune.trial.child``, with the working directory on its path; the
    # ``autotune`` console script has the script's directory there instead. Import as the child will.
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as e:
        if e.name is not None and (target == e.name or target.startswith(e.name + ".")):
            raise UsageError(_no_module(e.name, cwd)) from e
        error: BaseException = e  # the module imports something that is missing
    except (Exception, SystemExit) as e:
        error = e
    raise _user_error(f"module {target}", error) from error


def _no_module(name: str, cwd: str) -> str:
    parent = name.rpartition(".")[0]
    if parent:
        path = getattr(importlib.import_module(parent), "__path__", None)
        if path is None:
            return f"no module {name!r}: {parent} is a module, not a package"
        return f"no module {name!r}: {parent} has {_names(m.name for m in pkgutil.iter_modules(path))}"
    found = (m.name for m in pkgutil.iter_modules([cwd]))
    return f"no module {name!r}: the modules in {cwd} are {_names(found)}"


HELD_OUT_SEED = 0  # one split for every trial of every study: not the trial's seed
WIDE_HELD_OUT = 4  # the quality guard's wide set: this many times the held-out samples (``held_out_sets``)


def held_out_sets(dataset: Any, samples: int) -> tuple[Any, Any, Any]:
    """``(train, held_out, wide)`` subsets of ``dataset``, from one fixed-seed order of its samples: the held-out
    set, ``min(samples, len(dataset) // 4)`` samples, and the wide set around it, ``min(WIDE_HELD_OUT x samples,
    len(dataset) // 4)``, which the quality guard takes a loss over where the held-out set's loss cannot resolve
    its limit (``autotune.study.guard``). No trial trains on either. The choice depends only on the dataset's
    length, so every trial of a study evaluates the same samples, whatever its seed or batch size.

    >>> import torch
    >>> train, held_out, wide = held_out_sets(torch.utils.data.TensorDataset(torch.arange(100)), 5)
    >>> len(train), len(held_out), len(wide), set(train.indices) & set(wide.indices)
    (80, 5, 20, set())
    >>> set(held_out.indices) <= set(wide.indices)
    True
    """
    import torch

    length = len(dataset)
    order = torch.randperm(length, generator=torch.Generator().manual_seed(HELD_OUT_SEED)).tolist()
    count, wide = min(samples, length // 4), min(WIDE_HELD_OUT * samples, length // 4)
    # In index order: the held-out loss sums the same batches in the same order every time.
    train, held_out, wide_set = (torch.utils.data.Subset(dataset, sorted(indices))
                                 for indices in (order[wide:], order[:count], order[:wide]))
    return train, held_out, wide_set


def held_out_split(dataset: Any, samples: int) -> tuple[Any, Any]:
    """``(train, held_out)`` of ``held_out_sets``: what a trial process trains on and evaluates."""
    train, held_out, _ = held_out_sets(dataset, samples)
    return train, held_out


def _import_function(spec: str) -> Callable[[], Any]:
    target, _, func_name = spec.rpartition(":")
    if not target or not func_name:
        raise UsageError(
            f"workload {spec!r} is not a bundled name ({', '.join(BUNDLED)}), MODULE:FUNCTION or FILE.py:FUNCTION"
        )
    module = _import_file(target) if target.endswith(".py") else _import_module(target)
    func = getattr(module, func_name, None)
    if not callable(func):
        defined = (n for n, v in vars(module).items() if inspect.isfunction(v) and v.__module__ == module.__name__)
        raise UsageError(f"workload {spec!r}: {target} has no function {func_name!r}; its functions: {_names(defined)}")
    return func


def call_user(what: str, factory: Callable[[], T]) -> T:
    """``factory()``, with what it raises reported as the user's error (``your workload WHAT raised ...``).

    >>> call_user("tiny.py:make's model()", lambda: 1 / 0)
    Traceback (most recent call last):
    ...
    autotune.errors.UsageError: your workload tiny.py:make's model() raised ZeroDivisionError: division by zero
    """
    try:
        return factory()
    except (Exception, SystemExit) as e:
        raise _user_error(what, e) from e


def load_workload(spec: str) -> Workload:
    """Resolve a workload spec and call its function; raises UsageError for a bad spec or for what the
    user's file or function raises. A workload without a name gets ``default_name(spec)``."""
    workload = call_user(spec, _import_function(BUNDLED.get(spec, spec)))
    if not isinstance(workload, Workload):
        raise UsageError(f"workload {spec!r} returned {type(workload).__name__}, not autotune.Workload")
    return workload if workload.name else replace(workload, name=default_name(spec))
