"""DataLoader settings: ``num_workers``, ``pin_memory``, ``persistent_workers``, ``prefetch_factor``.

In-process only: they become the DataLoader's keyword arguments (``Tuned.dataloader_kwargs``).
``pin_memory`` is offered only with a GPU (it pins host pages for faster host-to-device copies);
worker counts stop at the cores the compute threads leave free, plus one.

Workers get the cores compute threads do not use (no recipe key of their own: it follows from
``threads``/``affinity``). When the compute threads are pinned (``affinity`` other than ``none``) and
allowed CPUs are left over (``worker_cpus``), the launcher gives the process the union of both sets;
``autotune.apply()`` then pins every thread of the process to the compute CPUs (threads started later,
OpenMP's pool included, inherit the pinning of the thread that starts them: ``sched_setaffinity(0, …)``
pins the calling thread only on Linux), and the DataLoader's ``worker_init_fn`` pins each worker to the
worker CPUs. Every worker runs torch with one thread. Whole free cores are preferred; the SMT siblings
of compute cores are used only when no core is free.
"""
from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any

from . import _threads
from ._context import SpaceContext
from ._family import Params, SuggestingTrial
from ._rules import BOOLEAN, Rule, integer, one_of

if TYPE_CHECKING:
    from ..probes import Facts

KEYS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
MOST_WORKERS = 8  # the most DataLoader workers offered on any machine
PREFETCH = (2, 4)  # the prefetch factors offered (None: no workers)
SCHEMA: dict[str, Rule] = {"num_workers": integer(0, MOST_WORKERS), "pin_memory": BOOLEAN,
                           "persistent_workers": BOOLEAN, "prefetch_factor": one_of((None, *PREFETCH))}
ENV_VARS: tuple[str, ...] = ()
OVERRIDES: tuple[str, ...] = ()


def most_workers(facts: Facts) -> int:
    """The most DataLoader workers offered: the cores this process may use, at most 8."""
    return max(1, min(MOST_WORKERS, int(facts.cpu.allowed.cores or 1)))


def space(trial: SuggestingTrial, facts: Facts, ctx: SpaceContext) -> Params:
    workers = trial.suggest_int("num_workers", 0, most_workers(facts))
    pin = trial.suggest_categorical("pin_memory", (False, True)) if ctx.device == "cuda" else False
    if workers == 0:
        return {"num_workers": 0, "pin_memory": pin, "persistent_workers": False, "prefetch_factor": None}
    return {
        "num_workers": workers,
        "pin_memory": pin,
        "persistent_workers": True,
        "prefetch_factor": trial.suggest_categorical("prefetch_factor", PREFETCH),
    }


def defaults(facts: Facts, ctx: SpaceContext) -> Params:
    return {"num_workers": 0, "pin_memory": False, "persistent_workers": False, "prefetch_factor": None}


heuristic = defaults  # run_cpu starts no DataLoader


def input_bound(facts: Facts, ctx: SpaceContext) -> list[Params]:
    """Changes worth measuring first where a step waits for its data: DataLoader workers together with the
    compute threads they leave free (a worker and a thread on one core contend), then one worker beside the
    default threads. On 2 cores: one or two workers with one thread; on more, also half the cores' workers."""
    most, cores = most_workers(facts), _threads.physical_cores(facts)
    loader = {"pin_memory": ctx.device == "cuda", "persistent_workers": True, "prefetch_factor": 2}
    out: list[Params] = [{**loader, "num_workers": workers, "threads": max(1, cores - workers)}
                         for workers in sorted({1, min(2, most), max(1, most // 2)})]
    return [*out, {**loader, "num_workers": 1}]

# Hooks this family has nothing to do at (search_spaces._family): the
# workers' CPUs follow from the threads family's pinning (worker_cpus, pin_compute_threads).


def worker_cpus(params: dict[str, Any], facts: Facts) -> list[int] | None:
    """The allowed CPUs the compute threads are not pinned to, for DataLoader workers; None when there
    are no workers, the compute threads are not pinned, or no CPU is left."""
    if not int(params.get("num_workers") or 0):
        return None
    compute = _threads.cpus_for(params, facts)
    if compute is None:
        return None  # compute threads may run on any CPU: none is free
    used = set(compute)
    cores = list(facts.cpu.allowed.core_list)
    free_cores = [cpu for core in cores if not used & set(core.cpus) for cpu in core.cpus]
    free = free_cores or [cpu for core in cores for cpu in core.cpus if cpu not in used]
    return sorted(free) or None


def pin_compute_threads(params: dict[str, Any], facts: Facts) -> list[str]:
    """Pin every thread of this process to the compute CPUs when workers get CPUs of their own; returns
    problems worth a warning. Threads started later inherit the pinning."""
    workers = worker_cpus(params, facts)
    compute = _threads.cpus_for(params, facts)
    if not workers or not compute:
        return []
    problems = []
    launched = set(compute) | set(workers)
    if set(os.sched_getaffinity(0)) != launched:
        problems.append(
            f"CPU affinity: the process should start on CPUs {sorted(launched)} (compute {compute}, DataLoader "
            f"workers {workers}), it started on {sorted(os.sched_getaffinity(0))}; pinned now, after Python "
            "started: start it under 'autotune run --recipe FILE -- python ...'"
        )
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), compute)
        except OSError:  # the thread ended meanwhile
            pass
    return problems


def pin_worker(worker_id: int, cpus: tuple[int, ...] | None = None) -> None:
    """A DataLoader ``worker_init_fn``: one torch thread, on the workers' CPUs (module-level, so it pickles)."""
    import torch

    torch.set_num_threads(1)
    if cpus:
        os.sched_setaffinity(0, cpus)


def dataloader_kwargs(params: dict[str, Any], cpus: list[int] | None = None) -> dict[str, Any]:
    """The DataLoader's keyword arguments; ``cpus`` are the workers' CPUs (``worker_cpus``)."""
    workers = int(params.get("num_workers") or 0)
    kwargs: dict[str, Any] = {"num_workers": workers, "pin_memory": bool(params.get("pin_memory"))}
    if workers > 0:
        kwargs["persistent_workers"] = bool(params.get("persistent_workers"))
        kwargs["prefetch_factor"] = int(params.get("prefetch_factor") or 2)
        kwargs["worker_init_fn"] = functools.partial(pin_worker, cpus=tuple(cpus) if cpus else None)
    return kwargs
