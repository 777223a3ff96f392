"""A tiny transformer language model (2 layers, d=128) on synthetic Markov-chain tokens."""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ._workload import Workload

if TYPE_CHECKING:
    import torch
from ._synthetic import markov_tokens

VOCAB, SEQ, DIM = 256, 64, 128


def _model() -> torch.nn.Module:
    import torch
    from torch import nn

    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, DIM)
            self.pos = nn.Parameter(torch.zeros(SEQ, DIM))
            layer = nn.TransformerEncoderLayer(DIM, nhead=4, dim_feedforward=4 * DIM, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
            self.head = nn.Linear(DIM, VOCAB)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ), persistent=False)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            x = self.embed(tokens) + self.pos[: tokens.shape[1]]
            return self.head(self.encoder(x, mask=self.mask, is_causal=True))

    return TinyLM()


def _loss(output: torch.Tensor, batch: Any) -> torch.Tensor:
    import torch.nn.functional as F

    return F.cross_entropy(output.float().reshape(-1, VOCAB), batch[1].reshape(-1))


def _optimizer(params: Iterator[torch.nn.Parameter]) -> torch.optim.Optimizer:
    import torch

    return torch.optim.AdamW(params, lr=1e-3)


def workload() -> Workload:
    return Workload(
        model=_model,
        dataset=lambda: markov_tokens(2048, SEQ, VOCAB),
        loss=_loss,
        optimizer=_optimizer,
        batch_size=32,
        name="transformer",
    )
