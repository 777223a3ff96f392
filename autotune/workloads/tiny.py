"""A two-layer MLP on synthetic features: fast enough for tests and smoke runs."""
from __future__ import annotations

from typing import Any

from ..workload import Workload


def _dataset() -> Any:
    import torch

    g = torch.Generator().manual_seed(7)
    x = torch.randn(2048, 64, generator=g)
    w = torch.randn(64, 10, generator=g)
    return torch.utils.data.TensorDataset(x, (x @ w).argmax(dim=1))


def _model() -> Any:
    from torch import nn

    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def _loss(output: Any, batch: Any) -> Any:
    import torch.nn.functional as F

    return F.cross_entropy(output.float(), batch[1])


def _optimizer(params: Any) -> Any:
    import torch

    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def workload() -> Workload:
    return Workload(model=_model, dataset=_dataset, loss=_loss, optimizer=_optimizer, batch_size=32, name="tiny")
