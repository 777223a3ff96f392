"""A user's training script of the README's pattern whose step takes a known time: 5 ms with two torch threads,
20 ms with one (what ``threads`` sets before Python starts), so one thread reads 0.25x the defaults' speed."""
import time

import torch

import autotune

tuned = autotune.apply()
model = tuned.prepare_model(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer = tuned.prepare(model, optimizer)
pause = 0.020 if torch.get_num_threads() == 1 else 0.005
while True:
    x = torch.randn(tuned.batch_size, 8)
    with tuned.autocast():
        loss = model(x).pow(2).mean()
    time.sleep(pause)
    tuned.step(loss, optimizer)
