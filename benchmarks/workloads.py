"""Workloads the benchmarks search besides the bundled ones, written as a user would write them, each bounded by
something else: a recurrent model (sequential steps, small matmuls) and an input-bound one (per-sample
augmentation in the dataset's ``__getitem__``, a small MLP on top). ``--workload benchmarks/workloads.py:recurrent``
from the repository's root."""
from __future__ import annotations

from typing import Any

import torch

from autotune import Workload
from autotune.workloads._synthetic import markov_tokens

VOCAB, SEQ, HIDDEN = 128, 48, 128


class _GRULM(torch.nn.Module):
    """A one-layer GRU language model: its steps run one after another, each a small matmul."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.gru = torch.nn.GRU(HIDDEN, HIDDEN, batch_first=True)
        self.head = torch.nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(self.embed(tokens))
        return self.head(out)


def _token_loss(output: torch.Tensor, batch: Any) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(output.float().reshape(-1, VOCAB), batch[1].reshape(-1))


def recurrent() -> Workload:
    return Workload(model=_GRULM, dataset=lambda: markov_tokens(2048, SEQ, VOCAB), loss=_token_loss,
                    optimizer=lambda params: torch.optim.Adam(params, lr=3e-3), batch_size=32, name="recurrent")


class Augmented(torch.utils.data.Dataset):
    """Images shifted, flipped and blurred per sample, in Python, each time they are read."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(4096, 3, 32, 32, generator=g)
        self.y = torch.randint(0, 10, (4096,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.x[i]
        for _ in range(6):
            x = torch.roll(x, shifts=(int(i) % 3 - 1, 1), dims=(1, 2)).flip(2)
            x = torch.nn.functional.avg_pool2d(x.unsqueeze(0), 3, 1, 1).squeeze(0)
        return x.flatten()[:256], self.y[i]


def input_bound() -> Workload:
    return Workload(model=lambda: torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.ReLU(),
                                                      torch.nn.Linear(128, 10)),
                    dataset=Augmented,
                    loss=lambda out, batch: torch.nn.functional.cross_entropy(out.float(), batch[1]),
                    optimizer=lambda params: torch.optim.SGD(params, lr=0.05), batch_size=64, name="input-bound")
