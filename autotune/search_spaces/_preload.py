"""Preloaded runtime libraries: the OpenMP runtime (``openmp``, ``kmp_blocktime``) and the allocator (``allocator``).

All of it is set before Python starts, through the environment; only ``glibc-kept``'s thresholds can also be set
in-process (``apply_process``), for what the process allocates after.

- ``openmp``: ``gnu`` (the libgomp torch links, PyTorch's default) or ``intel``: libiomp5 (pip package
  ``intel-openmp``) in ``LD_PRELOAD``. A preloaded library comes first in the dynamic linker's symbol
  lookup, so libiomp5's ``GOMP_*``/``omp_*`` entry points serve torch's (and MKL's GNU-threaded)
  parallel regions, ahead of the libgomp that torch still loads.
- ``kmp_blocktime`` (``intel`` only): ``KMP_BLOCKTIME``, the milliseconds an OpenMP worker spins after a
  parallel region before sleeping (libiomp5's default is 200). With ``affinity`` pinning the process,
  ``KMP_AFFINITY=granularity=fine,compact,1,0`` also binds each OpenMP thread to one CPU of the pinned
  set, distinct cores first (``torch.backends.xeon.run_cpu``'s value; the set itself already encodes
  compact or spread).
- ``allocator``: ``default`` (glibc malloc as it comes), ``glibc-kept`` (glibc malloc with its mmap and trim
  thresholds fixed: ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, and ``mallopt`` in ``apply_process``
  for a process started without them), ``jemalloc`` or ``tcmalloc`` in ``LD_PRELOAD``. glibc as it comes gives
  large freed blocks back to the kernel and faults them in again the next step; with the thresholds fixed it keeps
  them, as the search's workers always have (``measure.worker``), so an arm measured there is what a recipe with
  ``glibc-kept`` gets; ``default`` gets glibc as it comes (``docs/measurement.md``). jemalloc gets
  ``run_cpu``'s ``MALLOC_CONF`` (``oversize_threshold:1,background_thread:true,metadata_thp:auto``) with purging
  off (``dirty_decay_ms:-1,muzzy_decay_ms:-1``, jemalloc(3)): a training step frees and takes back the same large
  buffers, and pages given back to the kernel between steps fault in again (``docs/measurement.md``). The price:
  a process (and each DataLoader worker, which inherits the variable) keeps the memory of its peak.

Each choice is offered only where the probe found its library (``Runtime.iomp5_path``, ...; for ``glibc-kept``,
glibc as the C library: ``Runtime.glibc``) and, for
``openmp``, where torch's parallel backend is OpenMP. ``check_environment`` looks at which library
actually serves ``GOMP_parallel`` and ``malloc`` in this process (``dladdr``), not at the variables.
"""
from __future__ import annotations

import ctypes
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._context import SpaceContext
from ._family import Params, SuggestingTrial
from ._rules import Rule, one_of

if TYPE_CHECKING:
    from ..probes import Facts

log = logging.getLogger(__name__)

KEYS = ("openmp", "kmp_blocktime", "allocator")
OPENMP = ("gnu", "intel")
BLOCKTIMES = (0, 1, 200)
ALLOCATORS = ("default", "glibc-kept", "jemalloc", "tcmalloc")
SCHEMA: dict[str, Rule] = {"openmp": one_of(OPENMP), "kmp_blocktime": one_of((None, *BLOCKTIMES)),
                           "allocator": one_of(ALLOCATORS)}
ENVIRONMENT_KEYS = KEYS  # preloaded before Python starts: one value per process
# glibc's largest mmap threshold (half its heap size: fixing it stops the dynamic growth) and a trim threshold above
# a training step's turnover; glibc reads both variables at its first malloc (mallopt(3))
KEPT_MMAP_THRESHOLD, KEPT_TRIM_THRESHOLD = 32 << 20, 256 << 20
HEAP_THRESHOLDS = {"MALLOC_MMAP_THRESHOLD_": str(KEPT_MMAP_THRESHOLD),
                   "MALLOC_TRIM_THRESHOLD_": str(KEPT_TRIM_THRESHOLD)}
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # malloc.h
# every variable environment() may set
ENV_VARS: tuple[str, ...] = ("LD_PRELOAD", "KMP_BLOCKTIME", "KMP_AFFINITY", "MALLOC_CONF", *HEAP_THRESHOLDS)
OVERRIDES: tuple[str, ...] = ()

KMP_AFFINITY = "granularity=fine,compact,1,0"
JEMALLOC_CONF = "oversize_threshold:1,background_thread:true,metadata_thp:auto,dirty_decay_ms:-1,muzzy_decay_ms:-1"
# What env files exported before purging was turned off hold: still read (``autotune run`` sets today's value)
JEMALLOC_CONF_BEFORE = "oversize_threshold:1,background_thread:true,metadata_thp:auto"
# File-name prefixes of each choice's library, as mapped in /proc/self/maps.
_LIBRARY = {
    "intel": "libiomp5", "gnu": "libgomp", "jemalloc": "libjemalloc", "tcmalloc": "libtcmalloc", "default": "libc.",
    "glibc-kept": "libc.",
}
_INSTALL = {"intel": "pip install intel-openmp", "jemalloc": "apt-get install libjemalloc2",
            "tcmalloc": "apt-get install libtcmalloc-minimal4"}


def _path(facts: Facts, choice: str) -> str | None:
    runtime = getattr(facts, "runtime", None)
    if runtime is None:
        return None
    paths = {"intel": runtime.iomp5_path, "jemalloc": runtime.jemalloc_path, "tcmalloc": runtime.tcmalloc_path}
    return paths.get(choice)


def openmp_choices(facts: Facts) -> tuple[str, ...]:
    """``gnu``, plus ``intel`` where libiomp5 was found and torch's parallel backend is OpenMP."""
    runtime = getattr(facts, "runtime", None)
    if runtime is None or runtime.openmp is None or not runtime.iomp5_path:
        return ("gnu",)
    return OPENMP


def allocator_choices(facts: Facts) -> tuple[str, ...]:
    """``default``, ``glibc-kept`` where the C library is glibc, each preloadable library the probe found."""
    glibc = bool(getattr(getattr(facts, "runtime", None), "glibc", False))
    return tuple(a for a in ALLOCATORS if a == "default" or (a == "glibc-kept" and glibc) or _path(facts, a))


def space(trial: SuggestingTrial, facts: Facts, ctx: SpaceContext) -> Params:
    if ctx.device == "cuda":  # CPU-side runtimes: the budget goes to the knobs that move GPU time
        return defaults(facts, ctx)
    runtimes, allocators = openmp_choices(facts), allocator_choices(facts)
    openmp = trial.suggest_categorical("openmp", runtimes) if len(runtimes) > 1 else "gnu"
    blocktime = trial.suggest_categorical("kmp_blocktime", BLOCKTIMES) if openmp == "intel" else None
    allocator = trial.suggest_categorical("allocator", allocators) if len(allocators) > 1 else "default"
    return {"openmp": openmp, "kmp_blocktime": blocktime, "allocator": allocator}


def defaults(facts: Facts, ctx: SpaceContext) -> Params:
    """PyTorch's defaults: GNU OpenMP, glibc malloc."""
    return {"openmp": "gnu", "kmp_blocktime": None, "allocator": "default"}


def heuristic(facts: Facts, ctx: SpaceContext) -> Params:
    """``run_cpu``'s defaults on CPU: Intel OpenMP with ``KMP_BLOCKTIME=1``, then TCMalloc, else JeMalloc (this
    knob's: purging off). On CUDA these stay at their defaults."""
    if ctx.device == "cuda":
        return defaults(facts, ctx)
    intel = "intel" in openmp_choices(facts)
    allocators = allocator_choices(facts)
    allocator = next((a for a in ("tcmalloc", "jemalloc") if a in allocators), "default")
    return {"openmp": "intel" if intel else "gnu", "kmp_blocktime": 1 if intel else None, "allocator": allocator}


def promising(facts: Facts, ctx: SpaceContext) -> list[Params]:
    """The heuristic's allocator alone, where it has one: ``run_cpu`` changes several knobs at once, and where another
    of them costs (its OpenMP runtime or inter-op threads) the allocator's own gain goes with it."""
    allocator = heuristic(facts, ctx)["allocator"]
    return [{"allocator": allocator}] if allocator != defaults(facts, ctx)["allocator"] else []


def libraries(params: dict[str, Any], facts: Facts) -> list[str]:
    """The paths to preload for ``params`` on this machine (a choice whose library is missing is left out)."""
    chosen = [params.get("openmp"), params.get("allocator")]
    return [path for path in (_path(facts, c) for c in chosen if c) if path]


def environment(params: Params, facts: Facts) -> dict[str, str]:
    env: dict[str, str] = {}
    preload = libraries(params, facts)
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    if params.get("openmp") == "intel" and _path(facts, "intel"):
        if params.get("kmp_blocktime") is not None:
            env["KMP_BLOCKTIME"] = str(int(params["kmp_blocktime"]))
        if params.get("affinity", "none") != "none":
            env["KMP_AFFINITY"] = KMP_AFFINITY
    if params.get("allocator") == "jemalloc" and _path(facts, "jemalloc"):
        env["MALLOC_CONF"] = JEMALLOC_CONF
    if params.get("allocator") == "glibc-kept":
        env.update(HEAP_THRESHOLDS)
    return env


def env_forms(params: Params) -> dict[str, str]:
    """``LD_PRELOAD``: absolute paths (no ``.`` or ``..`` step) of the chosen libraries only, colon-separated."""
    chosen = [c for c in (params.get("openmp"), params.get("allocator")) if c in ("intel", "jemalloc", "tcmalloc")]
    forms: dict[str, str] = {}
    if chosen:
        library = r"(?:/(?!\.\.?/)[A-Za-z0-9_.+-]+)*/(?:" + "|".join(_LIBRARY[c] for c in chosen) + r")[A-Za-z0-9_.+-]*"
        forms["LD_PRELOAD"] = f"{library}(?::{library})*"
    if params.get("openmp") == "intel":
        if params.get("kmp_blocktime") in BLOCKTIMES:
            forms["KMP_BLOCKTIME"] = str(params["kmp_blocktime"])
        if params.get("affinity", "none") != "none":
            forms["KMP_AFFINITY"] = re.escape(KMP_AFFINITY)
    if params.get("allocator") == "jemalloc":
        forms["MALLOC_CONF"] = f"(?:{re.escape(JEMALLOC_CONF)}|{re.escape(JEMALLOC_CONF_BEFORE)})"
    if params.get("allocator") == "glibc-kept":
        forms.update({var: re.escape(value) for var, value in HEAP_THRESHOLDS.items()})
    return forms


def keep_heap() -> bool:
    """Fix glibc's mmap and trim thresholds in this process (``mallopt``), as ``HEAP_THRESHOLDS`` does at a
    process's start: freed memory is kept for the next step instead of faulting in again. False where the C
    library is not glibc or glibc refused a value; where a preloaded allocator serves malloc, glibc's malloc
    takes the thresholds and nobody calls it (harmless)."""
    import platform

    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, KEPT_MMAP_THRESHOLD)
                and libc.mallopt(_M_TRIM_THRESHOLD, KEPT_TRIM_THRESHOLD))


def _thresholds_set(env: Mapping[str, str]) -> bool:
    """Whether ``env`` sets glibc's mmap or trim threshold (its ``MALLOC_*_THRESHOLD_`` variables or tunables)."""
    tunables = env.get("GLIBC_TUNABLES", "")
    return any(k in env for k in HEAP_THRESHOLDS) or any(
        f"glibc.malloc.{name}=" in tunables for name in ("mmap_threshold", "trim_threshold"))


def without_heap_tuning(env: dict[str, str]) -> dict[str, str]:
    """``env`` without what tunes glibc's malloc (its ``MALLOC_*`` variables, ``GLIBC_TUNABLES``' ``glibc.malloc.*``;
    jemalloc's ``MALLOC_CONF`` is the knob's own), the other tunables kept: a trial's defaults run glibc's heap as a
    plain process has it."""
    out = {k: v for k, v in env.items() if not k.startswith("MALLOC_") or k == "MALLOC_CONF"}
    if "GLIBC_TUNABLES" in out:
        kept = [t for t in out.pop("GLIBC_TUNABLES").split(":") if t and not t.startswith("glibc.malloc.")]
        if kept:
            out["GLIBC_TUNABLES"] = ":".join(kept)
    return out


def apply_process(params: Params, facts: Facts | None) -> list[str]:
    """``glibc-kept`` in a process started without its variables (``autotune.apply()`` in a plain run): the same
    thresholds by ``mallopt``, for what it allocates from now on; a process started with the thresholds set by its
    environment (the recipe's variables, or the user's own, which ``autotune run`` keeps) is left as it started. The
    libraries are preloaded before Python starts or not at all."""
    if params.get("allocator") != "glibc-kept" or _thresholds_set(os.environ) or keep_heap():
        return []
    return ["allocator=glibc-kept not applied: the C library is not glibc, or its mallopt refused the thresholds"]


# Hooks this family leaves to the defaults (search_spaces._family): interactions, prepare_model, prepare.


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def serving_library(symbol: str) -> str | None:
    """The file of the library whose ``symbol`` this process's global lookup finds, or None.

    That is the definition the dynamic linker bound torch's calls to: ``LD_PRELOAD`` libraries come
    first in the global scope (ld.so(8)). Linux/glibc only; None elsewhere or when nothing defines it.
    """
    try:
        scope = ctypes.CDLL(None)
        dladdr = getattr(scope, "dladdr", None) or ctypes.CDLL("libdl.so.2").dladdr  # glibc < 2.34: in libdl
        address = ctypes.cast(getattr(scope, symbol), ctypes.c_void_p)
    except (OSError, AttributeError):
        return None
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    info = _DlInfo()
    if not dladdr(address, ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.fsdecode(info.dli_fname)


def _mapped(prefix: str) -> bool:
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return False
    return any(Path(line.split()[-1]).name.startswith(prefix) for line in maps.splitlines() if "/" in line)


def served_as(choice: str) -> str:
    """The choice whose library serves ``choice``'s symbol, as ``check_environment`` reads it: glibc's malloc serves
    ``glibc-kept`` as it serves ``default`` (its thresholds are the process's, not the library's)."""
    return "default" if choice == "glibc-kept" else choice


def _kind(path: str | None, choices: tuple[str, ...]) -> str | None:
    name = Path(path).name if path else ""
    return next((c for c in choices if name.startswith(_LIBRARY[c])), None)


def in_effect() -> dict[str, Any]:
    """Which OpenMP runtime and allocator serve this process, and libiomp5's block time if it serves."""
    omp = serving_library("GOMP_parallel")
    blocktime = None
    if _kind(omp, OPENMP) == "intel":
        blocktime = int(ctypes.CDLL(None).kmp_get_blocktime())  # the value libiomp5 parsed, per thread
    return {
        "openmp_library": Path(omp).name if omp else None,
        "malloc_library": Path(serving_library("malloc") or "").name or None,
        "kmp_blocktime": blocktime,
    }


def check_environment(params: Params, facts: Facts) -> list[str]:
    """This family's libraries that do not serve this process (read from the process, not the variables)."""
    import torch  # noqa: F401 - torch's libgomp must be loaded to see who serves GOMP_parallel

    problems = []
    for key, choices, symbol in (("openmp", OPENMP, "GOMP_parallel"), ("allocator", ALLOCATORS, "malloc")):
        want = params.get(key)
        if not isinstance(want, str) or want not in choices:
            continue  # a recipe from before this family
        serving = serving_library(symbol)
        have = _kind(serving, choices) or ("default" if key == "allocator" else None)
        if serving is None or have == served_as(want):
            continue
        if served_as(want) in ("gnu", "default"):
            problems.append(f"{key}={want}, but {Path(serving).name} serves {symbol}: remove it from LD_PRELOAD")
            continue
        path = _path(facts, want)
        how = f"preload it: LD_PRELOAD={path}" if path else f"it is not installed here ({_INSTALL[want]})"
        mapped = "mapped but not preloaded" if _mapped(_LIBRARY[want]) else "not mapped in this process"
        problems.append(f"{key}={want}, but {Path(serving).name} serves {symbol} ({_LIBRARY[want]} is {mapped}); {how}")
    if params.get("allocator") == "jemalloc" and os.environ.get("MALLOC_CONF") == JEMALLOC_CONF_BEFORE:
        # loading that file again, the general advice, would not help
        problems.append("MALLOC_CONF is what an earlier autotune exported (jemalloc's purging on): export the env "
                        "file again (autotune export --format env)")
    return problems
