"""Fixture workloads for ``benchmarks/noise.py``: a step made faster by a knob, by a known share of extra work
that the defaults' side does and the knob's side skips, of three kinds a real knob changes:
- ``compute``: more links of a 64x64 matrix chain (a heavier kernel);
- ``sleep``: a sleep of the share of the previous step's time (a stall: input, I/O, a lock);
- ``alloc``: 256 KiB buffers allocated, filled and freed for the share of the previous step's time (an
  allocator's work: above glibc's mmap threshold, each is an mmap and a munmap).
The knob is, in one process, the arm's ``channels_last`` (its input arrives channels_last) and, across processes,
``threads=1`` (``OMP_NUM_THREADS=1`` at the process's start; the model sets torch to one thread on both sides, so
the knob has no effect of its own). A workload is named ``{in|across}_{kind}_{per mille}``: ``in_compute_65`` is
6.5% more chain links on the defaults' side. A step's time grows by about the share asked (the first step by
none of a sleep or allocation: it has no previous step); ``noise.py`` measures each one's truth in a long
reference run.

    python -c "import autotune; print(autotune.workloads.load_workload('benchmarks/effects.py:in_compute_50').name)"
"""
from __future__ import annotations

import os
import time
from typing import Any

import torch

import autotune

ITERATIONS = 200
BATCH = 32
KINDS = ("compute", "sleep", "alloc")


class Chain(torch.nn.Module):
    def __init__(self, share: float, where: str, kind: str) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.weight = torch.nn.Parameter(torch.randn(64, 64, generator=generator) * 0.1)
        self.mix = torch.nn.Conv2d(4, 4, 1)  # a convolution: the search offers channels_last where a model has one
        self.head = torch.nn.Linear(64, 2)
        self.share, self.where, self.kind = share, where, kind
        self._last: float | None = None  # the previous forward's start
        self._injected = 0.0  # the time the previous step slept or allocated
        self._period: float | None = None  # a step's time, smoothed
        if where == "across":
            torch.set_num_threads(1)  # the same compute on both sides: the knob acts through _fast alone

    def _fast(self, x: torch.Tensor) -> bool:
        if self.where == "in":
            return x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        return os.environ.get("OMP_NUM_THREADS") == "1"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        slowed, started = not self._fast(x), time.perf_counter()
        if self._last is not None:  # a step's time without what it injected: the step the knob's side has
            period = started - self._last - self._injected
            if self._period is None or period < 3 * self._period:  # not a gap while another arm ran
                self._period = period if self._period is None else 0.8 * self._period + 0.2 * period
        target = self.share * self._period if slowed and self._period else 0.0
        self._last = started
        h = self.mix(x).reshape(x.shape[0], -1)
        for _ in range(ITERATIONS + (round(ITERATIONS * self.share) if slowed and self.kind == "compute" else 0)):
            h = torch.tanh(h @ self.weight)
        injected = time.perf_counter()
        if self.kind == "sleep" and target > 0:
            time.sleep(target)
        while self.kind == "alloc" and time.perf_counter() - injected < target:
            torch.empty(1 << 16).fill_(1.0)
        self._injected = time.perf_counter() - injected
        return self.head(h)


def _dataset() -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2048, 4, 4, 4, generator=generator)  # 4D: channels_last applies; 64 features a sample
    return torch.utils.data.TensorDataset(x, (x.mean(dim=(1, 2, 3)) > 0).long())


def workload(where: str, kind: str, share: float) -> autotune.Workload:
    if where not in ("in", "across") or kind not in KINDS or not 0 <= share < 1:
        raise ValueError(f"no effect fixture {where}_{kind} at {share}")
    return autotune.Workload(
        model=lambda: Chain(share, where, kind), dataset=_dataset,
        loss=lambda output, batch: torch.nn.functional.cross_entropy(output, batch[-1]),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.01), batch_size=BATCH,
        name=f"effect-{where}-{kind}-{round(1000 * share)}")


def name(where: str, kind: str, share: float) -> str:
    """The workload spec of one fixture: ``benchmarks/effects.py:in_compute_65``."""
    return f"{__file__}:{where}_{kind}_{round(1000 * share)}"


def __getattr__(attr: str) -> Any:  # ``in_compute_65`` and the like, as a workload factory
    where, _, rest = attr.partition("_")
    kind, _, permille = rest.partition("_")
    if where in ("in", "across") and kind in KINDS and permille.isdigit():
        return lambda: workload(where, kind, int(permille) / 1000)
    raise AttributeError(attr)
