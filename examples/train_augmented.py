"""A user's input-bound training script: per-sample augmentation in its dataset's ``__getitem__`` (jitter, flip
and blur in Python, a common habit), a small MLP on top, so the DataLoader, not the model, bounds a step. It follows
the README's ``apply()`` pattern; its DataLoader takes ``tuned.dataloader_kwargs``, where workers pay.

Plain:        python examples/train_augmented.py
Search it:    autotune search --budget 3m --batch-size 64 -- python examples/train_augmented.py
Tuned:        autotune run --recipe best.env -- python examples/train_augmented.py
"""
import json
import os
import time

import torch
from torch import nn


class Augmented(torch.utils.data.Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(4096, 3, 32, 32, generator=g)
        self.y = torch.randint(0, 10, (4096,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        x = self.x[i]
        for _ in range(6):  # jitter, flip and blur, per sample
            x = torch.roll(x, shifts=(int(i) % 3 - 1, 1), dims=(1, 2)).flip(2)
            x = nn.functional.avg_pool2d(x.unsqueeze(0), 3, 1, 1).squeeze(0)
        return x.flatten()[:256], self.y[i]


tuned = None
if os.environ.get("AUTOTUNE_RECIPE"):
    import autotune

    tuned = autotune.apply()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
batch, loader_kwargs = 64, {}
if tuned:
    model = tuned.prepare_model(model)
    batch, loader_kwargs = tuned.batch_size, tuned.dataloader_kwargs
optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * (tuned.lr_scale if tuned else 1.0))
if tuned:
    model, optimizer = tuned.prepare(model, optimizer)
loader = torch.utils.data.DataLoader(Augmented(), batch_size=batch, shuffle=True, drop_last=True,
                                     generator=torch.Generator().manual_seed(0), **loader_kwargs)
# A script-mode search stops its copies itself; alone it trains TRAIN_S seconds after 5 warm-up steps.
seconds = float("inf") if os.environ.get("AUTOTUNE_TRIAL") else float(os.environ.get("TRAIN_S", "8"))
seen, start, steps = 0, None, 0
while start is None or time.perf_counter() - start < seconds:
    for x, y in loader:
        if tuned:
            x, y = tuned.to_device(x, y)
            with tuned.autocast():
                loss = nn.functional.cross_entropy(model(x).float(), y)
            tuned.step(loss, optimizer)
        else:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        steps += 1
        if steps == 5:
            start, seen = time.perf_counter(), 0
        elif steps > 5:
            seen += len(x)
        if start is not None and time.perf_counter() - start >= seconds:
            break
print(json.dumps({"samples_per_s": seen / (time.perf_counter() - start), "threads": torch.get_num_threads(),
                  "loss": float(loss.detach()), "tuned": tuned is not None}))
if tuned:
    tuned.finish()
