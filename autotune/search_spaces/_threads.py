"""Intra-op / inter-op threads, core affinity and memory binding.

Environment (set before torch starts): ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` = ``threads``;
the process's CPU affinity (``os.sched_setaffinity`` in the launcher) from ``affinity``; with pinned
CPUs, memory bound to their NUMA nodes (``memory_nodes``: the launcher starts ``numactl --membind``).
In-process: ``torch.set_num_threads`` / ``torch.set_num_interop_threads``.

``affinity``:
- ``none``: keep every CPU the process may use (PyTorch's default).
- ``compact``: one thread per physical core, filling a package (socket) first; extra threads take the
  cores' second hardware threads.
- ``spread``: one thread per physical core, round-robin over NUMA nodes (packages when NUMA is unknown).

On CUDA (``device`` cuda, one process) the pinned cores are those local to the GPU (CUDA device 0's
``Gpu.cpu_affinity``, its NUMA node) where the cpuset allows any, as each rank of ``processes`` takes
the cores local to its own GPU.

Memory binding is ``--membind`` (``run_cpu``'s ``-m``), not ``--preferred`` or ``--localalloc``: the
kernel's default is already local allocation, and what binding adds is that pages never spill to a
remote node under memory pressure; a trial that needs more than its nodes hold then fails as an OOM
(measured, so the search sees it) instead of running silently slower. With several nodes bound
(``spread``), MPOL_BIND still takes pages from the nearest node of the set first (set_mempolicy(2)).
"""
from __future__ import annotations

import functools
import logging
import os
import subprocess
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from ..errors import one_line
from ..probes import format_cpulist, memory_policy, parse_cpulist, process_cpus
from ._context import SpaceContext
from ._family import Params, SuggestingTrial
from ._rules import Rule, integer, one_of

if TYPE_CHECKING:
    from ..probes import Core, Facts

log = logging.getLogger(__name__)

AFFINITIES = ("none", "compact", "spread")
MOST = 4096  # the most threads a recipe may hold: more than one machine's CPUs (a recipe above this one's warns)
MOST_INTEROP = 4  # the most inter-op threads offered
KEYS = ("threads", "interop_threads", "affinity")
SCHEMA: dict[str, Rule] = {"threads": integer(1, MOST), "interop_threads": integer(1, MOST_INTEROP),
                           "affinity": one_of(AFFINITIES)}
# the thread variables before torch starts, the inter-op threads once a process, the affinity by the launcher
ENVIRONMENT_KEYS = KEYS
ENV_VARS: tuple[str, ...] = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # every variable environment() may set
OVERRIDES: tuple[str, ...] = ()

# Hooks this family has nothing to do at (search_spaces._family).


def _core_list(facts: Facts, params: Params | None = None) -> list[Core]:
    """The cores a pinned process takes its CPUs from: on CUDA (one process), those local to its GPU
    (CUDA device 0, ``Gpu.cpu_affinity``: its NUMA node) where the cpuset has any, as the ranks of
    ``processes`` take theirs; otherwise every allowed core."""
    cores = list(facts.cpu.allowed.core_list)
    local = gpu_local_cores(facts) if params is not None and params.get("device") == "cuda" else []
    return local or cores


def gpu_local_cores(facts: Facts) -> list[Core]:
    """The allowed cores whose CPUs are all local to CUDA device 0; [] when unknown or none is allowed."""
    affinity = facts.gpus[0].cpu_affinity if facts.gpus else None
    if not affinity:
        return []
    local = parse_cpulist(affinity)
    return [c for c in facts.cpu.allowed.core_list if set(c.cpus) <= local]


def max_threads(facts: Facts) -> int:
    return max(1, min(MOST, int(facts.cpu.allowed.threads or os.cpu_count() or 1)))


def physical_cores(facts: Facts) -> int:
    return max(1, int(facts.cpu.allowed.cores or 1))


def space(trial: SuggestingTrial, facts: Facts, ctx: SpaceContext) -> Params:
    if ctx.device == "cuda":
        return _gpu_space(trial, facts, ctx)
    threads = trial.suggest_int("threads", 1, max_threads(facts))
    interop = trial.suggest_int("interop_threads", 1, max(1, min(MOST_INTEROP, physical_cores(facts))))
    multi_node = len({c.numa_node for c in _core_list(facts)}) > 1 or facts.cpu.allowed.packages > 1
    choices = AFFINITIES if multi_node else ("none", "compact")
    affinity = trial.suggest_categorical("affinity", choices)
    return {"threads": threads, "interop_threads": interop, "affinity": affinity}


def _gpu_space(trial: SuggestingTrial, facts: Facts, ctx: SpaceContext) -> Params:
    """On CUDA the CPU feeds the GPU: threads are PyTorch's default or the cores local to the GPU (pinned
    there by ``compact``); inter-op threads stay at the default."""
    base = defaults(facts, ctx)
    options = tuple(dict.fromkeys((base["threads"], len(gpu_local_cores(facts)) or base["threads"])))
    threads = trial.suggest_categorical("threads", options) if len(options) > 1 else base["threads"]
    return {**base, "threads": threads, "affinity": trial.suggest_categorical("affinity", ("none", "compact"))}


def defaults(facts: Facts, ctx: SpaceContext) -> Params:
    """PyTorch's defaults: one intra-op thread per physical core, no pinning."""
    cores = physical_cores(facts)
    return {"threads": cores, "interop_threads": min(MOST_INTEROP, cores), "affinity": "none"}


def heuristic(facts: Facts, ctx: SpaceContext) -> Params:
    """What ``torch.backends.xeon.run_cpu`` does: one thread per physical core, compact pinning (on CUDA,
    the cores local to the GPU, inter-op threads at the default)."""
    cores = physical_cores(facts)
    if ctx.device == "cuda":
        return {**defaults(facts, ctx), "threads": len(gpu_local_cores(facts)) or cores, "affinity": "compact"}
    return {"threads": cores, "interop_threads": 1, "affinity": "compact"}


def interactions(facts: Facts, ctx: SpaceContext) -> list[Params]:
    """Thread settings that may pay only beside another knob's gain, tried with the search's best in-process recipe
    (``study.combinations.interaction_seeds``): one thread, and the defaults' threads with one inter-op thread: one
    thread can lose alone and win beside a faster precision, which leaves the other thread its share of the CPU."""
    if ctx.device == "cuda":
        return []
    base = defaults(facts, ctx)
    changes: list[Params] = [{"threads": 1, "interop_threads": 1}, {"interop_threads": 1}]
    return [c for c in changes if any(base[k] != v for k, v in c.items())]


def cpus_for(params: dict[str, Any], facts: Facts) -> list[int] | None:
    """The CPUs to pin the process to, or None to keep the inherited affinity."""
    affinity = params.get("affinity", "none")
    if affinity == "none":
        return None
    cores = _core_list(facts, params)
    if not cores:
        return None
    if affinity == "spread":
        by_node: dict[int, list[Core]] = defaultdict(list)
        for core in cores:
            by_node[core.numa_node if core.numa_node is not None else core.package].append(core)
        queues = list(by_node.values())
        cores = [q[i] for i in range(max(map(len, queues))) for q in queues if i < len(q)]
    threads = int(params.get("threads") or len(cores))
    # First PU of each core, then second PUs (SMT siblings) if more threads than cores are asked.
    order = [c.cpus[level] for level in range(max(len(c.cpus) for c in cores)) for c in cores if level < len(c.cpus)]
    return sorted(order[: max(1, threads)])


def memory_nodes(cpus: list[int] | None, facts: Facts) -> tuple[int, ...] | None:
    """The NUMA nodes of the pinned ``cpus`` that the cpuset lets us allocate on; None when not pinned or unknown.

    Given the whole process's CPUs (``search_spaces.cpus_for``: with DataLoader workers or several ranks,
    more than this family's compute CPUs), so every thread of the job has its local node in the set.
    """
    if cpus is None:
        return None
    wanted = set(cpus)
    nodes = {c.numa_node for c in _core_list(facts) if wanted.intersection(c.cpus)}
    if None in nodes:
        return None
    usable = tuple(sorted(n for n in nodes if n in facts.cpu.allowed.numa_nodes))
    return usable or None


@functools.lru_cache(maxsize=8)
def membind_refused(numactl: str, nodes: tuple[int, ...]) -> str | None:
    """Why ``numactl --membind=NODES`` cannot run here (once per process), or None when it can.

    Docker's default seccomp profile refuses set_mempolicy(2)/mbind(2) without CAP_SYS_NICE (EPERM).
    """
    try:
        done = subprocess.run([numactl, f"--membind={_nodelist(nodes)}", "true"], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if done.returncode == 0:
        return None
    return one_line(done.stderr)[:200] or f"exit status {done.returncode}"


def _nodelist(nodes: tuple[int, ...]) -> str:
    return ",".join(map(str, nodes))


def environment(params: Params, facts: Facts) -> dict[str, str]:
    threads = params.get("threads")
    if not threads:
        return {}
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


INTEGER = r"[1-9][0-9]{0,4}"  # the form of a thread count in a variable


def env_forms(params: Params) -> dict[str, str]:
    return dict.fromkeys(ENV_VARS, INTEGER) if params.get("threads") else {}


def apply_process(params: Params, facts: Facts | None) -> list[str]:
    """Set torch's thread pools; returns problems worth a warning (``processes`` then sets a rank's share)."""
    import torch

    problems: list[str] = []
    if params.get("threads"):
        torch.set_num_threads(int(params["threads"]))
    interop = params.get("interop_threads")
    if interop and torch.get_num_interop_threads() != int(interop):
        try:
            torch.set_num_interop_threads(int(interop))
        except RuntimeError:
            # torch allows this only before the first inter-op parallel work has started.
            problems.append(
                f"interop_threads={interop} not applied: call autotune.apply() before any torch work"
            )
    return problems


def check_environment(params: Params, facts: Facts) -> list[str]:
    """Environment-level settings of this family that are not in effect in this process."""
    problems = []
    want = cpus_for(params, facts)
    if want is not None and process_cpus() != want:
        problems.append(f"affinity={params['affinity']} wants CPUs {want}")
    return problems


def check_memory_binding(nodes: tuple[int, ...] | None, facts: Facts) -> list[str]:
    """Whether this process's memory is bound to ``nodes`` (``memory_nodes``) as the launcher would bind it."""
    numactl = getattr(facts.runtime, "numactl_path", None)
    if not nodes or not numactl or memory_policy() in (None, f"bind:{format_cpulist(nodes)}"):
        return []
    if membind_refused(numactl, nodes) is not None:
        return []  # not permitted here: the launcher warned already, and there is nothing to fix
    return [f"memory is not bound to NUMA node(s) {_nodelist(nodes)} (numactl --membind={_nodelist(nodes)})"]
