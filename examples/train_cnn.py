"""A user's own training script: the bundled CNN's model, written out plainly, tuned by ``autotune.apply()``.

Plain:                       python examples/train_cnn.py
With a recipe:               autotune run --recipe best.env -- python examples/train_cnn.py
                             (or: python examples/train_cnn.py best.env)

It trains for ``TRAIN_S`` seconds (default 8) after 5 warm-up steps and prints one JSON line: samples/s,
the threads torch uses, the last loss and whether a recipe was applied. ``benchmarks/user_script.py``
runs it both ways, alternately, to check what the search claimed.
"""
import json
import os
import sys
import time

import torch
from torch import nn

tuned = None
if os.environ.get("AUTOTUNE_RECIPE") or len(sys.argv) > 1:
    import autotune

    tuned = autotune.apply(sys.argv[1] if len(sys.argv) > 1 else None)

torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
    nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
    nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10),
)
data = torch.utils.data.TensorDataset(torch.randn(4096, 3, 32, 32), torch.randint(0, 10, (4096,)))
batch, lr, loader_kwargs = 64, 0.05, {}
# A plain script uses the GPU when there is one, as a user's would; a recipe says its own device.
device = "cuda" if torch.cuda.is_available() else "cpu"
if tuned:
    model = tuned.prepare_model(model)  # channels_last, pruning, compile, device: as measured
    lr *= tuned.lr_scale
    batch, loader_kwargs = tuned.batch_size, tuned.dataloader_kwargs
else:
    model = model.to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
if tuned:
    model, optimizer = tuned.prepare(model, optimizer)
loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True, drop_last=True, **loader_kwargs)
held_out = torch.randn(512, 3, 32, 32), torch.randint(0, 10, (512,))


def validation_loss() -> float:
    """The held-out loss, the figure a search's quality guard compares (``tuned.evaluate``)."""
    model.eval()
    with torch.no_grad(), tuned.autocast():
        x, y = tuned.to_device(*held_out)
        loss = nn.functional.cross_entropy(model(x).float(), y)
    model.train()
    return float(loss)


if tuned:
    tuned.evaluate(validation_loss)  # called in a search's copies only


def _sync() -> None:
    """CUDA runs asynchronously: the clock is read only once the queued steps have run."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# A script-mode search (autotune search -- python examples/train_cnn.py) stops its copies itself.
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
            x, y = x.to(device), y.to(device)
            loss = nn.functional.cross_entropy(model(x), y)
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
    tuned.finish()  # leaves the process group of a several-process recipe (nothing with one process)
