"""Fixture workloads for ``benchmarks/noise.py``: a step made slower by a known share, in one process by a knob of
the arm and across processes by a knob of the environment.

The step is many small operations (a 64x64 matrix chain on a batch of 32), so its time is CPU work like a real
step's, with a real machine's noise. The model runs ``ITERATIONS`` links of the chain, and
``ITERATIONS x (1 + effect)`` where the knob is on:
- in one process (``in3``, ``in5``, ``in10``): when its input is channels_last (``channels_last=True``);
- across processes (``across3``, ``across5``, ``across10``): when the process was started with one thread
  (``threads=1``: ``OMP_NUM_THREADS=1``). Its model sets torch to one thread on both sides, so the knob has no
  effect of its own: with two threads on a shared VM, the defaults' side ran 1.2-1.7x slower for minutes at a
  time (2026-11-27, Zen 5 VM) and the "+10%" knob read faster.
The forward and backward of the chain are most of a step, so the step's time grows by about the effect (the
benchmark prints what it measured beside what was asked).

    python -c "import autotune; print(autotune.workloads.load_workload('benchmarks/effects.py:in5').name)"
"""
from __future__ import annotations

import os

import torch

import autotune

ITERATIONS = 200
BATCH = 32


class Chain(torch.nn.Module):
    def __init__(self, effect: float, where: str) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.weight = torch.nn.Parameter(torch.randn(64, 64, generator=generator) * 0.1)
        self.head = torch.nn.Linear(64, 2)
        self.effect, self.where = effect, where
        if where == "across":
            torch.set_num_threads(1)  # the same compute on both sides: the knob acts through _slowed alone

    def _slowed(self, x: torch.Tensor) -> bool:
        if self.where == "in":
            return x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        return os.environ.get("OMP_NUM_THREADS") == "1"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        links = ITERATIONS + (round(ITERATIONS * self.effect) if self._slowed(x) else 0)
        h = x.reshape(x.shape[0], -1)
        for _ in range(links):
            h = torch.tanh(h @ self.weight)
        return self.head(h)


def _dataset() -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2048, 4, 4, 4, generator=generator)  # 4D: channels_last applies; 64 features a sample
    return torch.utils.data.TensorDataset(x, (x.mean(dim=(1, 2, 3)) > 0).long())


def _workload(effect: float, where: str) -> autotune.Workload:
    return autotune.Workload(
        model=lambda: Chain(effect, where), dataset=_dataset,
        loss=lambda output, batch: torch.nn.functional.cross_entropy(output, batch[-1]),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.01), batch_size=BATCH,
        name=f"effect-{where}-{round(100 * effect)}")


def in3() -> autotune.Workload:
    return _workload(0.03, "in")


def in5() -> autotune.Workload:
    return _workload(0.05, "in")


def in10() -> autotune.Workload:
    return _workload(0.10, "in")


def across3() -> autotune.Workload:
    return _workload(0.03, "across")


def across5() -> autotune.Workload:
    return _workload(0.05, "across")


def across10() -> autotune.Workload:
    return _workload(0.10, "across")
