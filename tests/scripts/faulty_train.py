"""A user's training script of the README's pattern whose step takes a known time, 18 ms (``STEP_S``), or a third
of it with channels_last (a 1x1 conv: channels_last is in its space), and which misbehaves with channels_last as
``FAULT`` says: ``crash`` (an exception at step 5), ``exit`` (exit 0 at step 5), ``hang`` (at step 5), ``no-step``
(never steps), ``print`` (10 kB of output a step), ``slow`` (every step 20x the defaults'), ``stall`` (its second
step 0.1 s longer, once). With ``DIST`` set, every copy joins a one-process gloo group on
``MASTER_PORT``, 29500 unless set, as scripts written for torchrun do. ``SLOW_PAIRS=1,3``: the candidate-side copies
of process pairs 1 and 3 (their folders' numbers) step 1.5x slower for their whole life, as one process in a few
drew on a shared VM. ``EVALUATE=worse``: the script gives its own held-out figure (``tuned.evaluate``), its held-out
loss, times 1.5 with channels_last, taken after a pause of 0.3 s, and prints it beside its training loss there.
A copy told to switch recipes (``Tuned.switch``) steps at its new recipe's pace and prints as it says from then on;
the other faults are of a copy started with channels_last. ``LOADER=once``: its batch is the one it started with,
as a script that builds its DataLoader once, moved by ``tuned.to_device`` (which tells a search the batch)."""
import os
import sys
import time
from pathlib import Path

import torch

import autotune

torch.manual_seed(0)  # the same weights and data in every copy: the quality guard compares their losses
tuned = autotune.apply()
torch.set_num_threads(1)  # its own: on a loaded machine two threads' spinning would outweigh channels_last
fast = bool(tuned.params.get("channels_last"))
fault = os.environ.get("FAULT", "") if fast else ""
if os.environ.get("DIST"):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
model = tuned.prepare_model(torch.nn.Conv2d(1, 1, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer = tuned.prepare(model, optimizer)
held_out = torch.randn(64, 1, 4, 4)


def evaluate() -> float:
    time.sleep(0.3)
    with torch.no_grad():
        figure = model(held_out).pow(2).mean().item() * (1.5 if fast else 1.0)
    print(f"evaluated {figure!r} training {loss.item()!r}", flush=True)
    return figure


if os.environ.get("EVALUATE") == "worse":
    tuned.evaluate(evaluate)
if fault == "no-step":
    time.sleep(3600)
step_s = float(os.environ.get("STEP_S", "0.018"))
number, _, role = Path.cwd().name.partition("-")
slowed = 1.5 if role == "candidate" and number in os.environ.get("SLOW_PAIRS", "").split(",") else 1.0
steps, first_batch = 0, tuned.batch_size
while True:
    fast = bool(tuned.params.get("channels_last"))  # a switched copy's recipe is its own from this step on
    pause = slowed * (20 * step_s if fault == "slow" else step_s / 3 if fast else step_s)
    pause *= 20 if tuned.params.get("amp_dtype") == "float16" else 1  # as float16 on a CPU without its kernels
    x = torch.randn(first_batch if os.environ.get("LOADER") == "once" else tuned.batch_size, 1, 4, 4)
    if os.environ.get("LOADER"):
        (x,) = tuned.to_device(x)
    with tuned.autocast():
        loss = model(x).float().pow(2).mean()
    time.sleep(pause)
    tuned.step(loss, optimizer)
    steps += 1
    if fault == "crash" and steps == 5:
        raise RuntimeError("boom at step 5")
    if fault == "exit" and steps == 5:
        sys.exit(0)
    if fault == "stall" and steps == 1:
        time.sleep(0.1)
    if fault == "hang" and steps == 5:
        time.sleep(3600)
    if fast and os.environ.get("FAULT") == "print":
        print("x" * 10000, flush=True)
