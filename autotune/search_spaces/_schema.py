"""What a recipe's params may hold: every key some family or run setting declares, each with the values the
search space could offer on some machine (the families' own constants: one source of truth with the space).
A recipe read from a file, the ``AUTOTUNE_RECIPE`` variable or a shared store is checked here before anything
applies it: one machine's recipe sets the environment and the training of every machine that fetches it.

>>> problems({"threads": "1; touch /tmp/x", "allocator": "/tmp/evil.so", "num_workers": -3})[0]
"threads='1; touch /tmp/x': not allowed (an integer from 1 to 4096)"
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import _amp as amp
from . import _batch as batch
from . import _compile as compilation
from . import _cuda as cuda
from . import _data as data
from . import _ddp as ddp
from . import _matmul as matmul
from . import _preload as preload
from . import _processes as processes
from . import _sparsity as sparsity
from . import _threads as threads
from ._context import SpaceContext

Check = Callable[[Any], bool]


def _integer(least: int, most: int) -> tuple[Check, str]:
    return (lambda v: type(v) is int and least <= v <= most), f"an integer from {least} to {most}"


def _optional_integer(least: int, most: int) -> tuple[Check, str]:
    def check(v: Any) -> bool:
        return v is None or (type(v) is int and least <= v <= most)
    return check, f"null or an integer from {least} to {most}"


def _one_of(choices: tuple[Any, ...]) -> tuple[Check, str]:
    # type-exact: True is not 1, and "25" is not 25
    return (lambda v: any(type(v) is type(c) and v == c for c in choices)), "one of " + ", ".join(map(repr, choices))


BOOLEAN: tuple[Check, str] = ((lambda v: type(v) is bool), "true or false")
SCHEMA: dict[str, tuple[Check, str]] = {
    "threads": _integer(1, threads.MOST), "interop_threads": _integer(1, threads.MOST_INTEROP),
    "affinity": _one_of(threads.AFFINITIES),
    "openmp": _one_of(preload.OPENMP), "kmp_blocktime": _one_of((None, *preload.BLOCKTIMES)),
    "allocator": _one_of(preload.ALLOCATORS),
    # batch_size: format 1 (``recipe``)
    "batch_per_rank": _integer(1, batch.MOST), "batch_size": _integer(1, batch.MOST),
    "num_workers": _integer(0, data.MOST_WORKERS), "pin_memory": BOOLEAN, "persistent_workers": BOOLEAN,
    "prefetch_factor": _one_of((None, *data.PREFETCH)),
    "amp_dtype": _one_of(amp.DTYPES), "channels_last": BOOLEAN, "matmul_precision": _one_of(matmul.PRECISIONS),
    "tf32_matmul": BOOLEAN, "tf32_cudnn": BOOLEAN, "tf32": BOOLEAN,  # tf32: before the split (``cuda.wanted``)
    "cudnn_benchmark": BOOLEAN, "cuda_alloc": _one_of(cuda.ALLOC),
    "compile_mode": _one_of(compilation.CUDA_MODES), "processes": _integer(1, processes.MOST),
    "gradient_as_bucket_view": BOOLEAN, "bucket_cap_mb": _one_of(ddp.BUCKET_CAP_MB), "static_graph": BOOLEAN,
    "find_unused_parameters": BOOLEAN,
    "sparsity_pattern": _one_of(sparsity.PATTERNS),
    "sparsity": ((lambda v: type(v) in (int, float) and 0 <= v <= sparsity.MOST),
                 f"a number from 0 to {sparsity.MOST}"),
    "ipex": BOOLEAN,
    "device": _one_of(("cpu", "cuda")), "global_batch": _optional_integer(1, batch.MOST),
    "lr_scaling": _one_of(batch.LR_RULES), "reference_batch": _optional_integer(1, batch.MOST),
    "membind": _one_of((None, False, True)),
}


def problems(params: Any) -> list[str]:
    """Each param that no search could have written: an unknown key, a value of another type, out of range or
    not offered, a batch above the largest the batch family offers; ``[]`` for a recipe it could have."""
    if not isinstance(params, dict):
        return [f"params is {type(params).__name__}, not an object of knobs"]
    out = []
    for key, value in params.items():
        if key not in SCHEMA:
            out.append(f"{key}={value!r}: not a knob autotune knows")
            continue
        check, allowed = SCHEMA[key]
        if not check(value):
            out.append(f"{key}={value!r}: not allowed ({allowed})")
    size, reference = params.get("batch_per_rank"), params.get("reference_batch")
    if not out and isinstance(size, int) and isinstance(reference, int):
        ctx = SpaceContext(device="cuda", default_batch_size=reference, global_batch=params.get("global_batch"))
        largest = max(batch.sizes(ctx))
        if size > largest:
            out.append(f"batch_per_rank={size}: not allowed (at most {largest}, the largest the search offers for a "
                       f"default batch of {reference})")
    return out
