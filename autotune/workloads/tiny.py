"""A two-layer MLP on synthetic features: fast enough for tests and smoke runs."""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ._workload import Workload

if TYPE_CHECKING:
    import torch


def _dataset() -> torch.utils.data.Dataset[Any]:
    import torch

    g = torch.Generator().manual_seed(7)
    x = torch.randn(2048, 64, generator=g)
    w = torch.randn(64, 10, generator=g)
    return torch.utils.data.TensorDataset(x, (x @ w).argmax(dim=1))


def _model() -> torch.nn.Module:
    from torch import nn

    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def _loss(output: torch.Tensor, batch: Any) -> torch.Tensor:
    import torch.nn.functional as F

    return F.cross_entropy(output.float(), batch[1])


def _optimizer(params: Iterator[torch.nn.Parameter]) -> torch.optim.Optimizer:
    import torch

    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def workload() -> Workload:
    return Workload(model=_model, dataset=_dataset, loss=_loss, optimizer=_optimizer, batch_size=32, name="tiny")
