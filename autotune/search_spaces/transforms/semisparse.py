"""2:4 semi-structured sparsity of ``nn.Linear`` weights for training on CUDA (compute capability >= 8.0).

In every group of 4 consecutive input weights of a row, the 2 of smallest magnitude are zeroed once
(``mask_2to4``) and stay zero: their gradients are masked. The forward matmul runs on the sparse tensor
cores: the masked weight is compressed with ``torch.sparse.to_sparse_semi_structured`` each step (the
weights change every step) and ``F.linear`` dispatches to cuSPARSELt / CUTLASS, half the multiply-adds.
The backward matmuls stay dense (the sparse kernels take the sparse operand on the left only), so about a
third of a layer's training FLOPs run sparse. Layers qualify when both dimensions are multiples of 64
(the kernels' shape constraint for fp16/bf16; fp32 needs 32). The parameters stay dense ``nn.Parameter``:
optimizers, ``state_dict`` and ``torch.compile`` see an ordinary Linear.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

MULTIPLE = 64


def eligible(module: nn.Module) -> bool:
    """A plain ``nn.Linear`` (not MultiheadAttention's out_proj, read by weight) the kernels accept."""
    return (
        type(module) is nn.Linear
        and module.in_features % MULTIPLE == 0
        and module.out_features % MULTIPLE == 0
    )


def mask_2to4(weight: torch.Tensor) -> torch.Tensor:
    """Boolean mask keeping the 2 largest-magnitude weights of every 4 along the input dimension.

    >>> mask_2to4(torch.tensor([[1.0, -4.0, 3.0, 0.5]])).tolist()
    [[False, True, True, False]]
    """
    rows, cols = weight.shape
    groups = weight.detach().abs().reshape(rows, cols // 4, 4)
    keep = groups.topk(2, dim=-1).indices
    return torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True).reshape(rows, cols)


class _SemiSparseLinear(torch.autograd.Function):
    # ctx is Any, as in torch.autograd.Function's own signatures
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                mask: torch.Tensor) -> torch.Tensor:
        dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else x.dtype
        dense = (weight * mask).to(dtype)
        with torch.autocast("cuda", enabled=False):
            sparse = torch.sparse.to_sparse_semi_structured(dense)
            out = nn.functional.linear(x.to(dtype), sparse, None if bias is None else bias.to(dtype))
        ctx.save_for_backward(x, dense, mask)
        ctx.has_bias = bias is not None
        ctx.dtypes = (x.dtype, weight.dtype)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, None]:
        x, dense, mask = ctx.saved_tensors
        grad2 = grad.reshape(-1, grad.shape[-1])
        grad_x = (grad2 @ dense.to(grad.dtype)).reshape(*x.shape[:-1], dense.shape[1]).to(ctx.dtypes[0])
        grad_w = (grad2.t() @ x.reshape(-1, x.shape[-1]).to(grad.dtype)).mul_(mask).to(ctx.dtypes[1])
        grad_b = grad2.sum(0).to(ctx.dtypes[1]) if ctx.has_bias else None
        return grad_x, grad_w, grad_b, None


class SemiSparseLinear(nn.Linear):
    """An ``nn.Linear`` whose forward matmul runs 2:4 sparse; built by ``from_linear``."""

    mask: torch.Tensor
    constant_buffers = ("mask",)  # chosen once: DDP need not broadcast it every step (search_spaces._ddp)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> SemiSparseLinear:
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.in_features, module.out_features = linear.in_features, linear.out_features
        module.weight, module.bias = linear.weight, linear.bias  # the same Parameters
        mask = mask_2to4(linear.weight)
        with torch.no_grad():
            module.weight.mul_(mask)
        module.register_buffer("mask", mask, persistent=False)  # a state_dict still loads into nn.Linear
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SemiSparseLinear.apply(x, self.weight, self.bias, self.mask)


def sparsify(model: nn.Module) -> dict[str, Any]:
    """Replace every eligible Linear of ``model`` (on CUDA) by a ``SemiSparseLinear``, in place."""
    names = [name for name, m in model.named_modules() if eligible(m)]
    total = sum(p.numel() for p in model.parameters())
    zeroed = 0
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        sparse = SemiSparseLinear.from_linear(getattr(parent, child))
        setattr(parent, child, sparse)
        zeroed += sparse.weight.numel() // 2
    return {"sparsity_pattern": "2:4", "layers": len(names), "zeroed_param_fraction": zeroed / total if total else 0.0}
