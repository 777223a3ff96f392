"""A Lightning script, tuned and searched through autotune's callback (pip install 'autotune[lightning]').

Plain:                       python examples/train_lightning.py
With a recipe:               autotune run --recipe best.env -- python examples/train_lightning.py
Searched:                    autotune search --budget 5m -- python examples/train_lightning.py

The bundled CNN's model as a LightningModule on random images. It trains ``MAX_STEPS`` steps (default 2000) or
``TRAIN_S`` seconds after 5 warm-up steps (default 8), whichever ends first (in a search's copy: until the search
stops it), and prints one JSON line: samples/s after the first 5 steps, the threads torch uses, the last loss,
the batch, the Trainer's precision and whether a recipe was applied.
"""
import json
import os
import time

import lightning as L
import torch
from torch import nn

from autotune.integrations.lightning import AutotuneCallback, learning_rate, loader_arguments, trainer_arguments


class Net(L.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10),
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x).float(), y)
        self.last = float(loss.detach()) if batch_idx % 10 == 0 else getattr(self, "last", None)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class Timed(L.Callback):
    """Samples per second after the first 5 steps (the warm-up); training stops after ``seconds`` of them."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 5 and not hasattr(self, "start"):
            self.start, self.samples = time.perf_counter(), 0
        elif hasattr(self, "start"):
            self.samples += len(batch[0])
            trainer.should_stop = time.perf_counter() - self.start >= self.seconds

    def on_train_end(self, trainer, pl_module):
        self.rate = self.samples / (time.perf_counter() - self.start)


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(4096, 3, 32, 32), torch.randint(0, 10, (4096,)))
loader = torch.utils.data.DataLoader(data, shuffle=True, drop_last=True, **loader_arguments(batch_size=64))
model = Net(lr=learning_rate(0.05))
# A script-mode search (autotune search -- python examples/train_lightning.py) stops its copies itself.
timed = Timed(float("inf") if os.environ.get("AUTOTUNE_TRIAL") else float(os.environ.get("TRAIN_S", "8")))
trainer = L.Trainer(**trainer_arguments(max_steps=int(os.environ.get("MAX_STEPS", "2000")), accelerator="cpu",
                                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                        enable_model_summary=False),
                    callbacks=[AutotuneCallback(), timed])
trainer.fit(model, loader)
print(json.dumps({"samples_per_s": timed.rate, "threads": torch.get_num_threads(), "loss": model.last,
                  "batch": loader.batch_size, "precision": trainer.precision,
                  "tuned": bool(os.environ.get("AUTOTUNE_RECIPE"))}))
