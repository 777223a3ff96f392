"""Whether a trial ran with the knobs it was asked for, from what the trial process reported.

A trial records what was in effect in its own process (``autotune.trial.training.in_effect``: the library
that served ``GOMP_parallel`` and ``malloc``, libiomp5's block time, what ``Tuned.prepare``/
``prepare_model`` applied). A knob that did not take (a preloaded library the dynamic linker ignored,
IPEX that failed to import) measured something else than the recipe says, so the search must not
score the recipe by it: ``not_in_effect`` names each such knob, and the search marks the trial
infeasible with that reason.

Memory binding is not a knob of its own: ``numactl --membind`` refused (containers) leaves the pinning
measured and valid, so it is not reported here; the search records it in the trial's params as
``membind=False`` instead (``membind_off``).

>>> not_in_effect({"allocator": "jemalloc"}, {"malloc_library": "libc.so.6"})
['allocator=jemalloc is not in effect: libc.so.6 serves malloc']
"""
from __future__ import annotations

from typing import Any

from . import _cuda as cuda
from . import _preload as preload


def not_in_effect(params: dict[str, Any], in_effect: dict[str, Any]) -> list[str]:
    """The knobs of ``params`` that ``in_effect`` (a trial's report) shows were not applied; unknown
    (a key the trial did not report) is not counted as missing."""
    if not in_effect:
        return []  # nothing reported (a failed trial, an older record): unknown, not missing
    problems = []
    for key, choices, reported, symbol in (("openmp", preload.OPENMP, "openmp_library", "GOMP_parallel"),
                                           ("allocator", preload.ALLOCATORS, "malloc_library", "malloc")):
        want, serving = params.get(key), in_effect.get(reported)
        if want not in choices or not serving:
            continue
        have = preload._kind(serving, choices) or ("default" if key == "allocator" else None)
        if have != preload.served_as(str(want)):
            problems.append(f"{key}={want} is not in effect: {serving} serves {symbol}")
    if (params.get("openmp") == "intel" and params.get("kmp_blocktime") is not None
            and in_effect.get("openmp_library") and in_effect.get("kmp_blocktime") is not None
            and int(in_effect["kmp_blocktime"]) != int(params["kmp_blocktime"])):
        problems.append(f"kmp_blocktime={params['kmp_blocktime']} is not in effect: libiomp5 runs with "
                        f"{in_effect['kmp_blocktime']}")
    if params.get("ipex") and "ipex" not in in_effect:
        problems.append("ipex=True is not in effect: intel_extension_for_pytorch was not applied")
    pattern = params.get("sparsity_pattern")
    if pattern not in (None, "none") and float(params.get("sparsity") or 0) > 0 and "sparsity" not in in_effect:
        problems.append(f"sparsity_pattern={pattern} (sparsity={params.get('sparsity')}) is not in effect: "
                        "no layer was sparsified")
    precision, ran = params.get("matmul_precision"), in_effect.get("matmul_precision")
    if params.get("device") != "cuda" and precision is not None and ran is not None and ran != precision:
        problems.append(f"matmul_precision={precision} is not in effect: the process ran with {ran}")
    return problems + _cuda_not_in_effect(params, in_effect)


def _cuda_not_in_effect(params: dict[str, Any], in_effect: dict[str, Any]) -> list[str]:
    """TF32 and the allocator's variables of a CUDA trial, as its process reported them."""
    if params.get("device") != "cuda":
        return []
    problems = []
    tf32, want = in_effect.get("tf32") or {}, cuda.wanted(params)
    for key, reported in (("tf32_matmul", "matmul"), ("tf32_cudnn", "cudnn")):
        if reported in tf32 and bool(tf32[reported]) != want[key]:
            problems.append(f"{key}={want[key]} is not in effect: the process ran with {tf32[reported]}")
    env = in_effect.get("env")
    if isinstance(env, dict):
        wanted_env = cuda.environment(params, None)  # type: ignore[arg-type]  # the facts are not read
        for var in cuda.ENV_VARS:
            if env.get(var) != wanted_env.get(var):
                problems.append(f"cuda_alloc={params.get('cuda_alloc')} is not in effect: {var} was "
                                f"{env.get(var)!r}")
    return problems


def membind_off(wanted: tuple[int, ...] | None, in_effect: dict[str, Any]) -> bool:
    """Whether memory binding to ``wanted`` nodes (``search_spaces.memory_nodes``) was asked for but the
    trial's process ran with another memory policy (``numactl --membind`` refused or missing)."""
    policy = in_effect.get("memory_policy")
    return bool(wanted) and isinstance(policy, str) and not policy.startswith("bind")
