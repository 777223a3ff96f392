"""Training and its bookkeeping, shared by a trial process (``autotune.trial.child``) and the paired engine's
arms (``autotune.measure.worker.arms``): what is in effect in this process, the batches of a DataLoader that name a dead
worker, the held-out loss, the loss schedule, the device's peak memory, and a failure as a trial records it."""
from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import distributed
from ..apply import Tuned
from ..errors import one_line
from ..probes import memory_policy, pinned_threads, process_cpus
from ..search_spaces import cuda, matmul, preload
from ..workloads import Workload
from .oom import is_out_of_memory
from .spec import Status, TrialResult


class NonFiniteLoss(ArithmeticError):
    """The loss became NaN or infinite."""


def in_effect() -> dict[str, Any]:
    """What this process actually runs with: the tests and the report check these. With ``Tuned.in_effect``
    (merged in by the caller): ``amp``, what the first training step's forward pass ran with."""
    import torch

    maps = Path("/proc/self/maps").read_text() if Path("/proc/self/maps").exists() else ""
    return {
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "cpus": process_cpus(),  # all threads': KMP_AFFINITY narrows the main thread to one CPU
        "pinned_threads": pinned_threads(),
        # TF32 for float32 matmuls and cuDNN convolutions, as the CUDA kernels will read them
        "tf32": cuda.tf32_in_effect(),  # read as the family sets it: torch raises on mixed TF32 APIs
        "matmul_precision": matmul.in_effect(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "memory_policy": memory_policy(),
        **preload.in_effect(),  # which libraries serve GOMP_parallel and malloc; libiomp5's block time
        "libiomp5": "libiomp5" in maps,
        "jemalloc": "libjemalloc" in maps,
        "tcmalloc": "libtcmalloc" in maps,
        "env": {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "KMP_", "MKL_"))
                or k in ("LD_PRELOAD", "MALLOC_CONF", *preload.HEAP_THRESHOLDS, *cuda.ENV_VARS)},
    }


def batches(loader: Any) -> Iterator[Any]:
    epoch = 0
    while True:
        if hasattr(loader.sampler, "set_epoch"):  # DistributedSampler: a new shuffle every pass
            loader.sampler.set_epoch(epoch)
        batches = iter(loader)  # held while a failure is examined: releasing it shuts its workers down
        try:
            yield from batches
        except Exception as error:
            if loader.num_workers > 0:
                raise_if_a_worker_died(error)
            raise
        epoch += 1


def raise_if_a_worker_died(error: Exception, wait_s: float = 0.5) -> None:
    """Name the DataLoader worker that died instead of what the loop saw of it: depending on when the
    worker died, a reset connection or a closed queue, before the kernel reports the worker dead."""
    from torch.utils.data._utils.signal_handling import _error_if_any_worker_fails

    deadline = time.monotonic() + wait_s
    while True:
        try:
            _error_if_any_worker_fails()  # RuntimeError naming the worker and its signal
        except RuntimeError as worker_error:
            raise worker_error from error
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)


def evaluate(workload: Workload, tuned: Tuned, model: Any, held_out: Any) -> float:
    """The loss on the held-out samples in float32 (or the workload's own metric)."""
    import torch

    plain = tuned.unwrap(model)
    plain.eval()
    try:
        with torch.no_grad():
            if workload.evaluate is not None:
                return float(workload.evaluate(plain))
            loader = torch.utils.data.DataLoader(held_out, batch_size=256, shuffle=False)
            total, count = 0.0, 0
            for batch in loader:
                batch = tuned.to_device(*batch)
                output = plain(*workload.model_inputs(batch))
                total += float(workload.loss(output.float(), batch)) * len(batch[0])
                count += len(batch[0])
            return total / max(1, count)
    finally:
        plain.train()


def schedule(loss_steps: int, warmup_steps: int, windows: int) -> tuple[int, int, int]:
    """``(warmup, window_steps, loss_window)``: the loss is taken after exactly ``loss_steps`` steps,
    that is after the warm-up and ``loss_window`` timed windows. When ``loss_steps`` leaves room for
    ``warmup_steps`` and one step per window, the windows' remainder joins the warm-up; otherwise (large
    batches) windows of one step go on past the loss, timed only.

    >>> schedule(28, 4, 3), schedule(13, 4, 3), schedule(7, 4, 3), schedule(2, 4, 3)
    ((4, 8, 3), (4, 3, 3), (4, 1, 3), (1, 1, 1))
    """
    warmup_steps = max(1, warmup_steps)  # the first step is never timed: it holds compilation
    if loss_steps >= warmup_steps + windows:
        window_steps = (loss_steps - warmup_steps) // windows
        return loss_steps - windows * window_steps, window_steps, windows
    warmup = max(1, min(warmup_steps, loss_steps - windows))
    return warmup, 1, loss_steps - warmup


def peak_memory(device: str) -> tuple[int | None, int | None]:
    """``(peak, device memory)`` in bytes since the last ``reset_peak_memory``: the most CUDA memory any
    rank's tensors held (``torch.cuda.max_memory_allocated``, a collective over the ranks) and this rank's
    device's memory (a MIG slice's own). ``(None, None)`` on the CPU: unknown, not 0."""
    if device != "cuda":
        return None, None
    import torch

    peak = int(distributed.max_over_ranks(float(torch.cuda.max_memory_allocated())))
    return peak, int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)


def reset_peak_memory(device: str) -> None:
    """Start the peak over again: after the warm-up, whose compilation and cuDNN autotuning are not training."""
    if device == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats()


def spread(rates: list[float]) -> float:
    if len(rates) < 2:
        return 0.0
    return (max(rates) - min(rates)) / statistics.median(rates)


def failure(error: BaseException) -> TrialResult:
    """A failed training as a trial records it: a NaN loss, out of memory (whichever library ran out,
    ``oom.is_out_of_memory``) or a crash, with the error in one line."""
    status = Status.NAN if isinstance(error, NonFiniteLoss) else Status.OOM if is_out_of_memory(error) else Status.CRASH
    message = one_line(str(error))[:500]
    # failed_at: of several ranks' failures the earliest is the cause, the others its consequences
    return TrialResult(status, error=f"{type(error).__name__}: {message}", failed_at=time.time())
