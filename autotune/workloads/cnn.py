"""A small CNN classifier on synthetic 32x32 RGB images (10 classes)."""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ._workload import Workload

if TYPE_CHECKING:
    import torch
from ._synthetic import class_images


def _model() -> torch.nn.Module:
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10),
    )


def _loss(output: torch.Tensor, batch: Any) -> torch.Tensor:
    import torch.nn.functional as F

    return F.cross_entropy(output.float(), batch[1])


def _optimizer(params: Iterator[torch.nn.Parameter]) -> torch.optim.Optimizer:
    import torch

    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def workload() -> Workload:
    return Workload(
        model=_model,
        dataset=lambda: class_images(4096, classes=10, size=32),
        loss=_loss,
        optimizer=_optimizer,
        batch_size=64,
        name="cnn",
    )
