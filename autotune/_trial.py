"""The trial subprocess: ``python -m autotune._trial SPEC.json``.

Its environment and CPU affinity were set by the parent before Python started; everything else comes
from ``autotune.apply()``, exactly as in the user's training. It trains the workload for a fixed
number of samples (warm-up, then timed windows), evaluates the loss reached, and writes:
- ``events`` (JSON lines): one line per timed window, for the pruner;
- ``result`` (one JSON object, written atomically): status ``ok`` | ``oom`` | ``nan`` | ``crash``,
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
from pathlib import Path
from typing import Any

_PROCESS_START = time.perf_counter()


class NonFiniteLoss(ArithmeticError):
    """The loss became NaN or infinite."""


def _write_json(path: str, data: dict[str, Any]) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _in_effect() -> dict[str, Any]:
    """What this process actually runs with: the tests and the report check these. With ``Tuned.in_effect``
    (merged in by the caller): ``amp``, what the first training step's forward pass ran with."""
    import torch

    from .probes import memory_policy, pinned_threads, process_cpus
    from .search_spaces import preload

    maps = Path("/proc/self/maps").read_text() if Path("/proc/self/maps").exists() else ""
    return {
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "cpus": process_cpus(),  # all threads': KMP_AFFINITY narrows the main thread to one CPU
        "pinned_threads": pinned_threads(),
        # TF32 for float32 matmuls and cuDNN convolutions, as the CUDA kernels will read them
        "tf32": {"matmul": torch.backends.cuda.matmul.allow_tf32, "cudnn": torch.backends.cudnn.allow_tf32},
        "memory_policy": memory_policy(),
        **preload.in_effect(),  # which libraries serve GOMP_parallel and malloc; libiomp5's block time
        "libiomp5": "libiomp5" in maps,
        "jemalloc": "libjemalloc" in maps,
        "tcmalloc": "libtcmalloc" in maps,
        "env": {k: v for k, v in os.environ.items()
                if k.startswith(("OMP_", "KMP_", "MKL_")) or k in ("LD_PRELOAD", "MALLOC_CONF")},
    }


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _batches(loader: Any) -> Any:
    epoch = 0
    while True:
        if hasattr(loader.sampler, "set_epoch"):  # DistributedSampler: a new shuffle every pass
            loader.sampler.set_epoch(epoch)
        batches = iter(loader)  # held while a failure is examined: releasing it shuts its workers down
        try:
            yield from batches
        except Exception as error:
            if loader.num_workers > 0:
                _raise_if_a_worker_died(error)
            raise
        epoch += 1


def _raise_if_a_worker_died(error: Exception, wait_s: float = 0.5) -> None:
    """Name the DataLoader worker that died instead of what the loop saw of it: depending on when the
    worker died, a reset connection or a closed queue, before the kernel reports the worker dead."""
    from torch.utils.data._utils.signal_handling import _error_if_any_worker_fails

    deadline = time.monotonic() + wait_s
    while True:
        try:
            _error_if_any_worker_fails()  # RuntimeError naming the worker and its signal
        except RuntimeError as worker_error:
            raise worker_error from error
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)


def _evaluate(workload: Any, tuned: Any, model: Any, held_out: Any) -> float:
    """The loss on the held-out samples in float32 (or the workload's own metric)."""
    import torch

    plain = tuned.unwrap(model)
    plain.eval()
    try:
        with torch.no_grad():
            if workload.evaluate is not None:
                return float(workload.evaluate(plain))
            loader = torch.utils.data.DataLoader(held_out, batch_size=256, shuffle=False)
            total, count = 0.0, 0
            for batch in loader:
                batch = tuned.to_device(*batch)
                output = plain(*workload.model_inputs(batch))
                total += float(workload.loss(output.float(), batch)) * len(batch[0])
                count += len(batch[0])
            return total / max(1, count)
    finally:
        plain.train()


def schedule(loss_steps: int, warmup_steps: int, windows: int) -> tuple[int, int, int]:
    """``(warmup, window_steps, loss_window)``: the loss is taken after exactly ``loss_steps`` steps,
    that is after the warm-up and ``loss_window`` timed windows. When ``loss_steps`` leaves room for
    ``warmup_steps`` and one step per window, the windows' remainder joins the warm-up; otherwise (large
    batches) windows of one step go on past the loss, timed only.

    >>> schedule(28, 4, 3), schedule(13, 4, 3), schedule(7, 4, 3), schedule(2, 4, 3)
    ((4, 8, 3), (4, 3, 3), (4, 1, 3), (1, 1, 1))
    """
    warmup_steps = max(1, warmup_steps)  # the first step is never timed: it holds compilation
    if loss_steps >= warmup_steps + windows:
        window_steps = (loss_steps - warmup_steps) // windows
        return loss_steps - windows * window_steps, window_steps, windows
    warmup = max(1, min(warmup_steps, loss_steps - windows))
    return warmup, 1, loss_steps - warmup


def _train(spec: dict[str, Any], events: Any) -> dict[str, Any]:
    import torch

    from . import _distributed
    from .apply import apply
    from .probes import Facts
    from .workload import held_out_split, load_workload

    torch.manual_seed(spec["seed"])
    facts = Facts.from_dict(spec["facts"])
    tuned = apply(spec["params"], facts=facts, check_hardware=False)
    workload = load_workload(spec["workload"])
    model = tuned.prepare_model(workload.model())
    optimizer = tuned.scale_lr(workload.optimizer(model.parameters()))
    model, optimizer = tuned.prepare(model, optimizer)
    dataset, held_out = workload.dataset(), None
    if workload.evaluate is None:
        dataset, held_out = held_out_split(dataset, spec["eval_samples"])
    generator = torch.Generator().manual_seed(spec["seed"])
    sampler = tuned.sampler(dataset, seed=spec["seed"])
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=tuned.batch_size, shuffle=sampler is None, sampler=sampler, drop_last=True,
        generator=generator, **tuned.dataloader_kwargs,
    )
    batches = _batches(loader)
    sync = torch.cuda.synchronize if tuned.device == "cuda" else (lambda: None)
    step_samples = tuned.step_samples  # over all ranks
    trained = 0  # samples over all ranks

    def run_steps(count: int) -> float:
        nonlocal trained
        if count == 0:
            return 0.0
        loss = None
        for _ in range(count):
            stepped = False
            while not stepped:
                batch = tuned.to_device(*next(batches))
                trained += len(batch[0]) * tuned.world_size
                with tuned.autocast():
                    loss = workload.loss(model(*workload.model_inputs(batch)), batch)
                stepped = tuned.step(loss, optimizer)
        value = _distributed.mean_over_ranks(float(loss.detach()))  # every rank raises, or none
        if not math.isfinite(value):
            raise NonFiniteLoss(f"the loss became {value}")
        return value

    # Every trial of a study takes its loss after the same samples (``runner.loss_samples``: whole steps
    # of every batch size offered), so the guard compares like with like.
    loss_steps = -(-spec["loss_samples"] // step_samples)
    warmup, window_steps, loss_window = schedule(loss_steps, spec["warmup_steps"], spec["windows"])
    startup_s = time.perf_counter() - _PROCESS_START
    loss, loss_samples = math.nan, 0

    def evaluate() -> None:
        nonlocal loss, loss_samples
        loss, loss_samples = _evaluate(workload, tuned, model, held_out), trained

    first_start = time.perf_counter()
    run_steps(1)
    sync()
    first_step_s = time.perf_counter() - first_start
    run_steps(max(0, warmup - 1))
    sync()
    warmup_s = time.perf_counter() - first_start  # compile and warm-up: what the study's budget pays per trial
    rates: list[float] = []
    if loss_window == 0:
        evaluate()

    def window() -> None:
        sync()
        start = time.perf_counter()
        run_steps(window_steps)
        sync()
        elapsed = _distributed.max_over_ranks(time.perf_counter() - start)  # the slowest rank's time
        rates.append(window_steps * step_samples / elapsed)
        events.write(json.dumps({"window": len(rates) - 1, "samples_per_s": rates[-1]}) + "\n")
        events.flush()

    for index in range(spec["windows"]):
        window()
        if index + 1 == loss_window:
            evaluate()
    # A noisy measurement (shared machine) is re-measured with extra windows, after the quality check.
    extra = 0
    while _spread(rates) > spec["max_spread"] and extra < spec["max_extra_windows"]:
        window()
        extra += 1
    median = statistics.median(rates)
    step_s = step_samples / median
    compile_s = max(0.0, first_step_s - step_s)
    planned = spec["train_steps"] * step_samples
    in_effect = {**_in_effect(), "world_size": tuned.world_size, **tuned.in_effect}  # + sparsity, ipex
    in_effect["ranks"] = _distributed.gather({k: in_effect[k] for k in ("threads", "cpus")})
    _distributed.finish()
    return {
        "status": "ok",
        "samples_per_s": median,
        "objective": planned / (compile_s + planned / median),
        "windows": rates,
        "spread": _spread(rates),
        "compile_s": compile_s,
        "startup_s": startup_s,
        "warmup_s": warmup_s,
        "timed_s": sum(window_steps * step_samples / rate for rate in rates),
        "loss": loss,
        "loss_samples": loss_samples,
        "steps": warmup + window_steps * len(rates),
        "in_effect": in_effect,
        "warnings": tuned.warnings,
    }


def _spread(rates: list[float]) -> float:
    if len(rates) < 2:
        return 0.0
    return (max(rates) - min(rates)) / statistics.median(rates)


def _failure(status: str, error: BaseException) -> dict[str, Any]:
    message = " ".join(str(error).split())[:500]
    # failed_at: of several ranks' failures the earliest is the cause, the others its consequences
    return {"status": status, "error": f"{type(error).__name__}: {message}", "failed_at": time.time()}


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    rank = _rank()
    with open(spec["events"] if rank == 0 else os.devnull, "a") as events:
        try:
            result = _train(spec, events)
        except NonFiniteLoss as e:
            result = _failure("nan", e)
        except MemoryError as e:
            result = _failure("oom", e)
        except Exception as e:  # noqa: BLE001 - every failure becomes a recorded trial
            import torch

            result = _failure("oom" if isinstance(e, torch.OutOfMemoryError) else "crash", e)
    if rank == 0:
        _write_json(spec["result"], result)
    elif result["status"] != "ok":
        _write_json(str(Path(spec["result"]).with_suffix(f".rank{rank}.json")), result)
    # Several ranks: a failure exits 1 so that torch.distributed.run stops the ranks still waiting on it.
    return 1 if int(os.environ.get("WORLD_SIZE", "1")) > 1 and result["status"] != "ok" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
