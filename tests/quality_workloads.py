"""Workloads whose quality and speed answer to known knobs: the fixtures for tests of the quality guard
and of what a search finds. Use them as ``--workload tests.quality_workloads:NAME`` (from the repository
root) or ``--workload path/to/tests/quality_workloads.py:NAME``.

``regression``: a small MLP learns a random linear map (MSE) with plain SGD, default batch 64. At the
same number of samples trained, with ``--lr-scaling linear`` (or ``--global-batch``) every batch size
from 16 to 256 reaches about the same held-out loss (within ~2% for seeds 0-2 at the default 4 + 24
steps), while knobs that cost quality miss it by far:
- ``HURTS`` (structured sparsity 0.8): the hidden layer keeps 16 of its 64 units (about +150% loss);
- ``batch_per_rank=256`` with ``--lr-scaling none``: 7 steps at the default learning rate instead of 28 (+200%).
Its loss falls fast, so a trial that trains 7% fewer samples than the baseline (1,664 instead of
1,792) is ~14% worse: a biased sample count shows in the guard.

``slow``: ``regression`` made slow on purpose: every training forward pass of the full 64 hidden units sleeps
``SLOW_SLEEP_S``, a narrower one by the square of its share of them. Under ``--global-batch 256`` every batch size
takes the same optimizer steps (the loss does not depend on it) and batch 256 runs one forward pass per step
where the default 64 runs four: about 4x the samples/s. ``HURTS`` is infeasible, and faster still on an idle
machine (16 hidden units: a 16th of the sleep, its step's compute left: 18x the defaults); its compute is what a
busy neighbour slows, and beside one it read 3.74x where batch 256 alone read 3.99x, so no test rests on its lead.

``ramp``: ``regression`` whose process starts slow: the first model built in a process sleeps ``SLEEP_S`` in
each of its first ``RAMP_STEPS`` training forward passes and half of that after, models built after it half
from their first, as the first arm of a fresh process ran its first second of training slow on the CNN while a
second arm ran at full speed from its first window (``autotune.measure.worker.arms.SETTLE_S``).

``conv``: a tiny CNN (one 2-D convolution, 8x8 images): the search offers it the ``channels_last`` seed on
every CPU, so a test that needs a seed after the baseline has one wherever it runs (``tiny``'s only seed,
bf16 autocast, exists only where the CPU has AVX512-BF16 or AMX).

``contended``: ``regression`` that sleeps ``SLEEP_S`` per intra-op thread in every training forward pass, so one
thread is about twice as fast as two on any machine: a recipe pinned to one thread beats the defaults.

``memorize``: one-hot inputs, random targets and a linear model that starts at zero: training learns
each seen sample's own weight and nothing else, so the loss on samples never trained on stays exactly
their mean squared target (``untrained_loss``).
"""
from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from autotune import Workload

SLEEP_S = 0.02
# ``slow``'s sleep at full width: twice the others', so that batch 256's step is mostly sleep; a narrow model's
# (HURTS) is mostly compute, which two OpenMP threads on cores another test run shares slowed about fivefold.
SLOW_SLEEP_S = 0.04


def spec(name: str) -> str:
    """The ``--workload`` of the fixture ``name`` from any working directory: this file's path and the function."""
    return f"{Path(__file__).resolve()}:{name}"

HURTS = {"sparsity_pattern": "structured", "sparsity": 0.8}


def _regression_data() -> Any:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4096, 16, generator=g)
    return torch.utils.data.TensorDataset(x, x @ (torch.randn(16, 16, generator=g) / math.sqrt(16)))


def _mlp() -> Any:
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))


def _mse(output: Any, batch: Any) -> Any:
    return torch.nn.functional.mse_loss(output.float(), batch[1])


def _sgd(params: Any) -> Any:
    return torch.optim.SGD(params, lr=0.4)


def regression() -> Workload:
    return Workload(model=_mlp, dataset=_regression_data, loss=_mse, optimizer=_sgd, batch_size=64,
                    name="quality-regression")


class _Sleepy(torch.nn.Sequential):
    """Sleeps in every training forward pass (not while evaluating), in proportion to its hidden width squared."""

    def forward(self, x: Any) -> Any:
        if self.training:
            time.sleep(SLOW_SLEEP_S * (self[0].out_features / 64) ** 2)
        return super().forward(x)


def slow() -> Workload:
    return Workload(model=lambda: _Sleepy(*_mlp()), dataset=_regression_data, loss=_mse, optimizer=_sgd,
                    batch_size=64, name="quality-slow")


RAMP_STEPS = 40
RAMP_WARM_S = SLEEP_S / 2
_models = 0


class _Ramp(torch.nn.Sequential):
    """The process's first model sleeps ``SLEEP_S`` in its first ``RAMP_STEPS`` training forward passes, every other
    pass of every model ``RAMP_WARM_S``."""

    def __init__(self, *layers: Any) -> None:
        global _models
        super().__init__(*layers)
        _models += 1
        self.cold = RAMP_STEPS if _models == 1 else 0

    def forward(self, x: Any) -> Any:
        if self.training:
            # Settled, a step is a sleep too: compute-bound, an A/A of 12 pairs beside other test runs read
            # [0.79-1.02] and [0.97-1.26] where the test's bounds are 0.8 and 1.25; with 2 ms sleeps [0.87-1.63]
            # (a wake-up on busy cores takes milliseconds).
            time.sleep(SLEEP_S if self.cold > 0 else RAMP_WARM_S)
            self.cold = max(0, self.cold - 1)
        return super().forward(x)


def ramp() -> Workload:
    return Workload(model=lambda: _Ramp(*_mlp()), dataset=_regression_data, loss=_mse, optimizer=_sgd,
                    batch_size=64, name="quality-ramp")


MEMORIZE_SAMPLES = 1024


def _memorize_data() -> Any:
    targets = torch.randn(MEMORIZE_SAMPLES, 1, generator=torch.Generator().manual_seed(2))
    return torch.utils.data.TensorDataset(torch.eye(MEMORIZE_SAMPLES), targets)


def _zero_linear() -> Any:
    model = torch.nn.Linear(MEMORIZE_SAMPLES, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    return model


def memorize() -> Workload:
    return Workload(model=_zero_linear, dataset=_memorize_data, loss=_mse,
                    optimizer=lambda params: torch.optim.SGD(params, lr=16.0), batch_size=32, name="quality-memorize")


def untrained_loss(indices: list[int]) -> float:
    """The ``memorize`` model's loss on these samples if it never trained on them."""
    return float(_memorize_data().tensors[1][indices].pow(2).mean())


def _images() -> Any:
    g = torch.Generator().manual_seed(3)
    return torch.utils.data.TensorDataset(torch.randn(1024, 1, 8, 8, generator=g), torch.randint(0, 10, (1024,),
                                                                                              generator=g))


def _tiny_cnn() -> Any:
    return torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(8 * 8 * 8, 10))


def conv() -> Workload:
    return Workload(model=_tiny_cnn, dataset=_images,
                    loss=lambda output, batch: torch.nn.functional.cross_entropy(output.float(), batch[1]),
                    optimizer=lambda params: torch.optim.SGD(params, lr=0.05), batch_size=32, name="quality-conv")


class _Contended(torch.nn.Sequential):
    """Sleeps in every training forward pass in proportion to torch's intra-op threads."""

    def forward(self, x: Any) -> Any:
        if self.training:
            time.sleep(SLEEP_S * torch.get_num_threads())
        return super().forward(x)


def contended() -> Workload:
    return Workload(model=lambda: _Contended(*_mlp()), dataset=_regression_data, loss=_mse, optimizer=_sgd,
                    batch_size=64, name="quality-contended")


def _seedy_mlp() -> Any:
    """``_mlp`` whose output layer starts far from zero: how far depends on the training seed."""
    model = _mlp()
    torch.nn.init.normal_(model[2].weight, std=1.0)
    return model


def seedy() -> Workload:
    """``regression`` whose held-out loss after the guard's samples still carries its initial weights: it
    differs by tens of percent from one training seed to the next (a small learning rate from a start far off)."""
    return Workload(model=_seedy_mlp, dataset=_regression_data, loss=_mse,
                    optimizer=lambda params: torch.optim.SGD(params, lr=0.01), batch_size=64, name="quality-seedy")


TRAP_SLEEP_S = 0.002
# With channels_last a training forward pass computes this many times (as fp16 kernels without fast paths are
# slower compute, not a wait): slower by about as much on any machine and under any load. A sleep instead (100x
# the forward's) read only 7.4x beside another test run, where the step's compute had slowed and the sleep not.
TRAP_FACTOR = 2000
TRAP_BATCH = 16


def _colour_images() -> Any:
    g = torch.Generator().manual_seed(4)
    return torch.utils.data.TensorDataset(torch.randn(4096, 3, 8, 8, generator=g),
                                          torch.randint(0, 10, (4096,), generator=g))


STALL_S = 60.0  # ``stall``'s trapped forward pass sleeps this long instead


class _Trap(torch.nn.Sequential):
    """A tiny CNN that sleeps ``TRAP_SLEEP_S`` in every training forward pass and, where ``trapped(self)`` says so,
    computes it ``TRAP_FACTOR`` times (sleeping ``stall_s`` instead, where given)."""

    def __init__(self, trapped: Callable[[torch.nn.Sequential], bool], stall_s: float = 0.0) -> None:
        super().__init__(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                         torch.nn.Linear(8 * 8 * 8, 10))
        self.trapped, self.stall_s = trapped, stall_s

    def forward(self, x: Any) -> Any:
        if self.training:
            trapped = self.trapped(self)
            time.sleep(self.stall_s if trapped and self.stall_s else TRAP_SLEEP_S)
            if trapped:
                with torch.no_grad():
                    for _ in range(TRAP_FACTOR - 1):
                        super().forward(x)
        return super().forward(x)


def _channels_last(model: torch.nn.Sequential) -> bool:
    weight = model[0].weight
    return bool(weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous())


def trap() -> Workload:
    """A tiny CNN on 3-channel images whose ``channels_last`` seed (offered on every CPU) runs tens of times slower, as
    fp16 autocast ran a CNN at 0.01-0.04x on a CPU with AVX512-FP16. Its step is a sleep per forward pass, so
    under ``--global-batch 256`` a larger batch per step (fewer accumulated passes) is the real gain: batch 64
    about 4x the default 16, at the same loss."""
    return Workload(model=lambda: _Trap(_channels_last),
                    dataset=_colour_images,
                    loss=lambda output, batch: torch.nn.functional.cross_entropy(output.float(), batch[1]),
                    optimizer=lambda params: torch.optim.SGD(params, lr=0.05), batch_size=TRAP_BATCH,
                    name="quality-trap")


def env_trap() -> Workload:
    """``trap`` whose trap is an environment knob's: ``interop_threads`` above 1 (set before torch starts, so
    measured in process pairs; it costs nothing where the model runs no inter-op work) makes every step tens of
    times slower."""
    return replace(trap(), model=lambda: _Trap(lambda _: torch.get_num_interop_threads() > 1),
                   name="quality-env-trap")


def ddp_trap() -> Workload:
    """``trap`` whose trap is more than one process (``processes``, measured in fresh trial processes)."""
    return replace(trap(), model=lambda: _Trap(lambda _: int(os.environ.get("WORLD_SIZE", "1")) > 1),
                   name="quality-ddp-trap")


def stall() -> Workload:
    """``trap`` whose trapped forward pass sleeps a minute: a step that outlasts any window, which only the
    parent can stop (by its elapsed time)."""
    return replace(trap(), model=lambda: _Trap(_channels_last, STALL_S))


HICCUP_S = 0.1  # ``hiccup``'s one-off stall: 30x its step, a third of a CPU window (``arms.WINDOW_FLOOR_S``)


class _Hiccup(_Trap):
    """``_Trap`` whose second training forward pass also sleeps ``HICCUP_S``, once in the model's life."""

    def __init__(self) -> None:
        super().__init__(_channels_last)
        self.passes = 0

    def forward(self, x: Any) -> Any:
        if self.training:
            self.passes += 1
            if self.passes == 2:
                time.sleep(HICCUP_S)
        return super().forward(x)


def hiccup() -> Workload:
    """``trap`` whose every model stalls once, in its second training step, for ``HICCUP_S``: as one step of an
    arm whose steps take milliseconds stalls on a busy VM (a preemption, a neighbour's burst) or builds a kernel
    late, where the arm is as fast as any other."""
    return replace(trap(), model=_Hiccup, name="quality-hiccup")


class _SlowToCompile(torch.nn.Sequential):
    """Sleeps ``COMPILE_SLEEP_S`` whenever torch.compile traces it: a compile that takes minutes; 3 ms a training
    step otherwise."""

    def forward(self, x: Any) -> Any:
        if torch.compiler.is_compiling():
            time.sleep(COMPILE_SLEEP_S)
        elif self.training:  # eager steps mostly asleep: the calibration's windows were one core's compute
            time.sleep(0.003)
        return super().forward(x)


COMPILE_SLEEP_S = 300.0


def slow_compile() -> Workload:
    """``regression`` whose model takes ``COMPILE_SLEEP_S`` to compile (eager: as ``regression``, 3 ms asleep a
    training step)."""
    return Workload(model=lambda: _SlowToCompile(*_mlp()), dataset=_regression_data, loss=_mse, optimizer=_sgd,
                    batch_size=64, name="quality-slow-compile")


LOAD_S = 0.0005  # a sample's read (a decode, an augmentation): 32 ms a batch of 64, where its step computes ~1 ms


class _SlowToLoad(torch.utils.data.Dataset):
    """``_regression_data`` whose every sample takes ``LOAD_S`` to read, asleep: a DataLoader worker hides it."""

    def __init__(self) -> None:
        self.data = _regression_data()

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Any:
        time.sleep(LOAD_S)
        return self.data[index]


def input_bound() -> Workload:
    """``regression`` whose samples are slow to read: its step waits for its data (``Arm.data_wait``)."""
    return Workload(model=_mlp, dataset=_SlowToLoad, loss=_mse, optimizer=_sgd, batch_size=64,
                    name="quality-input-bound")
