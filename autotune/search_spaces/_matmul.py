"""float32 matmuls on the CPU: ``matmul_precision``, oneDNN's bfloat16 path for them where the CPU computes bf16.

| recipe key | PyTorch's default | offered | set as |
| --- | --- | --- | --- |
| ``matmul_precision`` | ``highest`` | CPU with AVX512-BF16 or AMX-BF16 | ``torch.set_float32_matmul_precision`` |

``medium`` lets oneDNN run float32 matmuls (``mm``, ``addmm``, ``bmm``: Linear layers, attention) on the CPU's
bfloat16 units while the model, its activations and its gradients stay float32. It is the float32 model's way to
those units, beside autocast's (``amp_dtype``), which also runs the other operators in bfloat16; the quality guard
judges its loss as any knob's. Convolutions are left alone (oneDNN's ``conv.fp32_precision``): their bfloat16 path
was not faster. Set through ``torch.set_float32_matmul_precision``, the API a user's script and
inductor read (``torch.backends.mkldnn.matmul.fp32_precision`` set directly makes the legacy reader raise on a
mix of the two APIs). No environment variable: in-process and process-global, so one model of a process with
several (``autotune.measure.worker.arms``) sets it at each of its windows (``set_flags``). CUDA recipes leave it to the
``cuda`` family's TF32 flags: the same function switches TF32 there.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._context import SpaceContext
from ._family import Params, SuggestingTrial
from ._rules import Rule, one_of

if TYPE_CHECKING:
    from ..probes import Facts

KEYS = ("matmul_precision",)
ENV_VARS: tuple[str, ...] = ()
OVERRIDES: tuple[str, ...] = ()
PRECISIONS = ("highest", "medium")  # torch's names; "high" (TF32) has no CPU units to run on here
SCHEMA: dict[str, Rule] = {"matmul_precision": one_of(PRECISIONS)}
IN_PLACE = KEYS  # torch.set_float32_matmul_precision takes effect at the next matmul
_CPU_BF16 = {"avx512_bf16", "amx_bf16"}


def offered(facts: Facts, ctx: SpaceContext) -> bool:
    """On the CPU, where it computes bfloat16 natively (emulated, bf16 runs many times slower than float32)."""
    return ctx.device == "cpu" and bool(set(facts.cpu.isa) & _CPU_BF16)


def space(trial: SuggestingTrial, facts: Facts, ctx: SpaceContext) -> Params:
    if not offered(facts, ctx):
        return defaults(facts, ctx)
    return {"matmul_precision": trial.suggest_categorical("matmul_precision", PRECISIONS)}


def defaults(facts: Facts, ctx: SpaceContext) -> Params:
    return {"matmul_precision": "highest"}


heuristic = defaults  # run_cpu leaves the precision alone


def promising(facts: Facts, ctx: SpaceContext) -> list[Params]:
    return [{"matmul_precision": "medium"}] if offered(facts, ctx) else []


def wanted(params: Params) -> str:
    value = params.get("matmul_precision")
    return value if value in PRECISIONS else "highest"


def in_effect() -> str:
    """The precision float32 matmuls run at in this process: torch's reading, or oneDNN's where the process set
    the newer per-backend API (then the legacy reader raises)."""
    import torch

    try:
        return torch.get_float32_matmul_precision()
    except RuntimeError:
        onednn: Any = torch.backends.mkldnn  # its per-backend precision (torch 2.9+) is not in torch's stubs
        return "medium" if str(onednn.matmul.fp32_precision) == "bf16" else "highest"


def apply_process(params: Params, facts: Facts | None) -> list[str]:
    """Set the recipe's precision where it is not PyTorch's (CPU recipes only); warn where this process runs with
    another than the recipe measured (the user's script set it before ``autotune.apply()``)."""
    import torch

    if params.get("device") == "cuda":
        return []
    want = wanted(params)
    if want != "highest":
        torch.set_float32_matmul_precision(want)
        return []
    have = in_effect()
    if have != want:
        return [f"torch's float32 matmul precision is {have!r} in this process, but the recipe was measured with "
                f"{want!r} (PyTorch's default): remove the line of your script that sets it, or search again with it"]
    return []


def set_flags(params: Params) -> None:
    """Set the recipe's precision, the default included (CPU recipes only): the start of a window of one of several
    models in a process, whose precision the others' windows changed."""
    import torch

    if params.get("device") != "cuda":
        torch.set_float32_matmul_precision(wanted(params))
