"""Out-of-memory from every source is ``oom``, not ``crash``: by type, documented code or status name."""
from __future__ import annotations

import pytest
import torch
import torch.distributed
from torch._dynamo.exc import BackendCompilerFailed
from torch._inductor.exc import InductorError

from autotune.search_spaces import SpaceContext, defaults
from autotune.trial import run_trial
from autotune.trial.oom import is_out_of_memory

FAULTY = "tests.faulty_workloads"


def _raised(outer, inner):
    """``outer`` raised while handling ``inner`` (``__context__``), as an ``except`` block would."""
    try:
        try:
            raise inner
        except BaseException:
            raise outer  # noqa: B904 - the implicit chain is the point
    except BaseException as e:
        return e


def _accelerator(code):
    e = torch.AcceleratorError("CUDA error")
    e.error_code = code  # set by torch's C++ side (c10::AcceleratorError)
    return e


OOM = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


@pytest.mark.parametrize(("error", "oom"), [
    (MemoryError(), True),
    (OOM, True),
    (torch.cuda.OutOfMemoryError("x"), True),
    (_accelerator(2), True),  # cudaErrorMemoryAllocation
    (_accelerator(700), False),  # cudaErrorIllegalAddress
    (InductorError(OOM, None), True),  # wrapped by inner_exception only
    (BackendCompilerFailed(lambda: None, OOM, None), True),
    (_raised(RuntimeError("while compiling"), OOM), True),  # __context__
    (_raised(ValueError("outer"), ValueError("inner")), False),
    (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), True),
    (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), True),
    (RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"), True),
    (RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm`"), False),
    (torch.distributed.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error, NCCL "
                                        "version 2.21.5\nLast error:\nCuda failure 2 'out of memory'"), True),
    (torch.distributed.DistBackendError("NCCL error: remote process exited or there was a network error"), False),
    (RuntimeError("my model ran out of memory budget"), False),  # a message alone proves nothing
    (ValueError("CUBLAS_STATUS_ALLOC_FAILED"), False),  # not how torch reports cuBLAS: the user's own
])
def test_out_of_memory_is_recognised_by_type_code_or_status(error, oom) -> None:
    assert is_out_of_memory(error) is oom


@pytest.mark.parametrize(("workload", "error"), [
    (f"{FAULTY}:compiled_oom", "InductorError"),
    (f"{FAULTY}:cublas_alloc_failed", "CUBLAS_STATUS_ALLOC_FAILED"),
])
def test_a_trial_that_runs_out_of_memory_anywhere_is_oom(facts, fast_settings, workload, error) -> None:
    params = {**defaults(facts, SpaceContext(default_batch_size=32)), "device": "cpu", "reference_batch": 32,
              "batch_size": 16}
    result = run_trial(workload, params, facts, fast_settings, timeout_s=120)
    assert (result.status, result.samples_per_s) == ("oom", None)
    assert error in result.error
