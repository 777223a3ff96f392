"""An arm's device memory on CUDA: its own peak, and whether another arm fits beside the ones there.

Two models on one GPU are paired as on a CPU (synchronised windows, ``autotune.measure.worker.arms``) only when
both fit: every arm's peak (its model, optimizer state and activations at their largest) must fit in the
device's memory together with one more model as large as the largest (the candidate is not built yet: a
batch size or dtype may change its size; when it is larger after all, its build runs out of memory and
that, too, reads "no room"). "Fit" keeps ``ROOM_FRACTION`` of the memory this process can use for the
allocator's fragmentation: what is free on the device plus what its own allocator holds (``room``: a MIG
device's slice at most), not the device's total, since other processes' contexts and memory, a search's
frozen worker's too, are not this process's to use. When they do not fit, the arm is not added: its state
is ``no-room`` and its error says to measure it by process pairs, which the search then does.

An arm's peak is ``torch.cuda.max_memory_allocated`` over its own activity (build, warm-up, windows),
reset when it becomes active, less what the other arms keep allocated meanwhile (they are idle, so that
is constant while it runs): what it would need alone.

    >>> no_room([30 * GIB], 80 * GIB, "cuda:0 (H100)") is None
    True
    >>> no_room([40 * GIB], 80 * GIB, "cuda:0 (H100)")
    'two models do not fit on cuda:0 (H100): 2 x 40.0 GiB peak > 90% of 80.0 GiB: measure by process pairs'
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

GIB = 1 << 30
ROOM_FRACTION = 0.9  # of the device's memory: the rest for fragmentation, the CUDA context, cuDNN workspaces


def no_room(peaks: Sequence[int], total_bytes: int | None, device: str, elsewhere: int = 0) -> str | None:
    """Why one more arm does not fit beside arms with these ``peaks`` in ``total_bytes`` this process can use
    (on ``device``, named in the message; ``elsewhere``: what contexts and other processes hold there), or
    None when it does (or nothing is known: no arms, no size)."""
    if not peaks or not total_bytes:
        return None
    need = sum(peaks) + max(peaks)
    if need <= ROOM_FRACTION * total_bytes:
        return None
    shown = f"{len(peaks) + 1} x {max(peaks) / GIB:.1f} GiB" if len(set(peaks)) == 1 else \
        " + ".join(f"{p / GIB:.1f}" for p in (*peaks, max(peaks))) + " GiB"
    held = f" ({elsewhere / GIB:.1f} GiB more held by CUDA contexts and other processes)" if elsewhere >= GIB else ""
    return (f"two models do not fit on {device}: {shown} peak > {ROOM_FRACTION:.0%} of {total_bytes / GIB:.1f} "
            f"GiB{held}: measure by process pairs")


def room(index: int, total_bytes: int | None) -> tuple[int, int]:
    """The memory of CUDA device ``index`` this process can use, and what is held outside its allocator: free
    memory (``torch.cuda.mem_get_info``) plus what this process's allocator reserves, at most ``total_bytes``
    (the probed size: a MIG device's slice) where known."""
    import torch

    free, device_total = torch.cuda.mem_get_info(index)
    total = min(total_bytes or device_total, device_total)
    usable = min(total, free + torch.cuda.memory_reserved(index))
    return usable, total - usable


def out_of_room(device: str, others: int, error: str) -> str:
    """The reason for an arm whose build ran out of memory beside other arms (it may fit alone)."""
    return (f"two models do not fit on {device}: out of memory beside {others / GIB:.1f} GiB of the other arms "
            f"({error}): measure by process pairs")


def device_of(facts: Any, index: int) -> tuple[str, int | None]:
    """``("cuda:I (NAME)", memory in bytes)`` of CUDA device ``index``: from the probed facts (a MIG device
    with its slice's memory), else from torch; the memory None when neither knows it."""
    gpu = next((g for g in getattr(facts, "gpus", ()) if g.index == index), None)
    if gpu is not None:
        return f"cuda:{index} ({gpu.name}{', MIG ' + gpu.uuid if gpu.is_mig_device else ''})", gpu.memory_bytes
    try:
        import torch

        props = torch.cuda.get_device_properties(index)
        return f"cuda:{index} ({props.name})", int(props.total_memory)
    except Exception:  # noqa: BLE001 - no CUDA: nothing known, nothing refused
        return f"cuda:{index}", None


def warm_libraries() -> None:
    """Make the process's cuBLAS and cuBLASLt workspaces before an arm's footprint starts: they are made at
    the first matmul of each thread (the backward runs in autograd's own thread: another workspace) and kept
    for the process, so otherwise the first arm is charged what every arm shares."""
    import torch

    if not torch.cuda.is_available():
        return  # a test's pretend GPU
    for dtype in (torch.float32, torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16):
        x = torch.ones(64, 64, device="cuda", dtype=dtype, requires_grad=True)
        torch.nn.functional.linear(torch.mm(x, x), x, x[0]).sum().backward()  # cuBLAS, cuBLASLt's fused bias
    torch.cuda.synchronize()


class Footprint:
    """One arm's peak device memory, kept across its active spells (see the module docstring). ``enter``
    when the arm becomes active, ``leave`` when it goes idle; no-ops off CUDA."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.peak: int | None = None
        self.resident = 0  # what the arm keeps allocated while idle (its weights, optimizer state, caches)
        self.others = 0  # what the other arms keep allocated while this one runs

    def enter(self) -> None:
        if not self.cuda:
            return
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self.others = max(0, torch.cuda.memory_allocated() - self.resident)

    def leave(self) -> None:
        if not self.cuda:
            return
        import torch

        torch.cuda.synchronize()
        self.peak = max(self.peak or 0, torch.cuda.max_memory_allocated() - self.others)
        self.resident = max(0, torch.cuda.memory_allocated() - self.others)
