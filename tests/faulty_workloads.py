"""Workloads that fail on purpose, for the runner's and the study's fault handling.

The ``tiny`` MLP, with a loss function that misbehaves: the batch size tells it when.
"""
from __future__ import annotations

import os
import signal
import time
from typing import Any

from autotune.workloads import tiny

OOM_FROM_BATCH = 64


def _with_loss(loss: Any) -> Any:
    base = tiny.workload()
    return type(base)(model=base.model, dataset=base.dataset, loss=loss, optimizer=base.optimizer,
                      batch_size=base.batch_size, name="faulty")


def oom() -> Any:
    """Runs out of memory (as CUDA reports it) from batch size OOM_FROM_BATCH up."""
    import torch

    def loss(output: Any, batch: Any) -> Any:
        if len(batch[0]) >= OOM_FROM_BATCH:
            raise torch.OutOfMemoryError("fake: out of memory")
        return torch.nn.functional.cross_entropy(output, batch[1])

    return _with_loss(loss)


def crash() -> Any:
    def loss(output: Any, batch: Any) -> Any:
        raise ValueError("fake: the user's loss has a bug")

    return _with_loss(loss)


def hang() -> Any:
    def loss(output: Any, batch: Any) -> Any:
        time.sleep(3600)

    return _with_loss(loss)


def nan() -> Any:
    import torch

    def loss(output: Any, batch: Any) -> Any:
        return torch.nn.functional.cross_entropy(output, batch[1]) * float("nan")

    return _with_loss(loss)


def stalls_with_workers() -> Any:
    """Stalls in the loss while DataLoader workers run and the file named by ``AUTOTUNE_TEST_STALL`` exists:
    a trial that stays alive, workers and all, until the test removes the file (or kills it)."""
    import multiprocessing

    import torch

    def loss(output: Any, batch: Any) -> Any:
        flag = os.environ.get("AUTOTUNE_TEST_STALL")
        while flag and os.path.exists(flag) and multiprocessing.active_children():
            time.sleep(0.1)
        return torch.nn.functional.cross_entropy(output, batch[1])

    return _with_loss(loss)


def killed() -> Any:
    """Dies by SIGKILL, as under the kernel's out-of-memory killer."""

    def loss(output: Any, batch: Any) -> Any:
        os.kill(os.getpid(), signal.SIGKILL)

    return _with_loss(loss)
