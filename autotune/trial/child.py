"""The trial subprocess: ``python -m autotune.trial.child SPEC.json``.

Its environment and CPU affinity were set by the parent before Python started; everything else comes
from ``autotune.apply()``, exactly as in the user's training. It reads its ``TrialSpec``
(``autotune.trial.spec``), trains the workload for a fixed number of samples (warm-up, then timed
windows), evaluates the loss reached, and writes:
- ``events`` (JSON lines): one line per timed window, for the pruner;
- ``result`` (a ``TrialResult`` as JSON, written atomically): status ``ok`` | ``oom`` | ``nan`` | ``crash``,
  throughput, compile time, loss, and the settings found in effect in this process.
The parent reads these files and the exit status, never stderr text.

With ``processes`` P > 1 this module runs as P ranks under ``torch.distributed.run``; ``apply()`` pins
each rank and joins the process group, ``Tuned`` wraps the model in DDP and shards the data. The ranks
agree on every number that decides what happens next (the slowest rank's window time, the mean loss),
so they take the same steps. Samples are counted over all ranks: throughput is global samples/s. Only
rank 0 writes ``events`` and ``result`` (with the world size and each rank's CPUs and threads in
``in_effect``); a failing rank writes ``result.rank<R>.json`` and exits 1, so torch.distributed.run
stops the others, and the parent records the earliest failure.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .. import distributed
from ..apply import Tuned, apply
from ..search_spaces import batch, compilation
from ..workloads import Workload, held_out_split, load_workload
from . import launch
from .spec import Status, TrialResult, TrialSpec
from .training import (
    NonFiniteLoss,
    batches,
    evaluate,
    failure,
    in_effect,
    peak_memory,
    reset_peak_memory,
    schedule,
    spread,
)

_PROCESS_START = time.perf_counter()


def _write_result(path: str, result: TrialResult) -> None:
    """Written atomically: the parent polls for the file and must never read half of it."""
    tmp = Path(path + ".tmp")
    tmp.write_text(result.to_json())
    os.replace(tmp, path)


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


@dataclass
class _Run:
    """One trial's prepared training: the model and optimizer as ``apply()`` prepared them, the batches,
    and the samples trained so far over all ranks."""

    workload: Workload
    tuned: Tuned
    model: Any
    optimizer: Any
    batches: Iterator[Any]
    held_out: Any  # the held-out samples, or None when the workload evaluates itself
    sync: Callable[[], None]
    trained: int = 0

    def steps(self, count: int) -> float:
        """Train ``count`` optimizer steps; returns the last loss, averaged over the ranks."""
        if count == 0:
            return 0.0
        tuned, loss = self.tuned, None
        for _ in range(count):
            stepped = False
            while not stepped:
                batch = tuned.to_device(*next(self.batches))
                self.trained += len(batch[0]) * tuned.world_size
                with tuned.autocast():
                    loss = self.workload.loss(self.model(*self.workload.model_inputs(batch)), batch)
                stepped = tuned.step(loss, self.optimizer)
        assert loss is not None  # count > 0: at least one forward pass ran
        value = distributed.mean_over_ranks(float(loss.detach()))  # every rank raises, or none
        if not math.isfinite(value):
            raise NonFiniteLoss(f"the loss became {value}")
        return value

    def evaluate(self) -> tuple[float, int]:
        """The held-out loss now, and the samples trained when it was taken."""
        return evaluate(self.workload, self.tuned, self.model, self.held_out), self.trained


def _build(spec: TrialSpec) -> _Run:
    """The workload prepared by ``apply()`` with the trial's knobs, exactly as in the user's training."""
    import torch

    seed = spec.settings.seed
    torch.manual_seed(seed)
    tuned = apply(spec.params, facts=spec.facts, check_hardware=False)
    workload = load_workload(spec.workload)
    model = tuned.prepare_model(workload.model())
    optimizer = tuned.scale_lr(workload.optimizer(model.parameters()))
    model, optimizer = tuned.prepare(model, optimizer)
    dataset, held_out = workload.dataset(), None
    if workload.evaluate is None:
        dataset, held_out = held_out_split(dataset, spec.settings.eval_samples)
    generator = torch.Generator().manual_seed(seed)
    sampler = tuned.sampler(dataset, seed=seed)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=tuned.batch_size, shuffle=sampler is None, sampler=sampler, drop_last=True,
        generator=generator, **tuned.dataloader_kwargs,
    )
    sync = torch.cuda.synchronize if tuned.device == "cuda" else (lambda: None)
    return _Run(workload, tuned, model, optimizer, batches(loader), held_out, sync)


@dataclass
class _Windows:
    """The timed windows of a trial: each one's global samples/s, written to ``events`` for the pruner."""

    run: _Run
    steps: int  # optimizer steps per window
    events: IO[str]
    rates: list[float] = field(default_factory=list)

    def measure(self) -> None:
        run = self.run
        run.sync()
        start = time.perf_counter()
        run.steps(self.steps)
        run.sync()
        elapsed = distributed.max_over_ranks(time.perf_counter() - start)  # the slowest rank's time
        self.rates.append(self.steps * run.tuned.step_samples / elapsed)
        self.events.write(json.dumps({"window": len(self.rates) - 1, "samples_per_s": self.rates[-1]}) + "\n")
        self.events.flush()


def _train(spec: TrialSpec, events: IO[str]) -> TrialResult:
    """Warm up, time the windows (the loss is taken after the study's ``loss_samples``), and report."""
    run = _build(spec)
    settings, step_samples = spec.settings, run.tuned.step_samples  # over all ranks
    # Every trial of a study takes its loss after the same samples (``runner.loss_samples``: whole steps
    # of every batch size offered), so the guard compares like with like.
    loss_steps = -(-spec.loss_samples // step_samples)
    warmup, window_steps, loss_window = schedule(loss_steps, settings.warmup_steps, settings.windows)
    startup_s = time.perf_counter() - _PROCESS_START
    loss, loss_samples = math.nan, 0
    first_start = time.perf_counter()
    # The steps that may hold compile work (CUDA-graph capture: steps 2-3), timed one by one; the first always.
    charged = max(1, compilation.charged_steps(run.tuned.params.get("compile_mode"), run.tuned.device))
    first_steps = first_steps_s(run, min(charged, warmup))
    run.steps(max(0, warmup - len(first_steps)))
    run.sync()
    warmup_s = time.perf_counter() - first_start  # compile and warm-up: what the study's budget pays per trial
    reset_peak_memory(run.tuned.device)
    if loss_window == 0:
        loss, loss_samples = run.evaluate()
    windows = _Windows(run, window_steps, events)
    for index in range(settings.windows):
        windows.measure()
        if index + 1 == loss_window:
            loss, loss_samples = run.evaluate()
    # A noisy measurement (shared machine) is re-measured with extra windows, after the quality check.
    extra = 0
    while spread(windows.rates) > settings.max_spread and extra < settings.max_extra_windows:
        windows.measure()
        extra += 1
    return _result(spec, run, windows, first_steps, startup_s=startup_s, warmup_s=warmup_s, loss=loss,
                   loss_samples=loss_samples, steps=warmup + window_steps * len(windows.rates))


def first_steps_s(run: _Run, count: int) -> list[float]:
    """The first ``count`` optimizer steps, each timed on its own (synchronised with the device)."""
    out = []
    for _ in range(count):
        start = time.perf_counter()
        run.steps(1)
        run.sync()
        out.append(time.perf_counter() - start)
    return out


def _result(spec: TrialSpec, run: _Run, windows: _Windows, first_steps: list[float], **measured: Any) -> TrialResult:
    """The trial's result: throughput with compile time amortised, and what was in effect in every rank."""
    rates, step_samples = windows.rates, run.tuned.step_samples
    peak, device_memory = peak_memory(run.tuned.device)  # the timed windows' (and the loss's) peak
    too_full = batch.memory_warning(peak, device_memory)
    median = statistics.median(rates)
    # compile (and CUDA-graph capture) beyond a steady step; nothing for an eager run (compilation.compile_cost)
    compile_s = compilation.compile_cost(first_steps, step_samples / median, run.tuned.params.get("compile_mode"),
                                         run.tuned.device)
    # the same planned samples for every recipe: train_steps of the defaults' optimizer step, whatever this batch
    planned = spec.settings.train_steps * (spec.params.get("global_batch") or spec.reference_batch)
    effect = {**in_effect(), "world_size": run.tuned.world_size, "device_memory_bytes": device_memory,
              "first_steps_s": first_steps, **run.tuned.in_effect}  # + sparsity, ipex
    effect["ranks"] = distributed.gather({k: effect[k] for k in ("threads", "cpus")})
    distributed.finish()
    return TrialResult(
        Status.OK, samples_per_s=median, objective=planned / (compile_s + planned / median), windows=rates,
        spread=spread(rates), compile_s=compile_s, timed_s=sum(windows.steps * step_samples / rate for rate in rates),
        in_effect=effect, warnings=[*run.tuned.warnings, *filter(None, [too_full])], peak_memory_bytes=peak,
        **measured,
    )


def main(argv: list[str]) -> int:
    spec = TrialSpec.from_json(Path(argv[0]).read_text())
    rank = _rank()
    with open(spec.events if rank == 0 else os.devnull, "a") as events:
        try:
            result = _train(spec, events)
        except Exception as e:  # noqa: BLE001 - every failure becomes a recorded trial (MemoryError too)
            result = failure(e)
    if rank == 0:
        _write_result(spec.result, result)
    elif result.status != Status.OK:
        _write_result(str(Path(spec.result).with_suffix(f".rank{rank}.json")), result)
    # Several ranks: a failure exits 1 so that torch.distributed.run stops the ranks still waiting on it.
    return 1 if int(os.environ.get("WORLD_SIZE", "1")) > 1 and result.status != Status.OK else 0


if __name__ == "__main__":
    launch.exit_now(main(sys.argv[1:]))
