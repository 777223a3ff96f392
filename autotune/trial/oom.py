"""Is a failure an out-of-memory, whichever library ran out? The trial child's ``oom`` vs ``crash``.

Types first, then documented codes; a message is read only where the library gives nothing else:

| source | how it reaches Python | recognised by |
| --- | --- | --- |
| host memory | ``MemoryError`` | type |
| CUDA caching allocator | ``torch.OutOfMemoryError`` | type |
| a CUDA call | ``torch.AcceleratorError`` | ``error_code`` 2, ``cudaErrorMemoryAllocation`` |
| torch.compile | dynamo/inductor's error wrapping one | ``inner_exception``, ``__cause__``, ``__context__`` |
| cuBLAS, cuDNN, ... | ``RuntimeError`` naming the status | the documented status name (below) |
| NCCL | ``torch.distributed.DistBackendError`` | its "Cuda failure" report of CUDA error 2 |

The status names are the libraries' documented enumerators for an allocation failure:
``CUBLAS_STATUS_ALLOC_FAILED`` (cuBLAS docs, cublasStatus_t: "Resource allocation failed inside the cuBLAS
library"), ``CUDNN_STATUS_ALLOC_FAILED`` (cuDNN 8, cudnnStatus_t) and cuDNN 9's
``CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED`` / ``..._DEVICE_ALLOCATION_FAILED``,
``CUSPARSE_STATUS_ALLOC_FAILED``, ``CUSOLVER_STATUS_ALLOC_FAILED``. torch raises those failures as plain
``RuntimeError`` with the status name in the text (``TORCH_CUDABLAS_CHECK``, ``AT_CUDNN_CHECK``), so the
name is all there is to match. NCCL reports a CUDA failure as ``Cuda failure 2 'out of memory'`` (NCCL's
``CUDACHECK``: the cudaError_t and ``cudaGetErrorString``), inside a ``DistBackendError``.

>>> import torch
>>> is_out_of_memory(RuntimeError("compile failed"))
False
>>> try:
...     try:
...         raise torch.OutOfMemoryError("CUDA out of memory")
...     except torch.OutOfMemoryError as oom:
...         raise RuntimeError("backend failed") from oom
... except RuntimeError as wrapped:
...     is_out_of_memory(wrapped)
True
"""
from __future__ import annotations

import re

from ..errors import error_chain

CUDA_ERROR_MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation
LIBRARY_ALLOC_FAILED = re.compile(
    r"\b(CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED"
    r"|CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED|CUSPARSE_STATUS_ALLOC_FAILED"
    r"|CUSOLVER_STATUS_ALLOC_FAILED)\b")
NCCL_CUDA_OOM = re.compile(r"Cuda failure (2 )?'out of memory'")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` or an exception it wraps is an allocation failure (see the module's table)."""
    import torch
    import torch.distributed

    for e in error_chain(error):
        if isinstance(e, (MemoryError, torch.OutOfMemoryError)):
            return True
        if isinstance(e, torch.AcceleratorError) and getattr(e, "error_code", None) == CUDA_ERROR_MEMORY_ALLOCATION:
            return True
        if isinstance(e, torch.distributed.DistBackendError) and NCCL_CUDA_OOM.search(str(e)):
            return True
        if type(e) is RuntimeError and LIBRARY_ALLOC_FAILED.search(str(e)):
            return True
    return False
