"""The hopeless-arm rule: an arm far slower than the defaults in its first steps stops there, measured slower, and is
never trained to the quality guard's samples (``Arm._warm_up`` judges its steps; the live measurer's warm-up limit
stops a step that does not end)."""
from __future__ import annotations

# An arm whose first normal step takes this many times the defaults' time per sample is far slower than any
# noise (in one process 1-2%; one step on a busy 2-vCPU VM, up to 2-3x): it stops there, measured slower, never
# trained to the quality guard's samples. fp16 autocast on a CPU with AVX512-FP16 ran a CNN at 0.01-0.04x and
# took 60-131 s of a 2-minute search. (At 4, batch 16 of a sleep-bound fixture, 4x slower per sample by design,
# was stopped on some runs and raced on others.)
HOPELESS = 8.0
# An eager arm's first step also builds its kernels (oneDNN primitives, allocations): judged at this many times
# ``HOPELESS``, so a 100x arm stops after one step. A compiled arm's first steps hold its compilation: not judged;
# nor the steps of an arm with DataLoader workers until they have taken the batches the workers prefetch at their
# start (num_workers x prefetch_factor): its steps share the CPUs with that burst (on ``tiny``, 0.3 ms a step: its
# first step 73-158x the defaults', its second 10-16x, its windows 7.5x; on the CNN with two workers on 2 vCPUs, its
# third step 33x, where its windows read 1.18x).
FIRST_STEP_HOPELESS = 4.0


def judged_step(index: int, charged: int, compiled: bool, workers: int, prefetch: int | None) -> bool:
    """Whether warm-up step ``index`` (from 0) is judged by the hopeless rule: the first ``charged`` steps may
    hold compile work (judged at ``FIRST_STEP_HOPELESS`` when eager, not at all when compiled); with DataLoader
    workers, none of the steps that take the batches they prefetch at their start (``workers`` x ``prefetch``)."""
    if workers > 0:
        return index >= charged + workers * (prefetch or 2)
    return index >= charged or not compiled
