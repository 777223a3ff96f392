"""The paired worker process: ``python -m autotune.measure.worker SPEC.json`` (its parent's side is
``autotune.measure.live.paired_worker.PairedWorker``).

A worker holds the arms of one environment configuration (threads, interop threads, affinity, OpenMP
runtime, allocator, one process) and lives as long as that configuration is in use, so comparing knobs
that apply inside a process pays no process start-up. It is started exactly as a trial is
(``launch.plan`` sets its environment and affinity before torch starts, ``launch.start`` ties it to the
parent's life), reads one command per line on stdin and writes one reply per command (``autotune.measure.protocol``)
on its original stdout; anything the workload prints goes to its log (stderr). It ends on ``Quit``, on the
end of its stdin (the parent is gone), or when the parent stops its whole process tree (timeout, Ctrl-C).

A worker that hosts in-process arms keeps its heap (``keep_heap``: glibc's mmap and trim thresholds fixed):
several models in one process made glibc return and fault in memory every step in some processes and not
others, a state that slowed one arm alone for seconds or a process's life. The two workers of a process pair
(``process_pair``) hold one model each, as the user's process does, and keep glibc's defaults: what an
allocator knob gains is measured there, against them. Once its pair is measured, a process pair's worker may
fix its heap (``fix_heap``) and go on hosting arms: its environment's worker, one start saved.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import sys
import traceback
from pathlib import Path

from ...search_spaces import preload
from ...trial.training import in_effect
from ..environment import EnvironmentMismatch
from ..protocol import (
    AddArm,
    ArmAdded,
    Bye,
    CacheEmptied,
    Command,
    DropArm,
    Dropped,
    EmptyCache,
    Evaluate,
    Evaluated,
    HeapKept,
    KeepHeap,
    PairsRun,
    Profile,
    Profiled,
    Quit,
    Ready,
    Refused,
    Reply,
    RunPairs,
    RunWindows,
    WindowsRun,
    WorkerSpec,
    decode,
    encode,
)
from .arms import ArmFailed
from .bench import Bench, pairs


def handle(bench: Bench, command: Command) -> Reply:
    """Carry out one command; a failing arm is reported in its status, a bad command as ``Refused``."""
    try:
        return _handle(bench, command)
    except (KeyError, EnvironmentMismatch) as e:
        return Refused(type(command).__name__, str(e).strip("'\""))


def _handle(bench: Bench, command: Command) -> Reply:
    if isinstance(command, AddArm):
        with contextlib.suppress(ArmFailed):
            bench.add(command.arm, command.params, command.seed, command.wide, command.give_up, command.against,
                      command.reference_s)
        return ArmAdded(bench.get(command.arm).status())
    if isinstance(command, RunPairs):
        base, cand = bench.get(command.base), bench.get(command.cand)
        records = pairs(base, cand, command.n, command.window_s, random.Random(command.seed),
                        bench.others(base.name, cand.name))
        return PairsRun(base.status(), cand.status(), tuple(records))
    if isinstance(command, RunWindows):
        arm, windows = bench.get(command.arm), []
        with contextlib.suppress(ArmFailed):
            for _ in range(command.n):
                windows.append(arm.window(command.window_s, bench.others(arm.name)))
        return WindowsRun(arm.status(), tuple(windows))
    if isinstance(command, Evaluate):
        arm = bench.get(command.arm)
        with contextlib.suppress(ArmFailed):
            arm.ensure_loss()
        return Evaluated(arm.status())
    if isinstance(command, Profile):
        arm = bench.get(command.arm)
        operators: tuple[tuple[str, float], ...] = ()
        with contextlib.suppress(ArmFailed):
            operators = arm.profile(command.seconds)
        return Profiled(arm.status(), operators)
    if isinstance(command, DropArm):
        bench.drop(command.arm)
        return Dropped(command.arm)
    if isinstance(command, KeepHeap):
        return HeapKept(preload.keep_heap())
    if isinstance(command, EmptyCache):
        return CacheEmptied(empty_cache())
    return Bye()


# glibc's malloc returns freed memory to the system (a freed block above the mmap threshold, a heap top above
# the trim threshold) and faults it in again on the next step. In a worker hosting several arms its dynamic
# thresholds can leave an arm in a slow, page-faulting state for seconds or its whole life, which skews the
# pairs' ratios; fixed thresholds (the allocator knob's ``glibc-kept``, ``preload.keep_heap``) keep every arm in
# the fast state.


def empty_cache() -> int:
    """Return the CUDA allocator's unused cached memory to the device; the bytes released (0 without CUDA)."""
    import torch

    if not torch.cuda.is_initialized():
        return 0
    before = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    return max(0, before - torch.cuda.memory_reserved())


def main(argv: list[str]) -> int:
    # Replies go to the original stdout; what torch or the workload prints goes to stderr (the log).
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def send(reply: Reply) -> None:
        replies.write(encode(reply) + "\n")
        replies.flush()

    spec = WorkerSpec(**json.loads(Path(argv[0]).read_text()))
    heap_kept = spec.keep_heap and preload.keep_heap()  # before torch allocates anything


    try:
        bench = Bench(spec)
    except Exception as e:  # noqa: BLE001 - the parent reads why, not a traceback
        send(Refused("start", f"{type(e).__name__}: {e}"))
        return 1
    try:
        send(Ready(os.getpid(), {**in_effect(), "heap_kept": heap_kept}))
        for line in sys.stdin:
            try:
                command = decode(line)
            except ValueError as e:
                send(Refused("?", str(e)))
                continue
            try:
                send(handle(bench, command))
            except Exception as e:  # noqa: BLE001 - a bug in a command: say so, keep the other arms
                traceback.print_exc()
                send(Refused(type(command).__name__, f"{type(e).__name__}: {e}"))
            if isinstance(command, Quit):
                break
    finally:
        bench.close()  # continues and ends every arm's DataLoader workers
    return 0

