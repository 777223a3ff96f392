"""The machine's limits, measured: matmul peaks per precision and memory bandwidth on the CPUs this process may
use, beside the theoretical fp32 peak the ISA and clock allow. Measured once and cached beside the kernels'
speeds (``_measured``'s cache folder), refreshed by ``autotune probe --measure``; never part of the fingerprint.

A recipe's distance from the machine's limit is its FLOP/s over these: a tuner that says "1.15x the defaults"
without them leaves the user not knowing whether that is most of what the machine gives or a tenth of it.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ._child import CHILD_S, call_in_child
from ._measured import cache_dir, read_cached, write_cached

FORMAT = "autotune-limits-v1"
SIZES = (512, 1024, 2048)  # square matmuls, smallest first; a larger one only where it would take under STOP_S
STOP_S = 0.25  # no matmul predicted longer than this runs (bf16 emulated on AVX2 runs ~50x slower than fp32)
RUN_S = 0.3  # each size is repeated until this long
TRIAD_FLOATS = 1 << 25  # 128 MiB an array, three arrays: far larger than any CPU's caches
# FLOP a CPU can retire per cycle in float32 per ISA (2 FMA units, 2 FLOP an FMA, the SIMD lanes): an upper bound
LANES = (("avx512f", 16), ("avx2", 8), ("avx", 8), ("sse2", 4))
FMA_UNITS = 2
# A VM reports its nominal clock, and its cores may boost above it; boost clocks of current server CPUs are at most
# about twice their nominal ones: the bound where only the nominal clock is known.
BOOST = 2.0


@dataclass(frozen=True)
class Limits:
    """One machine's measured limits (its fingerprint, device, torch version) and the theoretical fp32 peak."""

    fingerprint: str
    device: str
    torch: str
    cpus: int  # the CPUs this process may use, on which the peaks ran (one torch thread each)
    matmul: tuple[tuple[str, float], ...]  # dtype -> GFLOP/s, the best square matmul of ``SIZES``
    bandwidth_gbs: float  # a triad (a = b + s * c) over arrays far larger than the caches: GB/s moved
    theoretical_gflops: float | None  # fp32: cpus x clock x FLOP per cycle (``LANES``, ``FMA_UNITS``); None unknown
    clock_mhz: float | None
    seconds: float = 0.0  # what measuring them took
    clock_max: bool = False  # the clock is cpufreq's maximum; else a nominal one, which cores may boost above

    @property
    def bound_gflops(self) -> float | None:
        """What no fp32 peak can exceed: the theoretical one, or ``BOOST`` times it at a nominal clock."""
        if self.theoretical_gflops is None:
            return None
        return self.theoretical_gflops * (1.0 if self.clock_max else BOOST)

    def peak(self, dtype: str = "float32") -> float | None:
        return next((g for d, g in self.matmul if d == dtype), None)

    def describe(self) -> str:
        """``matmul float32 100 GFLOP/s, bfloat16 402 GFLOP/s (fp32 theoretical 332: 2 CPUs x 2596 MHz x 64);
        memory 9.8 GB/s``"""
        peaks = ", ".join(f"{d} {g:.0f} GFLOP/s" for d, g in self.matmul)
        theory = ""
        if self.theoretical_gflops and self.clock_mhz:
            per_cycle = self.theoretical_gflops * 1e3 / (self.cpus * self.clock_mhz)
            clock = "MHz" if self.clock_max else "MHz reported, boost may be faster,"
            theory = (f" (fp32 theoretical {self.theoretical_gflops:.0f}: {self.cpus} CPUs x {self.clock_mhz:.0f} "
                      f"{clock} x {per_cycle:.0f} FLOP a cycle)")
        return f"matmul {peaks}{theory}; memory {self.bandwidth_gbs:.1f} GB/s"

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Limits:
        if data.get("format") != FORMAT:
            raise ValueError(f"not {FORMAT}: {data.get('format')!r}")
        return cls(str(data["fingerprint"]), str(data["device"]), str(data["torch"]), int(data["cpus"]),
                   tuple((str(d), float(g)) for d, g in data["matmul"]), float(data["bandwidth_gbs"]),
                   None if data.get("theoretical_gflops") is None else float(data["theoretical_gflops"]),
                   None if data.get("clock_mhz") is None else float(data["clock_mhz"]), float(data.get("seconds", 0)),
                   bool(data.get("clock_max", False)))


def clock_mhz(root: str = "/") -> tuple[float | None, bool]:
    """The highest clock the kernel reports, and whether it is a maximum: cpufreq's where it exists (bare metal),
    else /proc/cpuinfo's ``cpu MHz`` (a VM's nominal clock)."""
    base = Path(root)
    try:
        return int((base / "sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text()) / 1000, True
    except (OSError, ValueError):
        pass
    try:
        mhz = [float(line.split(":")[1]) for line in (base / "proc/cpuinfo").read_text().splitlines()
               if line.startswith("cpu MHz")]
    except (OSError, ValueError, IndexError):
        return None, False
    return (max(mhz) if mhz else None), False


def theoretical_gflops(cpus: int, mhz: float | None, isa: tuple[str, ...]) -> float | None:
    """``cpus`` x ``mhz`` x float32 FLOP a cycle for the widest SIMD in ``isa`` (2 FMA units): an upper bound.

    >>> theoretical_gflops(2, 2500.0, ("avx2", "avx512f"))
    320.0
    """
    lanes = next((n for flag, n in LANES if flag in isa), None)
    if not mhz or lanes is None:
        return None
    return cpus * mhz * 1e-3 * lanes * 2 * FMA_UNITS


def _matmul_gflops(dtype: str) -> float:
    """The best GFLOP/s of square matmuls of ``SIZES`` at ``dtype``, stopping before a size that would be slow."""
    import torch

    g = torch.Generator().manual_seed(0)
    best = 0.0
    for n in SIZES:
        a = torch.randn(n, n, generator=g).to(getattr(torch, dtype))
        b = torch.randn(n, n, generator=g).to(getattr(torch, dtype))
        start = time.perf_counter()
        torch.mm(a, b)  # builds the kernel: not timed
        took = time.perf_counter() - start
        runs, start = 0, time.perf_counter()
        while runs == 0 or (time.perf_counter() - start < RUN_S and took < STOP_S):
            torch.mm(a, b)
            runs += 1
        elapsed = (time.perf_counter() - start) / runs
        best = max(best, 2 * n ** 3 / elapsed / 1e9)
        if 8 * elapsed > STOP_S:  # the next size is 8x the work
            break
    return best


def _elapsed_s(run: Callable[[], object], device: str) -> float:
    """Seconds ``run()`` takes: by the clock on a CPU, by CUDA events on a GPU (its host runs ahead of it)."""
    if device != "cuda":
        start = time.perf_counter()
        run()
        return time.perf_counter() - start
    import torch

    start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start_event.record()
    run()
    end_event.record()
    end_event.synchronize()
    return start_event.elapsed_time(end_event) / 1e3


def _bandwidth_gbs(device: str = "cpu") -> float:
    """GB/s of the best of a few triads ``a = b + 2 c`` over ``TRIAD_FLOATS`` floats (three arrays moved)."""
    import torch

    b, c = torch.ones(TRIAD_FLOATS, device=device), torch.ones(TRIAD_FLOATS, device=device)
    a = torch.empty(TRIAD_FLOATS, device=device)
    best = min(_elapsed_s(lambda: torch.add(b, c, alpha=2.0, out=a), device) for _ in range(4))
    return 3 * 4 * TRIAD_FLOATS / best / 1e9


GPU_SIZES = (2048, 4096, 8192)  # a GPU's matmul peak needs larger matmuls than a CPU's
# A GPU's precisions: TF32 is float32 matmuls on tensor cores (compute capability 8.0+), bf16 8.0+, fp16 7.0+.
GPU_DTYPES = (("float32", 0.0), ("tfloat32", 8.0), ("bfloat16", 8.0), ("float16", 7.0))


def _gpu_matmul_gflops(dtype: str) -> float:
    """The best GFLOP/s of square matmuls of ``GPU_SIZES`` on the current CUDA device, timed by CUDA events; TF32
    is float32 with ``allow_tf32`` on for the measurement (the process's flag is put back)."""
    import torch

    matmul: Any = torch.backends.cuda.matmul
    before, best = matmul.allow_tf32, 0.0
    matmul.allow_tf32 = dtype == "tfloat32"
    try:
        for n in GPU_SIZES:
            kind = torch.float32 if dtype == "tfloat32" else getattr(torch, dtype)
            a, b = (torch.randn(n, n, device="cuda").to(kind) for _ in range(2))
            torch.mm(a, b)  # cuBLAS's handle and kernel choice: not timed
            runs, elapsed, multiply = 0, 0.0, (lambda a=a, b=b: torch.mm(a, b))
            while runs < 3 or elapsed < RUN_S:
                elapsed += _elapsed_s(multiply, "cuda")
                runs += 1
            best = max(best, 2 * n ** 3 / (elapsed / runs) / 1e9)
            del a, b, multiply
    finally:
        matmul.allow_tf32 = before
    return best


def measure_gpu_limits(capability: float) -> tuple[tuple[tuple[str, float], ...], float]:
    """The current CUDA device's matmul peaks at the precisions its ``capability`` computes, and its bandwidth."""
    peaks = tuple((dtype, _gpu_matmul_gflops(dtype)) for dtype, least in GPU_DTYPES if capability >= least)
    return peaks, _bandwidth_gbs("cuda")


def measure_limits(cpus: int, isa: tuple[str, ...], dtypes: tuple[str, ...] = ("float32", "bfloat16"),
                   root: str = "/") -> tuple[tuple[tuple[str, float], ...], float, float | None, float | None, bool]:
    """The matmul peaks of ``dtypes``, the bandwidth, the theoretical fp32 peak, the clock and whether it is a
    maximum, on ``cpus`` threads."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, cpus))
    try:
        peaks = tuple((dtype, _matmul_gflops(dtype)) for dtype in dtypes)
        bandwidth = _bandwidth_gbs()
    finally:
        torch.set_num_threads(before)
    mhz, at_most = clock_mhz(root)
    return peaks, bandwidth, theoretical_gflops(cpus, mhz, isa), mhz, at_most


def _gpu_limits_in_child(capability: float, timeout_s: float) -> tuple[tuple[tuple[str, float], ...], float]:
    peaks, bandwidth = call_in_child("autotune.probes._limits:measure_gpu_limits", capability, what="the GPU's limits",
                                     timeout_s=timeout_s)
    return tuple((str(d), float(g)) for d, g in peaks), float(bandwidth)


def limits(facts: Any, device: str = "cpu", directory: Path | None = None, *, refresh: bool = False,
           in_child: bool = False, timeout_s: float = CHILD_S) -> Limits:
    """This machine's limits (``facts``: its probe): from the cache when it holds them for this fingerprint, device
    and torch version and ``refresh`` is not asked, else measured now (2-3 s on a 2-vCPU VM) and cached (a cache
    that cannot be read or written is measured around, never an error). ``device="cuda"``: the first visible GPU's
    (the search's GPUs are one model: the fingerprint holds them), with no theoretical peak; ``in_child``: measured
    in a child process, so that this one holds no CUDA context, killed after ``timeout_s``."""
    import torch

    path = (directory or cache_dir()) / f"limits-{facts.fingerprint}-{device}.json"
    cached = None if refresh else read_cached(path, Limits.from_dict)
    if cached is not None and cached.torch == torch.__version__:
        return cached
    started = time.perf_counter()
    cpus = facts.cpu.allowed.threads or os.cpu_count() or 1
    if device == "cuda":
        capability = min((float(g.compute_capability) for g in facts.gpus), default=0.0)
        gpu_peaks, gpu_bandwidth = (_gpu_limits_in_child(capability, timeout_s) if in_child
                                    else measure_gpu_limits(capability))
        found = Limits(facts.fingerprint, device, torch.__version__, cpus, gpu_peaks, gpu_bandwidth, None, None,
                       time.perf_counter() - started)
    else:
        peaks, bandwidth, theory, mhz, at_most = measure_limits(cpus, tuple(facts.cpu.isa))
        found = Limits(facts.fingerprint, device, torch.__version__, cpus, peaks, bandwidth, theory, mhz,
                       time.perf_counter() - started, at_most)
    write_cached(path, found.to_dict())
    return found
