"""What a knob family needs to know besides the probed facts."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SpaceContext:
    """The workload and run settings the search space is conditional on."""

    device: Literal["cpu", "cuda"] = "cpu"
    default_batch_size: int = 32
    conv: bool = False  # the model has convolutions, all 2-D: channels_last is worth trying
    conv_nd: bool = False  # it has convolutions that are not 2-D (Conv1d, Conv3d): no channels_last
    global_batch: int | None = None  # keep the effective batch constant by gradient accumulation
    max_batch_size: int | None = None  # from probed memory; None: no cap known
    allow_compile: bool = True
    prunable: bool = False  # structured pruning finds layers that can lose units (search_spaces.transforms.prune)
    semi_structured: bool = False  # the model has Linear layers the 2:4 sparse kernels accept
    unused_parameters: bool = False  # some parameter gets no gradient: DDP needs find_unused_parameters (_ddp)


def conv_layers(model: torch.nn.Module) -> tuple[bool, bool]:
    """``(conv, conv_nd)`` of ``SpaceContext`` for ``model``: it has convolutions, all 2-D; it has some that are not."""
    import torch

    convs = [m for m in model.modules() if isinstance(m, torch.nn.modules.conv._ConvNd)]
    conv = bool(convs) and all(isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d)) for m in convs)
    return conv, bool(convs) and not conv
