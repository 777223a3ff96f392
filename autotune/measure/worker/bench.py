"""The arms of one worker process (``Bench``) and pairs of their windows (``pairs``): what the worker's commands
act on."""
from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Sequence
from typing import Any

from ... import search_spaces as spaces
from ..environment import EnvironmentMismatch, environment_differences
from ..protocol import PairRecord, WindowRecord, WorkerSpec
from .arms import Arm, ArmFailed
from .footprint import device_of, no_room, out_of_room, room, warm_libraries


def fresh_compiler() -> None:
    """The compiler as in a fresh process, before a compiled arm is built or after one is dropped: dynamo's code
    caches and CUDA-graph trees (``torch._dynamo.reset``), inductor's in-memory caches, and a new directory for
    its and Triton's on-disk caches. Without it a later arm reused an earlier one's compiled code (its compile
    read about 0 s), a second batch size recompiled for dynamic shapes, and a dropped arm's CUDA graphs kept
    their memory. Shapes stay static: a process of one model never sees another batch size."""
    import tempfile

    import torch._dynamo
    from torch._inductor.utils import clear_caches

    directory = tempfile.mkdtemp(prefix="compile-")  # in the worker's own TMPDIR, removed with it
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(directory, "inductor")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(directory, "triton")
    torch._dynamo.reset()
    clear_caches()
    torch._dynamo.config.automatic_dynamic_shapes = False


def preload_lazy_modules() -> None:
    """Import now what torch imports lazily on an arm's first build: ``torch.optim.Optimizer.__init__`` runs
    under ``torch._disable_dynamo``, which imports ``torch._dynamo`` on its first call (most of a small
    model's first build and warm-up). In the worker's start it runs before ``Ready``, while the other
    worker of a process pair imports side by side, instead of in each arm's turn alone; every process that
    trains with an optimizer pays it once either way, the user's too."""
    with contextlib.suppress(ImportError):
        import torch._dynamo  # noqa: F401


class Bench:
    """The arms of one worker process: its workload, its environment's params, its held-out split."""

    def __init__(self, spec: WorkerSpec) -> None:
        from ...apply import apply
        from ...probes import Facts
        from ...workloads import held_out_sets, load_workload

        self.spec = spec
        self.facts = Facts.from_dict(spec.facts)
        if spaces.processes.count(spec.params) > 1:
            raise EnvironmentMismatch("a paired worker trains in one process: processes must be 1")
        apply(spec.params, facts=self.facts, check_hardware=False)  # threads, pinning: before any torch work
        preload_lazy_modules()
        self.workload = load_workload(spec.workload)
        self.train, self.held_out = self.workload.dataset(), None
        self.wide_held_out: Any = None
        if self.workload.evaluate is None:
            self.train, self.held_out, self.wide_held_out = held_out_sets(self.train, spec.eval_samples)
        self.arms: dict[str, Arm] = {}
        self.settled = False  # whether an arm has settled the process (``Arm._settle``)

    def add(self, name: str, params: dict[str, Any], seed: int | None = None, wide: bool = False,
            give_up: float | None = None, against: str | None = None, reference_s: float | None = None) -> Arm:
        """Build and warm up an arm (``protocol.AddArm``); a failed warm-up leaves a failed arm (``ArmFailed``
        raised). ``give_up``: its warm-up ends once its steps take more than that many times the time per
        sample (``hopeless.Judge``) of the arm ``against`` (the one it is paired with: its recent windows, before
        any its warm-up), else ``reference_s`` seconds per sample."""
        differences = environment_differences(self.spec.params, params)
        if differences:
            raise EnvironmentMismatch("environment-level knobs differ from this worker's: " + ", ".join(differences))
        if name in self.arms:
            raise KeyError(f"arm {name!r} exists: drop it first")
        reference = self.arms.get(against) if against is not None else None
        per_sample = (reference.recent_s_per_sample() if reference is not None else None) or reference_s
        arm = Arm(name, params, self, seed, wide, (give_up, per_sample) if give_up and per_sample else None)
        self.arms[name] = arm
        others = [a for a in self.arms.values() if a is not arm and a.state == "ok"]
        device = self._device() if arm.memory.cuda and others else None
        if arm.memory.cuda and not others:
            warm_libraries()
        if device is not None:
            reason = no_room([a.memory.peak or 0 for a in others], device[1], device[0], device[2])
            if reason is not None:
                arm.state, arm.error = "no-room", reason
                raise ArmFailed(name, "no-room", reason)
        if arm.compiled:
            fresh_compiler()
        try:
            arm.warm_up()
        except ArmFailed as e:
            if device is None or e.state != "oom":
                raise
            arm.state = "no-room"  # it ran out beside the others: alone it may fit
            arm.error = out_of_room(device[0], arm.memory.others, e.error)
            raise ArmFailed(name, "no-room", arm.error) from e
        finally:
            if arm.compiled:
                self._recompile_others(arm)
        return arm

    def _recompile_others(self, arm: Arm) -> None:
        """The other compiled arms compile again (their code was cleared with the caches); one that fails now
        is failed as it would have in its window."""
        for other in self.arms.values():
            if other is not arm and other.compiled and other.state == "ok":
                with contextlib.suppress(ArmFailed):
                    other.recompile()

    def _device(self) -> tuple[str, int | None, int]:
        """The device's name, the memory this process can use there, and what others hold (``memory.room``)."""
        import torch

        index = torch.cuda.current_device()
        label, total = device_of(self.facts, index)
        return (label, *room(index, total))

    def get(self, name: str) -> Arm:
        if name not in self.arms:
            raise KeyError(f"no arm {name!r} (arms: {', '.join(self.arms) or 'none'})")
        return self.arms[name]

    def others(self, *names: str) -> list[Arm]:
        return [arm for arm in self.arms.values() if arm.name not in names]

    def windows(self, name: str, n: int, window_s: float) -> list[WindowRecord]:
        arm = self.get(name)
        return [arm.window(window_s, self.others(name)) for _ in range(n)]

    def drop(self, name: str) -> None:
        arm = self.arms.pop(name)
        arm.close()
        if arm.compiled:  # its compiled code and CUDA-graph memory pool go with it
            fresh_compiler()
            self._recompile_others(arm)

    def close(self) -> None:
        while self.arms:  # the process ends: nothing to compile again
            self.arms.popitem()[1].close()


def pairs(base: Arm, cand: Arm, n: int, window_s: float, rng: random.Random,
          others: Sequence[Arm] = ()) -> list[PairRecord]:
    """``n`` pairs, each the two arms' windows back to back in an order drawn from ``rng``. Stops at the
    first failure of an arm (its ``state`` says why): the pairs before it are returned."""
    records: list[PairRecord] = []
    for _ in range(n):
        order = [base, cand] if rng.random() < 0.5 else [cand, base]
        try:
            runs = {arm.name: arm.window(window_s, [a for a in (base, cand, *others) if a is not arm])
                    for arm in order}
        except ArmFailed:
            break
        records.append(PairRecord(order[0].name, runs[base.name], runs[cand.name]))
    return records
