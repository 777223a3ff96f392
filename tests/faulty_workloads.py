"""Workloads that fail on purpose, for the runner's and the study's fault handling.

The ``tiny`` MLP, with a loss function that misbehaves: the batch size tells it when (``oom``), the rank
(``killed_on_rank_1``), a file (``scripted``), or always. ``sleepy``, a CNN to the search whose steps are
sleep, serves the searches a test watches, stops or kills.
"""
from __future__ import annotations

import itertools
import json
import os
import signal
import time
from typing import Any

from autotune.workloads import Workload, tiny

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


def device_oom() -> Any:
    """Asks its device for a petabyte in the loss: a real out-of-memory error where the trial runs on a GPU."""
    import torch

    def loss(output: Any, batch: Any) -> Any:
        torch.empty(1 << 50, dtype=torch.uint8, device=output.device)
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


SLEEP_S = 0.01  # ``sleepy``'s sleep in every training forward pass: nearly all of a step (its compute: ~1 ms)


def sleepy() -> Any:
    """A model whose every training forward pass sleeps ``SLEEP_S``, twice that for a seed (channels_last weights
    or autocast: the search's first single change after the baseline on every CPU, autocast first where this
    machine's kernels measured bfloat16 fast), and whose compute is too small for an OpenMP team (an MSE loss:
    cross_entropy's kernels started one, and with the defaults' two threads on two busy cores a step took 20-50 ms
    where one thread took 1 ms). So its steps take about as long beside another test run as alone, and its A/A is
    narrow. Its convolution, unused, makes it a CNN for the search, which offers it the channels_last seed on
    every CPU. A seed is a candidate slower with confidence, which the race stops after its first interval and
    which is never confirmed. While the file named by ``AUTOTUNE_TEST_STALL`` exists, a seed's forward pass
    (never the baseline's) stalls: a trial that stays alive, its DataLoader workers and all, until the test
    removes the file or kills it, or the search stops it as far slower (14 s into a 10-minute search on a Zen 4:
    its first step outlasted the warm-up limit; before autocast counted as a seed, the bfloat16 seed that comes
    first there ran 2.5 s, unstalled)."""
    import torch

    class Sleepy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3)  # what makes it a CNN; its weights show channels_last
            self.scale = torch.nn.Parameter(torch.ones(10))

        def forward(self, x: Any) -> Any:
            if self.training:
                seed = _autocast() or (self.conv.weight.is_contiguous(memory_format=torch.channels_last)
                                       and not self.conv.weight.is_contiguous())
                flag = os.environ.get("AUTOTUNE_TEST_STALL")
                while seed and flag and os.path.exists(flag):
                    time.sleep(0.1)
                time.sleep(SLEEP_S * (2 if seed else 1))
            return x.flatten(1)[:, :10] * self.scale

    def _autocast() -> bool:
        try:
            return torch.is_autocast_enabled("cpu")
        except TypeError:  # torch before 2.4: no device argument
            return torch.is_autocast_cpu_enabled()

    def dataset() -> Any:
        g = torch.Generator().manual_seed(3)
        return torch.utils.data.TensorDataset(torch.randn(1024, 3, 8, 8, generator=g),
                                              torch.randn(1024, 10, generator=g))

    def loss(output: Any, batch: Any) -> Any:
        return torch.nn.functional.mse_loss(output.float(), batch[1])

    return Workload(model=Sleepy, dataset=dataset, loss=loss, optimizer=lambda params: torch.optim.SGD(params, lr=0.05),
                    batch_size=32, name="sleepy")


def killed() -> Any:
    """Dies by SIGKILL, as under the kernel's out-of-memory killer."""

    def loss(output: Any, batch: Any) -> Any:
        os.kill(os.getpid(), signal.SIGKILL)

    return _with_loss(loss)


def _no_core_dump() -> None:
    """A process dying by a signal must not leave a core file in the test's working directory."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def aborts() -> Any:
    """Dies by SIGABRT (``os.abort()``), as a failed assertion in a C++ extension does."""

    def loss(output: Any, batch: Any) -> Any:
        _no_core_dump()
        os.abort()

    return _with_loss(loss)


def segfaults() -> Any:
    """Dies by SIGSEGV: reads address 0, as a bug in native code does."""
    import ctypes

    def loss(output: Any, batch: Any) -> Any:
        _no_core_dump()
        ctypes.string_at(0)

    return _with_loss(loss)


def kills_its_dataloader_workers() -> Any:
    """At the first step, SIGKILLs the trial's DataLoader workers (as the OOM killer picks a worker)."""
    import multiprocessing

    import torch

    def loss(output: Any, batch: Any) -> Any:
        for worker in multiprocessing.active_children():
            os.kill(worker.pid, signal.SIGKILL)
        return torch.nn.functional.cross_entropy(output, batch[1])

    return _with_loss(loss)


def killed_on_rank_1() -> Any:
    """Rank 1 of a several-process trial dies by SIGKILL; rank 0 would wait for it."""
    import torch

    def loss(output: Any, batch: Any) -> Any:
        if os.environ.get("RANK") == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.nn.functional.cross_entropy(output, batch[1])

    return _with_loss(loss)


FAULTS = {"crash": crash, "abort": aborts, "segfault": segfaults, "nan": nan, "killed": killed}


def scripted() -> Any:
    """Each model trained takes the next fault from the JSON list in the file ``AUTOTUNE_TEST_FAULTS`` names
    (``"ok"``: none), at its first loss: a trial process trains one model, a paired worker one per arm (the
    defaults', the A/A copy, each candidate's). The search's own process, which never trains, takes none.
    Trials run one at a time on a host, so reading and rewriting the file needs no lock."""
    import torch

    base = tiny.workload()
    chosen: dict[int, Any] = {}  # a model's serial number -> its loss
    serials = itertools.count()  # not id(): a dropped arm's model frees its id for the next one

    class Tagged(torch.nn.Module):
        """The tiny model; its output says which model it came from (a tensor takes attributes)."""

        def __init__(self) -> None:
            super().__init__()
            self.inner, self.serial = base.model(), next(serials)

        def forward(self, x: Any) -> Any:
            if self.training:  # sleep-bound, as ``sleepy``: the calibration's windows were tiny's compute on both CPUs
                time.sleep(SLEEP_S / 2)
            out = self.inner(x)
            out.autotune_model = self.serial
            return out

    def loss(output: Any, batch: Any) -> Any:
        model = getattr(output, "autotune_model", None)
        if model not in chosen:
            path = os.environ["AUTOTUNE_TEST_FAULTS"]
            with open(path) as f:
                faults = json.load(f)
            name = faults.pop(0) if faults else "ok"
            with open(path, "w") as f:
                json.dump(faults, f)
            chosen[model] = tiny._loss if name == "ok" else FAULTS[name]().loss
        return chosen[model](output, batch)

    return type(base)(model=Tagged, dataset=base.dataset, loss=loss, optimizer=base.optimizer,
                      batch_size=base.batch_size, name="faulty")


def compiled_oom() -> Any:
    """Runs out of CUDA memory inside torch.compile: inductor wraps the OOM (``InductorError``) and the
    message says nothing of memory."""
    import torch
    from torch._inductor.exc import InductorError

    def loss(output: Any, batch: Any) -> Any:
        try:
            raise torch.OutOfMemoryError("fake: CUDA out of memory")
        except torch.OutOfMemoryError as e:
            raise InductorError(e, None) from None  # as inductor wraps it: by inner_exception only

    return _with_loss(loss)


def cublas_alloc_failed() -> Any:
    """cuBLAS cannot allocate its workspace: torch raises a plain RuntimeError naming cuBLAS's status."""

    def loss(output: Any, batch: Any) -> Any:
        raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")

    return _with_loss(loss)


def _with_spare_layer() -> Any:
    """tiny's MLP with a layer the forward never uses: its parameters get no gradient."""
    import torch

    class Spare(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net, self.spare = tiny._model(), torch.nn.Linear(64, 10)

        def forward(self, x: Any) -> Any:
            return self.net(x)

    return Spare()


def unused_parameter() -> Any:
    """The tiny workload whose model has an unused parameter: DDP without find_unused_parameters fails at
    the second step."""
    base = tiny.workload()
    return type(base)(model=_with_spare_layer, dataset=base.dataset, loss=base.loss, optimizer=base.optimizer,
                      batch_size=base.batch_size, name="unused")
