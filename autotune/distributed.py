"""Data-parallel plumbing for the ``processes`` knob (``autotune.search_spaces._processes``).

- ``torchrun_command``: the command rewritten to run under ``torch.distributed.run`` (plain data, used
  by ``autotune.trial.launch.plan`` for trials and for ``autotune run``);
- ``world``, ``wrap_model``, ``sampler``: what ``Tuned`` gives a training loop in a rank;
- ``max_over_ranks``, ``mean_over_ranks``, ``gather``: how the trial's ranks agree on timing, loss
  and what is in effect, so that every rank takes the same decisions (extra windows, NaN).
"""
from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import UsageError

if TYPE_CHECKING:
    import torch
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data.distributed import DistributedSampler

T = TypeVar("T")

_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")
LAUNCHER = ("-m", "torch.distributed.run")


def is_torchrun(cmd: list[str]) -> bool:
    """Whether the command already starts ``torchrun`` / ``torch.distributed.run`` itself."""
    return bool(cmd) and (
        Path(cmd[0]).name == "torchrun" or any(cmd[i:i + 2] == list(LAUNCHER) for i in range(len(cmd)))
    )


def torchrun_command(cmd: list[str], processes: int) -> list[str]:
    """``python SCRIPT ARGS`` (or ``python -m MODULE ARGS``) started as ``processes`` DDP ranks.

    >>> torchrun_command(["python", "train.py", "--epochs", "3"], 2)
    ['python', '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node', '2', 'train.py', '--epochs', '3']

    A command that already runs torchrun is returned unchanged; any other command is a UsageError
    that says how to start it.
    """
    if processes <= 1 or is_torchrun(cmd):
        return list(cmd)
    rest = cmd[1:]
    if not cmd or not _PYTHON.match(Path(cmd[0]).name) or not rest or (rest[0].startswith("-") and rest[0] != "-m"):
        shown = " ".join(cmd[:2]) or "(none)"
        raise UsageError(
            f"the recipe trains in {processes} processes, which autotune starts as "
            f"'python -m torch.distributed.run --nproc-per-node {processes} SCRIPT ARGS': give the command as "
            f"'python SCRIPT ARGS' or 'python -m MODULE ARGS', not {shown!r}; or load the env file "
            f"(set -a; . ./best.env; set +a) and start it yourself: torchrun --standalone "
            f"--nproc-per-node {processes} SCRIPT ARGS"
        )
    # torchrun's own -m (--module) takes the module name as its script.
    return [cmd[0], *LAUNCHER, "--standalone", "--nproc-per-node", str(processes), *rest]


def world() -> tuple[int, int]:
    """``(rank, world_size)`` of the initialised process group; ``(0, 1)`` without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def wrap_model(model: torch.nn.Module, device: str, options: dict[str, Any] | None = None) -> torch.nn.Module:
    """The model in ``DistributedDataParallel`` (with ``options``, its keyword arguments:
    ``search_spaces.ddp.ddp_options``) when more than one rank trains, else unchanged."""
    if world()[1] == 1:
        return model
    import torch
    from torch.nn.parallel import DistributedDataParallel

    ids = [torch.cuda.current_device()] if device == "cuda" else None
    kwargs = dict(options or {})
    if kwargs.pop("broadcast_buffers", True) is False:
        # torch 2.13 deprecates broadcast_buffers (a FutureWarning) for forward_sync_buffers, which still syncs
        # the buffers once at init: right for constant ones. Older torch has only broadcast_buffers.
        known = inspect.signature(DistributedDataParallel.__init__).parameters
        kwargs["forward_sync_buffers" if "forward_sync_buffers" in known else "broadcast_buffers"] = False
    return DistributedDataParallel(model, device_ids=ids, **kwargs)


def sync_next_backward(model: DistributedDataParallel | None, sync: bool) -> None:
    """Whether the next backward of a DDP ``model`` all-reduces the gradients: False on the micro-batches
    of gradient accumulation that do not step the optimizer. What ``DistributedDataParallel.no_sync()``
    sets for its block, set here before the forward, where DDP reads it, so the user's loop stays as is."""
    if model is not None:
        model.require_backward_grad_sync = sync


def sampler(dataset: Any, *, shuffle: bool = True, seed: int = 0) -> DistributedSampler[Any] | None:
    """A ``DistributedSampler`` giving this rank its shard (``drop_last``: equal shards), or None."""
    rank, size = world()
    if size == 1:
        return None
    from torch.utils.data.distributed import DistributedSampler

    return DistributedSampler(dataset, num_replicas=size, rank=rank, shuffle=shuffle, seed=seed, drop_last=True)


def _reduce(value: float, op: str) -> float:
    import torch
    import torch.distributed as dist

    if world()[1] == 1:
        return value
    device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
    return float(tensor.item())


def max_over_ranks(value: float) -> float:
    return _reduce(value, "MAX")


def mean_over_ranks(value: float) -> float:
    return _reduce(value, "SUM") / world()[1]


def gather(value: T) -> list[T]:
    """Every rank's ``value`` (a collective: every rank must call it), in rank order."""
    import torch.distributed as dist

    size = world()[1]
    if size == 1:
        return [value]
    out: list[Any] = [None] * size
    dist.all_gather_object(out, value)
    return out


def finish() -> None:
    """Leave the process group (torch warns at exit about one left open), after a barrier: a gloo rank
    that destroys the group while another still completes the last collective can abort that one
    ("terminate called without an active exception", SIGABRT)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
