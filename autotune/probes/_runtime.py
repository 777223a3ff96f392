"""What the Python/torch runtime of this machine offers (live only: a recorded tree has no runtime).

Importing torch is the slow part (seconds); everything else here takes a few milliseconds. Nothing is
compiled or launched except ``ldconfig -p`` (the dynamic linker's cache, read once per probe). Without the import
(``import_torch=False``: what a launch plan and a fingerprint need), torch's version and build are read from its
installed ``version.py``, parsed and never run.
"""
from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from ._facts import Runtime

log = logging.getLogger(__name__)

IOMP5 = ("libiomp5.so",)
JEMALLOC = ("libjemalloc.so.2", "libjemalloc.so")
TCMALLOC = ("libtcmalloc.so.4", "libtcmalloc_minimal.so.4", "libtcmalloc.so")
_LDCONFIG = ("/sbin/ldconfig", "/usr/sbin/ldconfig")
_DIST_BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl")


def probe_runtime(import_torch: bool = True) -> Runtime:
    """The runtime facts; torch-related ones are None when torch cannot be imported. ``import_torch=False``: torch
    is imported only where it already is; else its version and build are read from its files (``_version_read``)
    and what only the import tells (its OpenMP runtime, oneDNN, its distributed backends) is unknown
    (``Runtime.imported`` False); imported after all where its files do not say."""
    read = None if import_torch or "torch" in sys.modules else _version_read()
    torch = None if read else _import_torch()
    version = read or _version_of(torch)
    maps = _loaded_libraries()
    search_dirs = _library_dirs()
    cache = _ldconfig_cache()
    ipex = _dist_version("intel_extension_for_pytorch")  # metadata only: importing IPEX is slow and may fail
    number, cuda, hip = version or (None, None, None)
    return Runtime(
        python=platform.python_version(),
        torch_version=number,
        torch_build=None if version is None else "rocm" if hip else "cuda" if cuda else "cpu",
        cuda_version=cuda or hip,
        openmp=_openmp(torch, maps),
        iomp5_path=find_library(IOMP5, search_dirs, cache),
        jemalloc_path=find_library(JEMALLOC, search_dirs, cache),
        tcmalloc_path=find_library(TCMALLOC, search_dirs, cache),
        numactl_path=shutil.which("numactl"),
        taskset_path=shutil.which("taskset"),
        onednn=_onednn(torch),
        distributed_backends=_distributed_backends(torch),
        compile_cpu_ok=cpp_compiler() is not None,
        ipex_version=ipex,
        ipex_compatible=ipex_compatible(ipex, number),
        glibc=platform.libc_ver()[0] == "glibc",
        imported=read is None,
    )


def _import_torch() -> ModuleType | None:
    try:
        import torch
    except ImportError as e:
        log.debug("torch cannot be imported: %s", e)
        return None
    return torch


Version = tuple[str, "str | None", "str | None"]  # torch's version, its CUDA version, its HIP version


def _version_of(torch: ModuleType | None) -> Version | None:
    if torch is None:
        return None
    return str(torch.__version__), torch.version.cuda, getattr(torch.version, "hip", None)


def _version_read() -> Version | None:
    """torch's version, CUDA and HIP from its ``version.py`` without importing torch: the file's top-level literal
    assignments, parsed (nothing of it runs). None where torch is not installed or the file holds no literal
    version and CUDA (a build that computes them, or binds them twice): the import then says."""
    try:
        spec = importlib.util.find_spec("torch")
        folder = next(iter(spec.submodule_search_locations or ()), None) if spec is not None else None
        if folder is None:
            return None
        tree = ast.parse((Path(folder) / "version.py").read_text())
    except (ImportError, ValueError, OSError, SyntaxError, UnicodeDecodeError, RecursionError, MemoryError):
        return None
    values: dict[str, object] = {}
    for node in tree.body:
        target: ast.expr
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name):
            try:
                values[target.id] = ast.literal_eval(value)
            except (ValueError, TypeError, RecursionError, MemoryError):
                values[target.id] = ValueError  # not a literal: this build computes it
    # a name bound anywhere else too (twice, in an ``if``, by an import) is not read: the import says
    stores = [n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names}
    names = ("__version__", "cuda", "hip")
    if any(stores.count(k) > 1 for k in names) or imported & set(names) or "cuda" not in values:
        return None
    number, cuda, hip = (values.get(k) for k in names)
    if not isinstance(number, str) or not all(v is None or isinstance(v, str) for v in (cuda, hip)):
        return None
    return number, cuda, hip  # type: ignore[return-value]


def _loaded_libraries() -> list[str]:
    """Paths of the shared libraries mapped into this process (``/proc/self/maps``)."""
    try:
        text = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    return list(dict.fromkeys(line.split()[-1] for line in text.splitlines() if ".so" in line))


def _openmp(torch: ModuleType | None, maps: list[str]) -> str | None:
    """Which OpenMP runtime torch's parallel regions run on: "gnu", "intel", "llvm" or None.

    torch's wheels link libgomp; an ``LD_PRELOAD``-ed libiomp5 comes first in symbol lookup and takes
    over its ``GOMP_*`` entry points, so a mapped libiomp5 that was preloaded (or is the only OpenMP
    mapped) wins. None when torch's ATen parallel backend is not OpenMP.
    """
    if torch is None or "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    names = [Path(p).name for p in maps]
    has = {kind: any(n.startswith(prefix) for n in names)
           for kind, prefix in (("intel", "libiomp5"), ("gnu", "libgomp"), ("llvm", "libomp."))}
    preloaded = "libiomp5" in os.environ.get("LD_PRELOAD", "")
    if has["intel"] and (preloaded or not has["gnu"]):
        return "intel"
    return next((kind for kind in ("gnu", "llvm", "intel") if has[kind]), None)


def _onednn(torch: ModuleType | None) -> str | None:
    if torch is None:
        return None
    match = re.search(r"(?:MKL-DNN|oneDNN)\s+v(\d+(?:\.\d+)*)", torch.__config__.show())
    return match.group(1) if match else None


def _distributed_backends(torch: ModuleType | None) -> tuple[str, ...]:
    if torch is None:
        return ()
    import torch.distributed as dist

    if not dist.is_available():
        return ()
    return tuple(b for b in _DIST_BACKENDS if getattr(dist, f"is_{b}_available", lambda: False)())


def cpp_compiler() -> str | None:
    """The C++ compiler torch.compile's CPU backend would call: ``$CXX``, else ``g++`` (``clang++`` on macOS).

    Mirrors ``torch._inductor.config.cpp.cxx``; found on PATH, not run (no compile at probe time).
    """
    name = os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "g++")
    return shutil.which(name)


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def ipex_compatible(ipex: str | None, torch_version: str | None) -> bool | None:
    """IPEX only loads on the torch release it was built for: same major.minor.

    >>> ipex_compatible("2.3.100", "2.3.1+cpu"), ipex_compatible("2.1.0", "2.3.0"), ipex_compatible(None, "2.3")
    (True, False, None)
    """
    if ipex is None or torch_version is None:
        return None
    return ipex.split(".")[:2] == torch_version.split("+")[0].split(".")[:2]


def _library_dirs() -> list[Path]:
    """Where pip/conda wheels and distributions put shared libraries, most specific first."""
    dirs = [Path(sys.prefix) / "lib"]
    if os.environ.get("CONDA_PREFIX"):
        dirs.append(Path(os.environ["CONDA_PREFIX"]) / "lib")
    multiarch = sysconfig.get_config_var("MULTIARCH")
    for base in ("/usr/local/lib", "/usr/lib", "/lib", "/usr/lib64", "/lib64"):
        if multiarch:
            dirs.append(Path(base) / multiarch)
        dirs.append(Path(base))
    return list(dict.fromkeys(dirs))


def _ldconfig_cache() -> dict[str, str]:
    """Library name -> path from the dynamic linker's cache (``ldconfig -p``); empty when unavailable."""
    exe = shutil.which("ldconfig") or next((p for p in _LDCONFIG if os.access(p, os.X_OK)), None)
    if exe is None:
        return {}
    try:
        out = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        log.debug("ldconfig -p failed: %s", e)
        return {}
    cache: dict[str, str] = {}
    for line in out.splitlines():
        name, arrow, path = line.strip().partition(" => ")
        if arrow:
            cache.setdefault(name.split(" (")[0], path.strip())
    return cache


def find_library(names: tuple[str, ...], dirs: list[Path], cache: dict[str, str]) -> str | None:
    """The first of ``names`` found in ``dirs`` (in order), else in the ldconfig cache."""
    for directory in dirs:
        for name in names:
            if (directory / name).is_file():
                return str(directory / name)
    return next((cache[n] for n in names if n in cache), None)


def preloadable(path: str) -> bool:
    """Whether ``path`` is a library where the probe looks for one (``_library_dirs``, or the linker cache's), a
    regular file there: an env file's ``LD_PRELOAD`` elsewhere (``/tmp/libjemalloc.so``) is not one to source. Both
    the folder the path names and the one it leads to must be such a folder: a link of one's own into a library
    folder (``/tmp/x/libjemalloc.so.2``, or a linked ``/tmp/x``) passes the check and can be pointed elsewhere after."""
    real, written = Path(os.path.realpath(path)), Path(os.path.abspath(path)).parent
    if not real.is_file():
        return False
    known = _folders(_library_dirs())
    if written in known and real.parent in known:
        return True
    known |= _folders(Path(p).parent for p in _ldconfig_cache().values())
    return written in known and real.parent in known


def _folders(dirs: Iterable[Path]) -> set[Path]:
    """``dirs`` as named and as they resolve (``/lib`` may link to ``/usr/lib``)."""
    return {p for d in dirs for p in (Path(d), Path(os.path.realpath(d)))}
