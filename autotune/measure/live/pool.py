"""The live measurer's worker processes: the defaults' worker, which lives as long as the search, and at most one
worker of another environment, kept while consecutive candidates use it. The one not in use is frozen, so its
threads take nothing from the one that runs."""
from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

from ...trial.runner import ended
from ...trial.spec import Status
from ..environment import DEFAULTS, environment_keys
from ..protocol import ArmStatus
from .paired_worker import PairedWorker, WorkerError

PhaseHook = Callable[[str, str], None]  # (phase name, detail): "starting", "compiling", "paired windows", ...


class WorkerPool:
    """The defaults' worker (``worker``) and another environment's (``env``: its environment key and worker)."""

    def __init__(self, workload: str, defaults: dict[str, Any], facts: Any, settings: Any,
                 on_phase: PhaseHook) -> None:
        self.workload, self.defaults, self.facts, self.settings = workload, defaults, facts, settings
        self.on_phase = on_phase
        self.worker: PairedWorker | None = None
        self.env: tuple[str, PairedWorker] | None = None
        self.start_s = 0.0  # the last worker start measured: what another environment's worker will take
        self.startup_s = 0.0  # the defaults' worker start, not yet charged to a trial

    def defaults_worker(self, timeout_s: float, *, with_arm: bool) -> PairedWorker:
        """The defaults' worker; started (again, after a failure) when needed, with its defaults arm when
        ``with_arm`` (a restart: the calibration adds the arm itself the first time)."""
        if self.worker is not None and self.worker.proc is not None and self.worker.proc.poll() is None:
            return self.worker
        self.on_phase("starting", "the defaults' worker")
        started = time.monotonic()
        self.worker = PairedWorker(self.workload, self.defaults, self.facts, self.settings)
        self.worker.start(timeout_s)
        self.start_s = time.monotonic() - started
        if with_arm:
            self.add(self.worker, DEFAULTS, self.defaults, timeout_s)
        self.startup_s += time.monotonic() - started
        return self.worker

    def env_worker(self, key: str, env_defaults: dict[str, Any], label: str,
                   deadline: float) -> tuple[PairedWorker, float, float]:
        """The worker of environment ``key`` with its defaults arm, kept from the previous candidate or new (``label``
        names its differences), and the seconds its start and its arm's warm-up took (0 for a kept one)."""
        if self.env_alive(key):
            assert self.env is not None
            return self.use(self.env[1]), 0.0, 0.0
        self.close_env()
        self.on_phase("starting", "a worker of " + label)
        started = time.monotonic()
        worker = PairedWorker(self.workload, env_defaults, self.facts, self.settings)
        self.env = (key, worker)
        self.use(worker)
        worker.start(max(1.0, deadline - time.monotonic()))
        startup_s, started = time.monotonic() - started, time.monotonic()
        self.add(worker, DEFAULTS, env_defaults, deadline - time.monotonic())
        return worker, startup_s, time.monotonic() - started

    def env_alive(self, key: str) -> bool:
        """Whether the worker of environment ``key`` runs (kept from a candidate, or its last process pair's)."""
        return self.env is not None and self.env[0] == key and self.env[1].proc is not None \
            and self.env[1].proc.poll() is None

    def keep(self, key: str, worker: PairedWorker) -> None:
        """A process pair's side of environment ``key``, kept as that environment's worker."""
        self.close_env()
        self.env = (key, worker)

    def all(self) -> list[PairedWorker]:
        return [w for w in (self.worker, self.env[1] if self.env else None) if w is not None]

    def use(self, worker: PairedWorker) -> PairedWorker:
        """``worker`` runs; the other one (if any) is set aside, so its threads take nothing from it."""
        for other in self.all():
            if other is not worker:
                self.set_aside(other)
        worker.thaw()
        return worker

    def set_aside(self, worker: PairedWorker) -> None:
        """Frozen; on CUDA its allocator's unused cache returned to the device first: a frozen process keeps
        its memory, beside which another process's larger batch ran out of memory and read as the batch's."""
        if worker.frozen is None and self.defaults.get("device") == "cuda" and worker.proc is not None \
                and worker.proc.poll() is None:
            worker.empty_cache()
        worker.freeze()

    def set_all_aside(self) -> None:
        """Every worker frozen: what runs next (process pairs, fresh trial processes) is timed alone."""
        for worker in self.all():
            self.set_aside(worker)

    def lose(self, worker: PairedWorker) -> None:
        """A worker that died or did not answer: ended, and no longer anyone's."""
        worker.close(timeout_s=1.0)
        if self.env is not None and self.env[1] is worker:
            self.env = None

    def drop_arm(self, worker: PairedWorker | None, arm: str) -> None:
        """``arm`` leaves ``worker`` (none, or one that died meanwhile: nothing to do; one that fails to drop it is
        ended)."""
        if worker is None or arm not in worker.arms:
            return
        try:
            self.use(worker)
            worker.drop_arm(arm)
        except WorkerError:
            worker.close(timeout_s=1.0)

    @staticmethod
    def add(worker: PairedWorker, name: str, params: dict[str, Any], timeout_s: float) -> ArmStatus:
        status = worker.add_arm(name, params, max(1.0, timeout_s))
        if status.state != "ok":
            raise WorkerError(f"arm {name!r} failed ({status.state}): {status.error}")
        return status

    def losses(self, arms: list[tuple[dict[str, Any], int]], timeout_s: float, *,
               wide: bool = False) -> list[ArmStatus]:
        """Fresh arms in the defaults' worker, one per ``(params, training seed)``, each trained to the loss sample
        count, its loss taken (``wide``: over the wide held-out set too) and dropped: the quality guard's second
        look (``autotune.study.guard``). Environment-level knobs are the defaults' (the worker's)."""
        deadline = time.monotonic() + timeout_s
        environment = {k: self.defaults[k] for k in environment_keys() if k in self.defaults}
        worker = self.defaults_worker(timeout_s, with_arm=True)
        statuses = []
        try:
            for i, (params, seed) in enumerate(arms):
                name = f"loss-{i}-seed-{seed}"
                self.use(worker)
                status = worker.add_arm(name, {**params, **environment}, max(1.0, deadline - time.monotonic()),
                                        seed=seed, wide=wide)
                if status.state == "ok":
                    status = worker.evaluate(name, max(1.0, deadline - time.monotonic()))
                worker.drop_arm(name)
                statuses.append(status)
        except WorkerError:
            self.lose(worker)
            raise
        return statuses

    def close_env(self) -> None:
        if self.env is not None:
            _, worker, self.env = *self.env, None
            worker.close()

    def close(self) -> None:
        """End every worker (the defaults' and the other environment's)."""
        try:
            self.close_env()
        finally:
            if self.worker is not None:
                self.worker.close()
                self.worker = None


def lost(worker: PairedWorker | None, error: WorkerError, deadline: float) -> tuple[Status, str]:
    """A worker that died or did not answer, classified as a trial process's exit is: a timeout (stopped by us:
    ``PairedWorker`` stops the tree of a worker that does not answer), an out-of-memory kill, or a crash."""
    if time.monotonic() >= deadline - 1.0:
        return Status.TIMEOUT, str(error)
    code = worker.proc.poll() if worker is not None and worker.proc is not None else None
    if code == -signal.SIGKILL:  # as ``runner._classify``: only the kernel's OOM killer sends it unasked
        return Status.OOM, "the paired worker was killed by SIGKILL (the kernel's out-of-memory killer)"
    if code is not None and code != 0:
        return Status.CRASH, f"the paired worker {ended(code)}: {error}"
    return Status.CRASH, str(error)
