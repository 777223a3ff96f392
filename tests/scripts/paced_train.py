"""A user's training script of the README's pattern whose step takes a known time: 5 ms with two torch threads,
10 ms with one (what ``threads`` sets before Python starts), so one thread reads 0.5x the defaults' speed.
``PACED_SLOW=1,3``: the candidate-side copies of process pairs 1 and 3 (their folders' numbers) step 1.5x slower
for their whole life, as one process in a few drew on a shared VM."""
import os
import time
from pathlib import Path

import torch

import autotune

tuned = autotune.apply()
model = tuned.prepare_model(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer = tuned.prepare(model, optimizer)
pause = 0.010 if torch.get_num_threads() == 1 else 0.005
number, _, role = Path.cwd().name.partition("-")
if role == "candidate" and number in os.environ.get("PACED_SLOW", "").split(","):
    pause *= 1.5
while True:
    x = torch.randn(tuned.batch_size, 8)
    with tuned.autocast():
        loss = model(x).pow(2).mean()
    time.sleep(pause)
    tuned.step(loss, optimizer)
