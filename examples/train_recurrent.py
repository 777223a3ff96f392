"""A user's own training script: a one-layer GRU language model on Markov-chain tokens (``benchmarks/workloads.py``'s
``recurrent``, written out plainly), tuned by ``autotune.apply()``. Its steps run one after another, each a small
matmul: threads and precision pay differently here than on the CNN.

Plain:                       python examples/train_recurrent.py
With a recipe:               autotune run --recipe best.env -- python examples/train_recurrent.py

It trains for ``TRAIN_S`` seconds (default 8) after 5 warm-up steps and prints one JSON line, as ``train_cnn.py``
does; ``benchmarks/user_script.py --script examples/train_recurrent.py`` runs it both ways to check what the search
claimed for ``--workload benchmarks/workloads.py:recurrent``.
"""
import json
import os
import time

import torch
from torch import nn

tuned = None
if os.environ.get("AUTOTUNE_RECIPE"):
    import autotune

    tuned = autotune.apply()

VOCAB, SEQ, HIDDEN = 128, 48, 128
torch.manual_seed(0)


class GRULM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.gru = nn.GRU(HIDDEN, HIDDEN, batch_first=True)
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(self.embed(tokens))
        return self.head(out)


# Next-token prediction on a sparse random Markov chain: learnable, and made here (nothing downloaded).
g = torch.Generator().manual_seed(1234)
successors = torch.randint(0, VOCAB, (VOCAB, 4), generator=g)
tokens = torch.empty(2048, SEQ + 1, dtype=torch.long)
tokens[:, 0] = torch.randint(0, VOCAB, (2048,), generator=g)
for t in range(SEQ):
    tokens[:, t + 1] = successors[tokens[:, t], torch.randint(0, 4, (2048,), generator=g)]
data = torch.utils.data.TensorDataset(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())

model = GRULM()
batch, lr, loader_kwargs = 32, 3e-3, {}
device = "cuda" if torch.cuda.is_available() else "cpu"
if tuned:
    model = tuned.prepare_model(model)
    lr *= tuned.lr_scale
    batch, loader_kwargs = tuned.batch_size, tuned.dataloader_kwargs
else:
    model = model.to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=lr)
if tuned:
    model, optimizer = tuned.prepare(model, optimizer)
loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True, drop_last=True, **loader_kwargs)


def _loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x).float().reshape(-1, VOCAB), y.reshape(-1))


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


seconds = float("inf") if os.environ.get("AUTOTUNE_TRIAL") else float(os.environ.get("TRAIN_S", "8"))
seen, start, steps = 0, None, 0
while start is None or time.perf_counter() - start < seconds:
    for x, y in loader:
        if tuned:
            x, y = tuned.to_device(x, y)
            with tuned.autocast():
                loss = _loss(x, y)
            tuned.step(loss, optimizer)
        else:
            x, y = x.to(device), y.to(device)
            loss = _loss(x, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        steps += 1
        if steps == 5:
            _sync()
            start, seen = time.perf_counter(), 0
        elif steps > 5:
            seen += len(x)
        if start is not None and time.perf_counter() - start >= seconds:
            break
_sync()
print(json.dumps({"samples_per_s": seen / (time.perf_counter() - start), "threads": torch.get_num_threads(),
                  "loss": float(loss.detach()), "tuned": tuned is not None}))
if tuned:
    tuned.finish()
