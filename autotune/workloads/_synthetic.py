"""Learnable synthetic data, generated deterministically from a seed (no download)."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SEED = 1234


def class_images(n: int, classes: int, size: int, channels: int = 3) -> torch.utils.data.TensorDataset:
    """Images whose class decides a low-frequency pattern, plus noise: a CNN can learn them."""
    import torch

    g = torch.Generator().manual_seed(SEED)
    patterns = torch.randn(classes, channels, 4, 4, generator=g)
    labels = torch.randint(0, classes, (n,), generator=g)
    images = torch.nn.functional.interpolate(patterns[labels], size=(size, size), mode="bilinear")
    images = images + 0.8 * torch.randn(n, channels, size, size, generator=g)
    return torch.utils.data.TensorDataset(images, labels)


def markov_tokens(n: int, seq_len: int, vocab: int) -> torch.utils.data.TensorDataset:
    """Sequences from a sparse random Markov chain: next-token prediction is learnable."""
    import torch

    g = torch.Generator().manual_seed(SEED)
    successors = torch.randint(0, vocab, (vocab, 4), generator=g)
    tokens = torch.empty(n, seq_len + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, vocab, (n,), generator=g)
    for t in range(seq_len):
        choice = torch.randint(0, 4, (n,), generator=g)
        tokens[:, t + 1] = successors[tokens[:, t], choice]
    return torch.utils.data.TensorDataset(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
