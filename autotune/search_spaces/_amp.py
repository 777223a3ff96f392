"""Mixed precision: ``amp_dtype``, and ``channels_last`` (models whose convolutions are all 2-D).

No environment variables. In-process: an autocast context around the forward pass and the loss,
a GradScaler for float16 and the model's memory format (TF32 is the ``cuda`` family's). channels_last is
a 4-D memory format: a Conv1d/Conv3d weight cannot take it (``model.to`` raises), so such models are not
offered it. On CUDA, float16 needs tensor cores (compute capability 7.0+: Volta) and bfloat16 8.0+.
A dtype is offered only where the hardware computes it natively (probed ISA / compute capability): emulated,
it runs many times slower than float32.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..workloads import output_tensors
from ._context import SpaceContext
from ._family import Params, Prepared, SuggestingTrial
from ._rules import BOOLEAN, Rule, one_of

if TYPE_CHECKING:
    import torch

    from ..probes import Facts

KEYS = ("amp_dtype", "channels_last")
ENV_VARS: tuple[str, ...] = ()
OVERRIDES: tuple[str, ...] = ()

_CPU_BF16 = {"avx512_bf16", "amx_bf16", "bf16"}  # "bf16": arm FEAT_BF16
_CPU_FP16 = {"avx512_fp16", "amx_fp16"}


def _capability(facts: Facts) -> float:
    return min((float(g.compute_capability) for g in facts.gpus), default=0.0)


DTYPES = ("float32", "bfloat16", "float16")  # every dtype some hardware is offered (``dtypes``)
SCHEMA: dict[str, Rule] = {"amp_dtype": one_of(DTYPES), "channels_last": BOOLEAN}
MEMORY_KEYS = KEYS  # the activations' dtype and layout decide what a batch holds
IN_PLACE = KEYS  # read at every forward pass, or set on the model in place


def dtypes(facts: Facts, ctx: SpaceContext) -> tuple[str, ...]:
    """The autocast dtypes this hardware computes natively."""
    choices = [DTYPES[0]]
    if ctx.device == "cuda":
        if _capability(facts) >= 8.0:
            choices.append("bfloat16")
        if _capability(facts) >= 7.0:  # fp16 tensor cores: Volta on; older GPUs emulate it slower than fp32
            choices.append("float16")
    else:
        isa = set(facts.cpu.isa)
        if isa & _CPU_BF16:
            choices.append("bfloat16")
        if isa & _CPU_FP16:
            choices.append("float16")
    return tuple(choices)


def space(trial: SuggestingTrial, facts: Facts, ctx: SpaceContext) -> Params:
    params: dict[str, Any] = {"amp_dtype": trial.suggest_categorical("amp_dtype", dtypes(facts, ctx))}
    params["channels_last"] = trial.suggest_categorical("channels_last", (False, True)) if ctx.conv else False
    return params


def defaults(facts: Facts, ctx: SpaceContext) -> Params:
    return {"amp_dtype": "float32", "channels_last": False}


heuristic = defaults  # run_cpu does not change precision

# Hooks this family has nothing to do at (search_spaces._family).


def promising(facts: Facts, ctx: SpaceContext) -> list[Params]:
    """Single changes worth measuring first: each reduced-precision autocast this hardware offers, and for a
    convolutional model channels_last, alone and with each."""
    seeds: list[Params] = [{"amp_dtype": d} for d in dtypes(facts, ctx)[1:]]
    alone: Params = {}
    if ctx.conv:
        seeds += [{"channels_last": True, **s} for s in [alone, *seeds]]
    return seeds


def autocast(params: dict[str, Any], device: str) -> contextlib.AbstractContextManager[None]:
    """The context to run forward pass and loss in: autocast, or nothing for float32."""
    import torch

    name = params.get("amp_dtype", "float32")
    if name == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device, dtype=getattr(torch, name))


def grad_scaler(params: dict[str, Any], device: str) -> torch.amp.GradScaler | None:
    """A GradScaler for float16 (its small range underflows gradients), else None."""
    import torch

    if params.get("amp_dtype") != "float16":
        return None
    return torch.amp.GradScaler(device)


def prepare_model(params: Params, model: torch.nn.Module, device: str) -> Prepared:
    """The model in channels_last memory format when the recipe says so (what the forward pass really ran
    with is recorded by ``forward_in_effect``)."""
    import torch

    if params.get("channels_last"):
        # torch's stubs for Module.to() leave out the memory_format keyword its implementation takes
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    return Prepared(model)


def relayout(params: Params, model: torch.nn.Module) -> None:
    """A running model put in the memory format ``params`` say, in place (its parameters' data): a copy switched
    between windows (``Tuned.switch``); its optimizer's state follows at the next step (``relayout_state``)."""
    import torch

    # torch's stubs for Module.to() leave out the memory_format keyword its implementation takes
    model.to(memory_format=torch.channels_last if params.get("channels_last")  # type: ignore[call-overload]
             else torch.contiguous_format)


def relayout_state(optimizer: torch.optim.Optimizer) -> None:
    """An optimizer's 4-D state (momentum, Adam's moments: one a parameter) in its parameter's memory format: after
    a switch of the model's layout it kept the old one, and each update mixed the two."""
    import torch

    for param, state in optimizer.state.items():
        if not isinstance(param, torch.Tensor) or param.dim() != 4:
            continue
        layout = torch.channels_last if param.is_contiguous(memory_format=torch.channels_last) \
            and not param.is_contiguous() else torch.contiguous_format
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.shape == param.shape:
                state[key] = value.contiguous(memory_format=layout)


def prepare_batch(params: dict[str, Any], batch: Any) -> Any:
    """Inputs in the model's memory format (4-D float tensors only); ``batch`` is whatever the user's
    DataLoader yields (``Any``, like the forward pass's inputs and output below)."""
    import torch

    if not params.get("channels_last"):
        return batch
    return tuple(
        t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 and t.is_floating_point() else t
        for t in batch
    )


def forward_in_effect(device: str, model: torch.nn.Module, inputs: Any, output: Any) -> dict[str, Any]:
    """What one training forward pass of ``model`` really ran with (``Tuned`` records its first one):
    the autocast dtype in force (None: autocast off), the dtype of the model's output, and whether the
    model's 4-D floating parameters and the 4-D floating inputs it received are all channels_last in memory
    (None: there are none)."""
    import torch

    kind = device.split(":")[0]
    autocast = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None
    out = next(iter(output_tensors(output)), None)

    def channels_last(tensors: Iterable[torch.Tensor]) -> bool | None:
        four_d = [t for t in tensors if t.dim() == 4 and t.is_floating_point()]
        return all(t.is_contiguous(memory_format=torch.channels_last) for t in four_d) if four_d else None

    return {
        "autocast": _dtype_name(autocast),
        "output_dtype": _dtype_name(None if out is None else out.dtype),
        "channels_last_parameters": channels_last(model.parameters()),
        "channels_last_inputs": channels_last(output_tensors(inputs)),
    }


def _dtype_name(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")
