"""CUDA backend settings: TF32 for matmuls and for cuDNN (separately), ``cudnn.benchmark``, the caching allocator.

| recipe key | PyTorch's default | offered | set as |
| --- | --- | --- | --- |
| ``tf32_matmul`` | ``False`` | CUDA, compute capability >= 8.0 | ``torch.backends.cuda.matmul.allow_tf32`` |
| ``tf32_cudnn`` | ``True`` | CUDA 8.0+, conv models | ``torch.backends.cudnn.allow_tf32`` |
| ``cudnn_benchmark`` | ``False`` | CUDA, conv models | ``torch.backends.cudnn.benchmark`` |
| ``cuda_alloc`` | ``default`` | CUDA: ``expandable_segments`` | ``PYTORCH_ALLOC_CONF``, ``PYTORCH_CUDA_ALLOC_CONF`` |

Defaults are PyTorch's own ("TensorFloat-32 (TF32) on Ampere (and later) devices", PyTorch CUDA semantics:
cuDNN convolutions use TF32 by default, float32 matmuls do not), so the baseline measures what a user's
unchanged script runs. TF32 is set through the ``allow_tf32`` flags: on torch 2.9+ setting the newer
``fp32_precision`` attributes makes ``torch.get_float32_matmul_precision()`` and ``allow_tf32`` raise ("mix of
the legacy and new APIs"), which inductor's max-autotune and a user's own code read, while ``allow_tf32``
keeps both APIs readable (``torch.set_float32_matmul_precision`` would too, but it also switches oneDNN's
CPU matmuls). Reading falls back to ``fp32_precision`` where the user's script set that API. ``cudnn.benchmark``
autotunes convolution algorithms per input shape: it pays for models with fixed shapes.

``apply_process`` sets only what the recipe changes from PyTorch's defaults; where the process already
differs from what was measured (a flag the user's script set before ``autotune.apply()``), it warns,
naming the flag. ``set_flags`` sets every flag, defaults included: one model of a process with several
(``autotune.measure.worker.arms``) runs with its own. The allocator's variable is read when CUDA's allocator starts,
and cuDNN's algorithm choices are cached per process whatever the benchmark flag, so ``cuda_alloc`` and
``cudnn_benchmark`` are environment-level (``ENVIRONMENT_KEYS``: one value per process, compared across
processes); the TF32 knobs are in-process.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._context import SpaceContext
from ._family import Params, SuggestingTrial
from ._rules import BOOLEAN, Rule, one_of

if TYPE_CHECKING:
    from ..probes import Facts

KEYS = ("tf32_matmul", "tf32_cudnn", "cudnn_benchmark", "cuda_alloc")
ENVIRONMENT_KEYS = ("cudnn_benchmark", "cuda_alloc")  # one value per process (see the module docstring)
# torch 2.9+ reads the generic variable first; earlier versions read only the CUDA one
ENV_VARS: tuple[str, ...] = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
OVERRIDES: tuple[str, ...] = ()
ALLOC = ("default", "expandable_segments")
EXPANDABLE = "expandable_segments:True"
# tf32: one key before the split into tf32_matmul and tf32_cudnn (``wanted``)
SCHEMA: dict[str, Rule] = {"tf32_matmul": BOOLEAN, "tf32_cudnn": BOOLEAN, "tf32": BOOLEAN, "cudnn_benchmark": BOOLEAN,
                           "cuda_alloc": one_of(ALLOC)}
# Expandable segments leave less memory fragmented, so a batch that did not fit may; with cudnn_benchmark cuDNN
# picks among algorithms by speed, some with larger workspaces, so one that fit may not.
MEMORY_KEYS = ("cuda_alloc", "cudnn_benchmark")


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
    return dict.fromkeys(ENV_VARS, EXPANDABLE) if params.get("cuda_alloc") == "expandable_segments" else {}


def env_forms(params: Params) -> dict[str, str]:
    return dict.fromkeys(ENV_VARS, re.escape(EXPANDABLE)) if params.get("cuda_alloc") == "expandable_segments" else {}


def check_environment(params: Params, facts: Facts) -> list[str]:
    """A CUDA recipe of the default allocator run where the user's environment configures it (a recipe's
    own value is checked by ``search_spaces.check_environment``)."""
    if params.get("device") != "cuda" or environment(params, facts):
        return []
    return [f"{var} unset (is {os.environ[var]!r})" for var in ENV_VARS if os.environ.get(var)]


@dataclass(frozen=True)
class Flag:
    """One process-wide torch flag: its name in warnings, how to read and set it, PyTorch's default."""

    name: str
    get: Callable[[], bool]
    set: Callable[[bool], None]
    default: bool


def _read(legacy: Callable[[], Any], owner: Any) -> Callable[[], bool]:
    """Read a TF32 flag through ``allow_tf32``; where the process set ``fp32_precision`` (torch 2.9+), reading
    the legacy flag raises, and that API's answer is taken."""

    def get() -> bool:
        try:
            return bool(legacy())
        except RuntimeError:
            return str(owner.fp32_precision) == "tf32"

    return get


def flags() -> dict[str, Flag]:
    """The recipe keys' torch flags (see the module docstring for why ``allow_tf32``)."""
    import torch

    backends = torch.backends
    cudnn: Any = backends.cudnn
    matmul: Any = backends.cuda.matmul
    conv = getattr(cudnn, "conv", cudnn)  # read only where fp32_precision exists (torch 2.9+)
    return {
        "tf32_matmul": Flag("torch.backends.cuda.matmul.allow_tf32", _read(lambda: matmul.allow_tf32, matmul),
                            lambda on: setattr(matmul, "allow_tf32", on), default=False),
        "tf32_cudnn": Flag("torch.backends.cudnn.allow_tf32", _read(lambda: cudnn.allow_tf32, conv),
                           lambda on: setattr(cudnn, "allow_tf32", on), default=True),
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
            problems.append(f"{flag.name} is {not want} in this process, but the recipe was measured with {want} "
                            "(PyTorch's default): remove the line of your script that sets it, or search again with it")
    return problems


def set_flags(params: Params) -> None:
    """Set every flag to the recipe's value, defaults included (CUDA recipes only): the start of a window of
    one of several models in a process, whose flags the others' windows changed."""
    if params.get("device") != "cuda":
        return
    for key, flag in flags().items():
        flag.set(wanted(params)[key])


def tf32_in_effect() -> dict[str, bool]:
    """TF32 for float32 matmuls and cuDNN convolutions, as the CUDA kernels will read them."""
    current = flags()
    return {"matmul": current["tf32_matmul"].get(), "cudnn": current["tf32_cudnn"].get()}
