"""A ResNet-18-shaped workload for the GPU figures: torchvision's ``resnet18`` (no pretrained weights,
nothing downloaded), 10 classes, on learnable synthetic 224x224 RGB images generated from a seed.

    pip install torchvision            # the build that matches the installed torch (torch 2.13 <-> torchvision 0.28)
    python benchmarks/knobs.py --workloads benchmarks/resnet18.py:workload
    autotune search --workload benchmarks/resnet18.py:workload --budget 5m

The dataset holds ``RESNET18_IMAGES`` images (default 2048: 1.2 GB as float32, kept on the host so that
DataLoader workers and pinned memory have work to do), batch 64 per process as torchvision's reference recipe
trains it per GPU. On a 2-core CPU a step takes seconds: this is for GPU machines.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch

from autotune.workloads import Workload
from autotune.workloads._synthetic import class_images


def _model() -> torch.nn.Module:
    try:
        from torchvision.models import resnet18
    except ImportError as e:
        raise RuntimeError("benchmarks/resnet18.py needs torchvision: pip install torchvision (the build that "
                           "matches the installed torch)") from e
    return resnet18(weights=None, num_classes=10)


def _loss(output: torch.Tensor, batch: Any) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(output.float(), batch[1])


def _optimizer(params: Iterator[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4)


def workload() -> Workload:
    images = int(os.environ.get("RESNET18_IMAGES", "2048"))
    return Workload(model=_model, dataset=lambda: class_images(images, classes=10, size=224), loss=_loss,
                    optimizer=_optimizer, batch_size=64, name="resnet18")
