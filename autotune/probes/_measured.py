"""Measured facts: what this machine's kernels really do, timed once and cached beside the facts.

The facts (``probe()``) are read; these are timed: a small convolution and a matrix multiply, forward and
backward, under autocast at each precision, against float32. A flag says what the hardware has, not what
PyTorch's kernels make of it here, so the search orders and drops its precision seeds by these times, never by a
device name or an ISA flag. Each kernel of each precision runs under a deadline: one that is still running past it
reads "at least N times slower" rather than being run to its end: an eighth of its input runs first, twice (the
first run pays the precision's one-off costs), and where the whole would outlast the deadline, the eighth's second
time is the reading (``_precision``).

Cached per fingerprint, device and torch version (``cache_dir()``); never part of the fingerprint: a re-measure
may read a little differently, and the machine is the same machine. The machine-limit issue adds its peaks here.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from ._child import CHILD_S, call_in_child

T = TypeVar("T")
# v1 read a GPU's first-use costs as slowness, v2 float32's as its speed, v3 each precision's runs apart from float32's
FORMAT = "autotune-measured-v4"
DEADLINE_S = 0.2  # each kernel at each precision: repeats after its first run stop here (a slow one: its first)
MEASURED = ("bfloat16", "float16")  # against float32, whichever the space offers: the note says what each does
REPEATS = 20
KERNELS = ("conv", "matmul")
HOPELESS = 4.0  # a precision whose fastest kernel is this many times slower than float32's is not seeded


@dataclass(frozen=True)
class KernelSpeed:
    """One precision's kernels against float32's: ``speed`` is float32's time over its own (2.0: twice as fast),
    the geometric mean of its kernels' (``kernels``); ``bound`` when a kernel was stopped at its deadline (its
    reading is then at most what it says)."""

    dtype: str
    speed: float
    bound: bool = False
    kernels: tuple[tuple[str, float], ...] = ()  # each kernel's speed

    @property
    def fastest(self) -> float:
        return max((s for _, s in self.kernels), default=self.speed)

    def hopeless(self) -> bool:
        """Even its fastest kernel is ``HOPELESS`` times slower than float32's: no model made of them gains."""
        return self.fastest * HOPELESS < 1.0

    def describe(self) -> str:
        """``float16: 23x slower than float32 in this machine's kernels (conv 39x slower, matmul 13x slower)``"""
        each = ", ".join(f"{name} {_times(s).removesuffix(' than')}" for name, s in self.kernels)
        at_least = "at least " if self.bound and self.speed < 1 else ""
        return f"{self.dtype}: {at_least}{_times(self.speed)} float32 in this machine's kernels ({each})"


def _times(speed: float) -> str:
    """2.0 -> ``2.00x faster than``; 0.025 -> ``40x slower than``"""
    if speed >= 1.0:
        return f"{speed:.2f}x faster than"
    slower = 1 / speed
    return f"{slower:.0f}x slower than" if slower >= 10 else f"{slower:.2f}x slower than"


@dataclass(frozen=True)
class Measured:
    """The measured facts of one machine (fingerprint), device and torch version."""

    fingerprint: str
    device: str
    torch: str
    precision: tuple[KernelSpeed, ...]
    seconds: float = 0.0  # what measuring them took

    def speed(self, dtype: str) -> KernelSpeed | None:
        return next((k for k in self.precision if k.dtype == dtype), None)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measured:
        if data.get("format") != FORMAT:
            raise ValueError(f"not {FORMAT}: {data.get('format')!r}")
        precision = tuple(KernelSpeed(k["dtype"], float(k["speed"]), bool(k.get("bound")),
                                      tuple((str(n), float(v)) for n, v in k.get("kernels", ())))
                          for k in data["precision"])
        return cls(str(data["fingerprint"]), str(data["device"]), str(data["torch"]), precision,
                   float(data.get("seconds", 0.0)))


def cache_dir() -> Path:
    """``$AUTOTUNE_CACHE``, else ``$XDG_CACHE_HOME/autotune``, else ``~/.cache/autotune``."""
    if os.environ.get("AUTOTUNE_CACHE"):
        return Path(os.environ["AUTOTUNE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "autotune"


def _kernels(device: str) -> dict[str, Any]:
    """A conv and a matmul, shaped as a training step's: a few milliseconds each in float32 on a CPU core, about
    at most about a millisecond on a datacenter GPU."""
    import torch

    g = torch.Generator().manual_seed(0)
    # Large enough to be compute-bound, where autocast's casts would otherwise be the reading; a GPU runs these in
    # microseconds (its launches the reading), so it gets larger ones.
    channels, side, batch, width = (128, 32, 32, 2048) if device == "cuda" else (64, 16, 8, 256)
    conv = torch.nn.Conv2d(channels, channels, 3, padding=1).to(device)
    image = torch.randn(batch, channels, side, side, generator=g).to(device)
    linear = torch.nn.Linear(width, width).to(device)
    rows = torch.randn(width, width, generator=g).to(device)
    return {"conv": (conv, image), "matmul": (linear, rows)}


def _run(module: Any, x: Any, dtype: str, device: str) -> float:
    """One forward and backward under autocast at ``dtype``: its seconds."""
    import torch

    context = torch.autocast(device_type=device, dtype=getattr(torch, dtype), enabled=dtype != "float32")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    with context:
        out = module(x)
    out.float().sum().backward()
    sync()
    return time.perf_counter() - start


def _time(kernel: tuple[Any, Any], dtype: str, device: str, deadline_s: float) -> float:
    """Median seconds of the kernel's runs in ``deadline_s`` (at most ``REPEATS``, one at least) after a first run
    left out: it builds kernels and allocates. The deadline counts from after it, so that a slow first use is
    neither the reference nor uses up the deadline, leaving one later run (which a neighbour may slow) as the
    reference."""
    module, x = kernel
    _run(module, x, dtype, device)
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < REPEATS:
        times.append(_run(module, x, dtype, device))
        if time.perf_counter() - started > deadline_s:
            break
    return statistics.median(times)


def _paired(kernel: tuple[Any, Any], dtype: str, device: str, deadline_s: float) -> float:
    """float32's seconds over ``dtype``'s: the median over pairs of runs, one of each in turns (at most
    ``REPEATS`` pairs in ``deadline_s``, one at least, counted from after a first run of each, left out as in
    ``_time``). A neighbour's burst slows both runs of a pair, where timed one precision after the other it would
    slow one precision's."""
    module, x = kernel
    _run(module, x, "float32", device)
    _run(module, x, dtype, device)
    ratios: list[float] = []
    started = time.perf_counter()
    while len(ratios) < REPEATS:
        order = ("float32", dtype) if len(ratios) % 2 == 0 else (dtype, "float32")
        seconds = {side: _run(module, x, side, device) for side in order}
        ratios.append(seconds["float32"] / seconds[dtype])
        if time.perf_counter() - started > deadline_s:
            break
    return statistics.median(ratios)


def _slice(kernel: tuple[Any, Any]) -> tuple[tuple[Any, Any], float]:
    """The kernel on an eighth of its input (its first rows), and how much smaller that is."""
    module, x = kernel
    rows = max(1, len(x) // 8)
    return (module, x[:rows]), len(x) / rows


def _precision(kernel: tuple[Any, Any], dtype: str, device: str, deadline_s: float) -> tuple[float, bool]:
    """The kernel's speed at ``dtype`` against float32 (``_paired``), and whether it is a bound. An eighth
    of the input first, twice: the first run pays the precision's one-off costs (building kernels; on a GPU
    loading them on first use), the second is timed, and where it is slow a third too, the faster of them the
    reading (a loaded machine's hiccup is not a precision's speed).
    Where the whole would outlast the deadline, that is the reading, "at least so slow" (a slow precision's cost
    grows with the work, the fixed costs do not), and the whole never runs."""
    small, scale = _slice(kernel)
    _run(*small, dtype, device)
    seconds = _run(*small, dtype, device)
    if seconds * scale > deadline_s:  # slow, or a neighbour's hiccup: a slow precision is slow again
        seconds = min(seconds, _run(*small, dtype, device))
    if seconds * scale > deadline_s:
        small_reference = _time(small, "float32", device, deadline_s / 4)
        return small_reference / seconds, True
    return _paired(kernel, dtype, device, deadline_s), False


def measure_precision(dtypes: tuple[str, ...], device: str = "cpu",
                      deadline_s: float = DEADLINE_S) -> tuple[KernelSpeed, ...]:
    """Each of ``dtypes`` (float32 always measured, as the reference) against float32."""
    kernels = _kernels(device)
    out = []
    for dtype in dtypes:
        if dtype == "float32":
            continue
        speeds, bound = [], False
        for name, kernel in kernels.items():
            speed, cut = _precision(kernel, dtype, device, deadline_s)
            speeds.append((name, speed))
            bound = bound or cut
        mean = math.exp(statistics.fmean(math.log(s) for _, s in speeds))
        out.append(KernelSpeed(dtype, mean, bound, tuple(speeds)))
    return tuple(out)


def measured(fingerprint: str, device: str = "cpu", directory: Path | None = None,
             dtypes: tuple[str, ...] = MEASURED, *, in_child: bool = False, timeout_s: float = CHILD_S) -> Measured:
    """This machine's measured facts: from the cache when it holds them for this fingerprint, device and torch
    version, else measured now (~0.4 s on a 2-vCPU VM) and cached (a cache that cannot be read or written is
    measured around, never an error). ``in_child``: measured in a child process, so that this one holds no CUDA
    context, killed after ``timeout_s``."""
    import torch

    path = (directory or cache_dir()) / f"measured-{fingerprint}-{device}.json"
    cached = read_cached(path, Measured.from_dict)
    if cached is not None and cached.torch == torch.__version__ \
            and all(cached.speed(d) for d in dtypes if d != "float32"):
        return cached
    started = time.perf_counter()
    if in_child:
        found = Measured.from_dict(call_in_child("autotune.probes._measured:measured_dict", fingerprint, device,
                                                 list(dtypes), what="the kernels' speeds", timeout_s=timeout_s))
    else:
        found = Measured(fingerprint, device, torch.__version__, measure_precision(dtypes, device), 0.0)
    found = replace(found, seconds=time.perf_counter() - started)
    write_cached(path, found.to_dict())
    return found


def measured_dict(fingerprint: str, device: str, dtypes: list[str]) -> dict[str, Any]:
    """What a child measures for ``measured(..., in_child=True)``, as JSON."""
    import torch

    return Measured(fingerprint, device, torch.__version__, measure_precision(tuple(dtypes), device)).to_dict()


def read_cached(path: Path, parse: Callable[[dict[str, Any]], T]) -> T | None:
    """A cached measurement as ``parse`` reads it; None where the file is missing, unreadable or not one."""
    try:
        return parse(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_cached(path: Path, data: dict[str, Any]) -> None:
    """Write a measurement to the cache whole: readers see the old file or the new one; a folder that cannot be
    written is measured around, never an error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # a name no one can guess or plant a link at beforehand (a pid-named one could be), in the cache's own folder
        descriptor, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(descriptor, "w") as f:
            f.write(json.dumps(data, indent=1))
        os.replace(partial, path)
    except OSError:
        Path(partial).unlink(missing_ok=True)
