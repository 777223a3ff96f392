"""CUDA backend settings: TF32 for matmuls and for cuDNN (separately), ``cudnn.benchmark``, the caching allocator.

| recipe key | PyTorch's default | offered | set as |
| --- | --- | --- | --- |
| ``tf32_matmul`` | ``False`` | CUDA, compute capability >= 8.0 | ``torch.backends.cuda.matmul.fp32_precision`` |
| ``tf32_cudnn`` | ``True`` | CUDA 8.0+, conv models | ``torch.backends.cudnn.conv``/``.rnn.fp32_precision`` |
| ``cudnn_benchmark`` | ``False`` | CUDA, conv models | ``torch.backends.cudnn.benchmark`` |
| ``cuda_alloc`` | ``default`` | CUDA: ``expandable_segments`` | ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` |

Defaults are PyTorch's own ("TensorFloat-32 (TF32) on Ampere (and later) devices", PyTorch CUDA semantics:
cuDNN convolutions use TF32 by default, float32 matmuls do not), so the baseline measures what a user's
unchanged script runs. Where the installed torch has the ``fp32_precision`` API (2.9+) it is used and the
legacy ``allow_tf32`` flags are never touched: torch raises when the two are mixed. A precision is
``"tf32"`` (on) or ``"ieee"`` (off). ``cudnn.benchmark``
autotunes convolution algorithms per input shape: it pays for models with fixed shapes.

``apply_process`` sets only what the recipe changes from PyTorch's defaults; where the process already
differs from what was measured (a flag the user's script set before ``autotune.apply()``), it warns,
naming the flag. ``PYTORCH_CUDA_ALLOC_CONF`` is read when CUDA's allocator starts, so it is an
environment-level knob (the env file, ``autotune run``); every other knob here is in-process.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._context import SpaceContext
from ._family import NoOp, Params, SuggestingTrial

if TYPE_CHECKING:
    from ..probes import Facts

KEYS = ("tf32_matmul", "tf32_cudnn", "cudnn_benchmark", "cuda_alloc")
ENV_VARS: tuple[str, ...] = ("PYTORCH_CUDA_ALLOC_CONF",)
OVERRIDES: tuple[str, ...] = ()
ALLOC = ("default", "expandable_segments")
EXPANDABLE = "expandable_segments:True"

check_environment = NoOp.check_environment  # the variable is checked by search_spaces.check_environment
prepare_model = NoOp.prepare_model
prepare = NoOp.prepare


def capability(facts: Facts) -> float:
    """The lowest compute capability of the GPUs CUDA can use (0.0: none)."""
    return min((float(g.compute_capability) for g in facts.gpus), default=0.0)


def space(trial: SuggestingTrial, facts: Facts, ctx: SpaceContext) -> Params:
    params = defaults(facts, ctx)
    if ctx.device != "cuda":
        return params
    convs = ctx.conv or ctx.conv_nd
    if capability(facts) >= 8.0:
        params["tf32_matmul"] = trial.suggest_categorical("tf32_matmul", (False, True))
        if convs:
            params["tf32_cudnn"] = trial.suggest_categorical("tf32_cudnn", (True, False))
    if convs:
        params["cudnn_benchmark"] = trial.suggest_categorical("cudnn_benchmark", (False, True))
    params["cuda_alloc"] = trial.suggest_categorical("cuda_alloc", ALLOC)
    return params


def defaults(facts: Facts, ctx: SpaceContext) -> Params:
    """PyTorch's defaults: TF32 for cuDNN only, no benchmark mode, the allocator as it comes."""
    return {"tf32_matmul": False, "tf32_cudnn": True, "cudnn_benchmark": False, "cuda_alloc": "default"}


heuristic = defaults  # run_cpu is for CPUs


def promising(facts: Facts, ctx: SpaceContext) -> list[Params]:
    """TF32 matmuls (Ampere+) and cuDNN's benchmark mode for conv models: the usual first GPU wins."""
    if ctx.device != "cuda":
        return []
    seeds: list[Params] = [{"tf32_matmul": True}] if capability(facts) >= 8.0 else []
    return seeds + ([{"cudnn_benchmark": True}] if ctx.conv or ctx.conv_nd else [])


def environment(params: Params, facts: Facts) -> dict[str, str]:
    return {"PYTORCH_CUDA_ALLOC_CONF": EXPANDABLE} if params.get("cuda_alloc") == "expandable_segments" else {}


@dataclass(frozen=True)
class Flag:
    """One process-wide torch flag: its name in warnings, how to read and set it, PyTorch's default."""

    name: str
    get: Callable[[], bool]
    set: Callable[[bool], None]
    default: bool


def _precision(*owners: Any) -> tuple[Callable[[], bool], Callable[[bool], None]]:
    """Read/write TF32 through ``fp32_precision`` ("tf32" or "ieee") of these backends: read the first."""

    def get() -> bool:
        return str(owners[0].fp32_precision) == "tf32"

    def set_(on: bool) -> None:
        for owner in owners:
            owner.fp32_precision = "tf32" if on else "ieee"

    return get, set_


def flags() -> dict[str, Flag]:
    """The recipe keys' torch flags, through the API this torch has."""
    import torch

    backends = torch.backends
    cudnn: Any = backends.cudnn
    if hasattr(backends.cuda.matmul, "fp32_precision") and hasattr(cudnn, "conv"):
        matmul = ("torch.backends.cuda.matmul.fp32_precision", *_precision(backends.cuda.matmul))
        conv = ("torch.backends.cudnn.conv.fp32_precision", *_precision(cudnn.conv, cudnn.rnn))
    else:  # torch before 2.9: the allow_tf32 flags
        matmul = ("torch.backends.cuda.matmul.allow_tf32", lambda: bool(backends.cuda.matmul.allow_tf32),
                  lambda on: setattr(backends.cuda.matmul, "allow_tf32", on))
        conv = ("torch.backends.cudnn.allow_tf32", lambda: bool(cudnn.allow_tf32),
                lambda on: setattr(cudnn, "allow_tf32", on))
    return {
        "tf32_matmul": Flag(*matmul, default=False),
        "tf32_cudnn": Flag(*conv, default=True),
        "cudnn_benchmark": Flag("torch.backends.cudnn.benchmark", lambda: bool(cudnn.benchmark),
                                lambda on: setattr(cudnn, "benchmark", on), default=False),
    }


def wanted(params: Params) -> dict[str, bool]:
    """The flags' values a recipe measured. A recipe from before the split has one ``tf32`` key, which set
    matmul and cuDNN TF32 alike."""
    legacy = params.get("tf32")
    out = {}
    for key, default in (("tf32_matmul", False), ("tf32_cudnn", True), ("cudnn_benchmark", False)):
        value = params.get(key)
        if value is None and legacy is not None and key.startswith("tf32"):
            value = legacy
        out[key] = default if value is None else bool(value)
    return out


def apply_process(params: Params, facts: Facts | None) -> list[str]:
    """Set the flags the recipe changes from PyTorch's defaults (CUDA recipes only); warn, naming the flag,
    where this process runs with another value than the recipe measured."""
    if params.get("device") != "cuda":
        return []
    problems = []
    for key, flag in flags().items():
        want = wanted(params)[key]
        if want != flag.default:
            flag.set(want)
        elif flag.get() != want:
            problems.append(f"{flag.name} is {_shown(flag, not want)} in this process, but the recipe was measured "
                            f"with {_shown(flag, want)} (PyTorch's default): remove the line of your script that "
                            "sets it, or search again with it")
    return problems


def _shown(flag: Flag, on: bool) -> str:
    if flag.name.endswith("fp32_precision"):
        return repr("tf32" if on else "ieee")
    return str(on)


def tf32_in_effect() -> dict[str, bool]:
    """TF32 for float32 matmuls and cuDNN convolutions, as the CUDA kernels will read them."""
    current = flags()
    return {"matmul": current["tf32_matmul"].get(), "cudnn": current["tf32_cudnn"].get()}
