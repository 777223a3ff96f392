"""``processes``: data-parallel training in P processes (DDP), each on its own cores (or its own GPU).

With P > 1 the command runs under ``python -m torch.distributed.run --standalone --nproc-per-node P``
(``autotune.trial.launch.plan``). In every rank ``apply_process`` (called by ``autotune.apply()``) pins the
whole process to the rank's CPUs, sets its share of the threads and initialises the process group
(gloo on CPU, nccl on GPU, one GPU per rank: ``LOCAL_RANK``); ``Tuned.prepare_model`` wraps the model
in ``DistributedDataParallel`` and ``Tuned.sampler`` shards the data.

How trials stay comparable (the numbers mean the same at every P):

- ``batch_per_rank`` (the batch family) is what each rank loads (``Tuned.batch_size``); DDP averages the
  gradients, so a step is the step one process would take on ``batch_per_rank * P`` samples, and the
  learning-rate rule and ``--global-batch`` accumulation apply to that global batch. (A format-1 recipe's
  ``batch_size`` is the global batch: each rank loads ``batch_size // P``, and that is what is counted.)
- ``threads`` is the total of intra-op threads of the job: each rank runs ``threads // P`` (at least 1).
- a trial trains the same number of samples counted over all ranks; throughput is global samples/s.

Cores. The allowed cores in hwloc's order (package, NUMA node, core) are cut into P contiguous,
disjoint slices, so a slice stays inside a package or NUMA node where it can. On GPUs a rank's slice
is cut from the cores local to its GPU (``Gpu.cpu_affinity``), shared with the ranks whose GPUs hang
off the same CPUs. ``affinity=none`` gives a rank every hardware thread of its slice; ``compact`` and
``spread`` its first ``threads // P`` (one per core, then SMT siblings).

Offered on CPU when at least 2 physical cores are allowed and gloo is available (P = 1, 2, 4, 8 up to
the cores); on GPUs when at least 2 GPUs are probed and nccl is available (P = 1 or one per GPU).

Environment (set before Python starts; replaces the ``threads`` family's values, which is why this
family declares them in ``OVERRIDES``):

| variable | value | why |
| --- | --- | --- |
| ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS`` | ``threads // P`` | each rank's share; torchrun would set 1 when unset |
| ``AUTOTUNE_RANK_CPUS`` | ``"0-3;4-7"`` | local rank i's CPUs (kernel list syntax), read in the rank |
| ``NCCL_P2P_LEVEL`` | ``NVL`` | GPU only, when every pair of the ranks' GPUs is NVLinked (below) |

NCCL: by default NCCL picks the P2P cut-off itself ("If this isn't specified, NCCL will attempt to
optimally select a value", https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html,
NCCL_P2P_LEVEL), and it already uses NVLink where it sees it. ``NVL`` ("Use P2P when GPUs are connected
through NVLink") is set only where the probe saw NVLink between every pair (e.g. HGX H100, NV18 through
NVSwitch): there it changes nothing NCCL would choose, and it keeps the path the recipe measured -- no
silent fall-back to PCIe P2P where NVLink is hidden from NCCL (VMs). Anywhere else (PCIe cards such as
RTX 4090: NODE/SYS, no P2P) nothing is set: NCCL's own detection is the documented default, and
forcing a level there only risks the PCIe P2P paths NCCL avoided.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..probes import format_cpulist, parse_cpulist
from ._context import SpaceContext
from ._family import Params, SuggestingTrial
from ._rules import Rule, integer
from ._threads import INTEGER  # each rank's share of the threads family's variables

if TYPE_CHECKING:
    from ..probes import Core, Facts, Gpu

KEYS = ("processes",)
ENV_VARS: tuple[str, ...] = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "AUTOTUNE_RANK_CPUS", "NCCL_P2P_LEVEL")
OVERRIDES: tuple[str, ...] = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # the threads family's: each rank's share
RANK_CPUS = "AUTOTUNE_RANK_CPUS"
BACKENDS = {"cpu": "gloo", "cuda": "nccl"}
CPU_COUNTS = (1, 2, 4, 8)
MOST = 64  # the most processes a recipe may hold: one per GPU of the largest single node, with room
SCHEMA: dict[str, Rule] = {"processes": integer(1, MOST)}
ENVIRONMENT_KEYS = KEYS  # the launcher starts the ranks: one value per process tree
MEMORY_KEYS = KEYS  # the batch spread over the ranks


def count(params: dict[str, Any]) -> int:
    """The recipe's number of processes (1 when the knob is absent)."""
    return max(1, int(params.get("processes") or 1))


def _backends(facts: Facts) -> tuple[str, ...]:
    return tuple(facts.runtime.distributed_backends) if facts.runtime is not None else ()


def choices(facts: Facts, ctx: SpaceContext) -> tuple[int, ...]:
    """The process counts worth measuring on this hardware (``(1,)``: the knob is not offered)."""
    if ctx.device == "cuda":
        gpus = len(facts.gpus)
        return (1, gpus) if gpus >= 2 and "nccl" in _backends(facts) else (1,)
    cores = int(facts.cpu.allowed.cores or 1)
    if cores < 2 or "gloo" not in _backends(facts):
        return (1,)
    return tuple(p for p in CPU_COUNTS if p <= cores)


def space(trial: SuggestingTrial, facts: Facts, ctx: SpaceContext) -> Params:
    offered = choices(facts, ctx)
    if len(offered) == 1:
        return {"processes": 1}
    return {"processes": trial.suggest_categorical("processes", offered)}


def defaults(facts: Facts, ctx: SpaceContext) -> Params:
    """PyTorch's default: one process."""
    return {"processes": 1}


heuristic = defaults  # run_cpu starts one process (its --ninstances run separate jobs)

# Hooks this family has nothing to do at (search_spaces._family).


def promising(facts: Facts, ctx: SpaceContext) -> list[Params]:
    """On several GPUs, one process per GPU is the change most likely to pay (it adds devices)."""
    offered = choices(facts, ctx)
    return [{"processes": offered[-1]}] if ctx.device == "cuda" and len(offered) > 1 else []


def threads_per_rank(params: dict[str, Any], facts: Facts) -> int:
    """Each rank's share of the recipe's total ``threads`` (at least 1)."""
    total = int(params.get("threads") or facts.cpu.allowed.cores or 1)
    return max(1, total // count(params))


def _slices(cores: list[Core], parts: int) -> list[list[Core]]:
    """``cores`` cut into ``parts`` contiguous slices whose sizes differ by at most one."""
    size, extra = divmod(len(cores), parts)
    out: list[list[Core]] = []
    start = 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(cores[start:end])
        start = end
    return out


def _rank_cores(params: dict[str, Any], facts: Facts) -> list[list[Core]]:
    """Local rank -> its cores; on GPUs the cores local to the rank's GPU where the probe knows them."""
    cores = list(facts.cpu.allowed.core_list)
    processes = count(params)
    gpus = list(facts.gpus[:processes])
    if params.get("device") == "cuda" and len(gpus) == processes and all(g.cpu_affinity for g in gpus):
        groups: dict[str, list[int]] = {}
        for rank, gpu in enumerate(gpus):
            groups.setdefault(gpu.cpu_affinity or "", []).append(rank)  # never "": all have one
        out: list[list[Core]] = [[] for _ in gpus]
        for affinity, ranks in groups.items():
            local = parse_cpulist(affinity)
            near = [c for c in cores if set(c.cpus) <= local]
            if len(near) < len(ranks):
                return _slices(cores, processes)  # the GPU's CPUs are outside our cpuset: plain slices
            for rank, part in zip(ranks, _slices(near, len(ranks)), strict=True):
                out[rank] = part
        return out
    return _slices(cores, processes)


def rank_cpus(params: dict[str, Any], facts: Facts) -> list[list[int]]:
    """Local rank -> the CPUs it pins itself to: disjoint, one slice of cores each."""
    share = threads_per_rank(params, facts)
    out: list[list[int]] = []
    for slice_ in _rank_cores(params, facts):
        if not slice_:
            out.append([])
            continue
        # first hardware thread of every core, then the SMT siblings (as the threads family's compact)
        order = [c.cpus[level] for level in range(max(len(c.cpus) for c in slice_)) for c in slice_
                 if level < len(c.cpus)]
        out.append(sorted(order if params.get("affinity", "none") == "none" else order[:share]))
    return out


def cpus_for(params: dict[str, Any], facts: Facts) -> list[int] | None:
    """The launcher's CPU set: the union of the ranks' (each rank narrows it to its own)."""
    cpus = sorted({cpu for part in rank_cpus(params, facts) for cpu in part})
    return cpus or None


def _all_nvlinked(gpus: list[Gpu]) -> bool:
    pairs = [(a, b) for a in gpus for b in gpus if a.index != b.index]
    return bool(pairs) and all(a.links.get(str(b.index), "").startswith("NV") for a, b in pairs)


def environment(params: Params, facts: Facts) -> dict[str, str]:
    processes = count(params)
    if processes <= 1:
        return {}
    share = str(threads_per_rank(params, facts))
    env = {
        "OMP_NUM_THREADS": share,
        "MKL_NUM_THREADS": share,
        RANK_CPUS: ";".join(format_cpulist(part) for part in rank_cpus(params, facts)),
    }
    if params.get("device") == "cuda" and _all_nvlinked(list(facts.gpus[:processes])):
        env["NCCL_P2P_LEVEL"] = "NVL"
    return env


_CPULIST = r"[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*"  # the kernel's list syntax (``format_cpulist``)


def env_forms(params: Params) -> dict[str, str]:
    if count(params) <= 1:
        return {}
    forms = {"OMP_NUM_THREADS": INTEGER, "MKL_NUM_THREADS": INTEGER, RANK_CPUS: f"{_CPULIST}(?:;{_CPULIST})*"}
    return {**forms, "NCCL_P2P_LEVEL": "NVL"} if params.get("device") == "cuda" else forms


def launched_ranks() -> tuple[int, int] | None:
    """``(local_rank, world_size)`` when this process was started by torch.distributed.run, else None."""
    if "LOCAL_RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    return int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])


def _pin(cpus: list[int]) -> None:
    """Pin every thread of this process: ``sched_setaffinity(0)`` sets only the calling thread, and
    threads started before (torch's, the user's) would keep the launcher's wider set."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
            pass


def pin_rank(params: dict[str, Any]) -> list[str]:
    """In a rank: pin the whole process to the rank's CPUs (``AUTOTUNE_RANK_CPUS``). Called first by
    ``search_spaces.apply_process``, before any family touches torch's thread pools: an OpenMP runtime
    reads the process's CPUs when it starts (libiomp5 binds its threads to them with KMP_AFFINITY)."""
    processes = count(params)
    ranks = launched_ranks()
    if processes <= 1:
        return []
    if ranks is None:
        return [
            f"processes={processes} not applied: this process was not started by torch.distributed.run, "
            "it trains alone. Start it with 'autotune run --recipe FILE -- python SCRIPT ARGS'"
        ]
    slices = [parse_cpulist(part) for part in os.environ.get(RANK_CPUS, "").split(";") if part]
    if ranks[0] < len(slices) and slices[ranks[0]]:
        _pin(sorted(slices[ranks[0]]))
    return []  # a missing AUTOTUNE_RANK_CPUS is reported by check_environment


def apply_process(params: Params, facts: Facts | None) -> list[str]:
    """In a rank (after ``pin_rank``, and after the threads family's: ``OVERRIDES``): its share of the
    threads, its GPU, the process group."""
    processes, ranks = count(params), launched_ranks()
    if processes <= 1 or ranks is None:
        return []
    import torch
    import torch.distributed as dist

    if params.get("threads"):
        share = int(params["threads"]) // processes
    else:
        share = int(os.environ.get("OMP_NUM_THREADS") or 0)
    if share:
        torch.set_num_threads(max(1, share))
    device = params.get("device", "cpu")
    if device == "cuda":
        torch.cuda.set_device(ranks[0])
    if not dist.is_initialized():
        dist.init_process_group(backend=BACKENDS.get(device, "gloo"))
    if dist.get_world_size() != processes:
        return [f"processes={processes}, but torch.distributed.run started {dist.get_world_size()} processes"]
    return []


def check_environment(params: Params, facts: Facts) -> list[str]:
    """In a rank: is it pinned to its own CPUs? (Replaces the threads family's process-wide check.)"""
    ranks = launched_ranks()
    if count(params) <= 1 or ranks is None:
        return []
    want = rank_cpus(params, facts)[ranks[0]] if ranks[0] < count(params) else None
    if want and sorted(os.sched_getaffinity(0)) != want:
        return [f"processes={count(params)}: local rank {ranks[0]} wants CPUs {format_cpulist(want)}"]
    return []
